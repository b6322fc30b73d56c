/* CUDA twin of reference/ops.h moe_group: a MoE layer's routed tokens grouped by expert,
 * on the device. With it the CUDA stage backend routes, groups and sums a MoE layer without a host
 * round trip, so a decode step with MoE layers can be one CUDA graph
 * (runtime/stage/backend_cuda_moe.c). Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MOE_GROUP_H
#define STRATA_KERNELS_MOE_GROUP_H

#include <stdint.h>

/* experts [n, top_k] (cuda_moe_route_rows' ids) grouped by expert for the held experts
 * [experts_lo, experts_hi): expert after expert in ascending index, inside one expert the
 * slots (i, t) in ascending row i then choice t (the reference's order):
 *   offsets [num_experts + 1]: expert e's rows are [offsets[e], offsets[e + 1]) (none for
 *     an expert outside the range); offsets[num_experts] = the held slots' count, total;
 *   rows [n * top_k]: rows[j] = the token row of grouped position j for j < total, 0 past
 *     it (so a gather over all n * top_k positions reads valid rows);
 *   slot_pos [n * top_k]: slot i * top_k + t's grouped position, or -1 when its expert is
 *     not held.
 * All device pointers. One block (counts, a serial prefix over the experts, then each
 * expert's positions), so the result is the same whatever the launch: integers only.
 * Asynchronous on `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos, const int *experts, int n,
                   int top_k, int num_experts, int experts_lo, int experts_hi, void *stream);

#endif
