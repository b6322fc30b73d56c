/* CUDA twin of reference/ops.h matmul (naming convention: kernels/README.md).
 *   out[t, r] = dot(x[t, :], w[r, :])     fp32 accumulation, bf16 or f32 weights
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MATMUL_H
#define STRATA_KERNELS_MATMUL_H

#include <stdint.h>

struct ops_weight; /* reference/ops.h */

/* out [n, w->rows] = x [n, w->cols] @ w^T. `w` is a host struct whose `data` is a device
 * pointer (bf16 bit patterns or f32, [rows][cols]); out and x are device pointers and must
 * not alias. The reference's thread pool is replaced by `stream`.
 *
 * Numerics: every output element follows reference/ops.h's dot-product order exactly (two
 * 8-lane fp32 accumulators over 16-element blocks, the same lane-folding tree, the fma
 * tail in ascending k), computed by one half-warp whose lane l holds accumulator lane l.
 * With nvcc --fmad=false the result is bitwise the reference's, and an element never
 * depends on n or on the other rows of the call (no split-K, no atomics).
 * Asynchronous on `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n, void *stream);

/* Twin of reference/ops.h matmul_split: each dot product over K is `leaves` contiguous
 * leaves (leaf j covers columns [j K / leaves, (j + 1) K / leaves)), each in the dot order
 * above, combined by the balanced binary tree (pairs of neighbours first). leaves is a power
 * of two <= OPS_SPLIT_LEAVES (8); leaves == 1 is cuda_matmul. The reference model runs its
 * o_proj / down / expert down so (the row-parallel projections: TP ranks' partials are
 * subtrees of one tree), and so does the CUDA backend: bitwise the reference's order.
 * Same arguments, numerics and checks as cuda_matmul; STRATA_EINVAL for another leaves. */
int cuda_matmul_split(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                      void *stream);

/* Twin of reference/ops.h matmul_multi: outs[i] [n, ws[i]->rows] = x [n, K] @ ws[i]^T for
 * i < count (1 to OPS_MULTI_MAX, 4; every ws[i] of the first's K and dtype) in ONE launch, the
 * matrices' row blocks side by side in its grid: q / k / v (or gate / up) fill the GPU
 * together and pay one launch (a 1024-row k_proj alone left multiprocessors idle). outs and ws
 * are host arrays (of device pointers); no out may alias x. Each element exactly
 * cuda_matmul's: bitwise the reference. Asynchronous on `stream`; 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
int cuda_matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count,
                      const float *x, int n, void *stream);

/* Not a reference op: one launch of many matmuls whose row counts are device data (a MoE
 * layer's experts, each on its own tokens; kernels/moe_group.h). For group g < n_groups,
 * rows [offsets[g], offsets[g + 1]) of out [cap, w->rows] = those rows of x [cap, w->cols]
 * against W_g = {ptrs[g], w->dtype, w->rows, w->cols}, with `leaves` leaves as
 * cuda_matmul_split (1: cuda_matmul). `w` gives the groups' common shape and dtype (its
 * `data` is not read); ptrs [n_groups] (device pointers to the weights) and offsets
 * [n_groups + 1] (ascending, offsets[n_groups] <= cap) are device arrays; rows outside
 * every group are not written; n_groups <= 4096 (the offsets are staged in shared memory).
 * The launch covers `cap` rows whatever the offsets hold, so a CUDA graph can capture it
 * once per cap. Each element is computed exactly as cuda_matmul / _split computes it (the
 * same half-warp tile): bitwise the reference, batch-invariant.
 * Asynchronous on `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_matmul_grouped(float *out, const float *x, const struct ops_weight *w,
                        const void *const *ptrs, const int32_t *offsets, int n_groups, int cap,
                        int leaves, void *stream);

#endif
