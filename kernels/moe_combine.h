/* The MoE block's weighted sum: cuda_moe_expert_sum twins reference/ops.h moe_expert_sum
 * (reference/forward.c forward_moe's last step); cuda_moe_combine is a weighted scatter
 * the stage backend uses for a TP rank's embedding rows. Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MOE_COMBINE_H
#define STRATA_KERNELS_MOE_COMBINE_H

#include <stdint.h>

/* For j < count: out[rows[j], :] += y[j, :] * weights[j] (the product rounded, then the
 * sum: bitwise the reference's). out [*, dim], y [count, dim], rows [count] (distinct, so
 * no two threads write one element), weights [count]: device pointers. The stage backend
 * scatters a TP rank's embedding rows with it (weight 1). Asynchronous on `stream`; 0 or
 * STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_moe_combine(float *out, const float *y, const int32_t *rows, const float *weights,
                     int count, int dim, void *stream);

/* out [n, dim] = the MoE block's weighting and sum, reference/ops.h moe_sum_rows over the
 * slots (i, t) = y[slot_pos[i*top_k + t], :] × weights[i*top_k + t] (one rounded product:
 * the reference's y *= w), held when experts[i*top_k + t] lies in [experts_lo, experts_hi)
 * (then slot_pos is its row of y; kernels/moe_group.h); zeros for a row holding none.
 * y: the grouped expert outputs [*, dim]; slot_pos, experts [n*top_k] (ints), weights
 * [n*top_k]: device pointers. Each element walks its row's tree with __fadd_rn in the
 * reference's order: bitwise moe_sum_rows (so a TP rank's partial is one node of that tree).
 * top_k <= OPS_MOE_MAX_TOP_K. Asynchronous on `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_moe_expert_sum(float *out, const float *y, const int32_t *slot_pos, const int *experts,
                        const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                        int dim, void *stream);

#endif
