/* CUDA twin of reference/ops.h rope_apply (naming convention: kernels/README.md), and the
 * batched form the stage backend uses. Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_ROPE_APPLY_H
#define STRATA_KERNELS_ROPE_APPLY_H

/* x [n_heads, head_dim] of one token rotated in place with rotate_half pairing (j with
 * j + head_dim/2): x'[j] = x[j] cos[j] - x[j+half] sin[j]; x'[j+half] = x[j+half] cos[j] +
 * x[j] sin[j]. cos_t/sin_t [half]. Device pointers; asynchronous on `stream`; 0 or
 * STRATA_EINVAL / STRATA_EDEVICE. The reference's expression, products rounded before the
 * sum (nvcc --fmad=false): bitwise equal to the reference. */
int cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim,
                    void *stream);

/* Not a reference op: cuda_rope_apply on n_rows tokens in one launch. Row t's heads start
 * at x + t*row_stride (floats) and use cos_t/sin_t + t*half. Same arithmetic per element. */
int cuda_rope_apply_rows(float *x, const float *cos_t, const float *sin_t, int n_rows,
                         int row_stride, int n_heads, int head_dim, void *stream);

#endif
