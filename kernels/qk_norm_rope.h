/* CUDA twin of reference/ops.h qk_norm_rope (naming convention: kernels/README.md). Plain C
 * header: no CUDA types; the stream is a `void *` (a cudaStream_t, NULL for the default
 * stream). */
#ifndef STRATA_KERNELS_QK_NORM_ROPE_H
#define STRATA_KERNELS_QK_NORM_ROPE_H

/* In place, every head of q [rows, heads, head_dim] and of k [rows, kv_heads, head_dim]
 * RMSNorm'd by q_norm / k_norm [head_dim], then rotated by its row's cos_t / sin_t
 * [rows][head_dim / 2] with rotate_half pairing. Device pointers; asynchronous on `stream`;
 * 0, or STRATA_EINVAL / STRATA_EDEVICE with the message in strata_last_error(). One launch,
 * with the bits of cuda_rmsnorm on q and on k followed by cuda_rope_apply_rows on each (the
 * norm's sum is fp32: against the reference an NMSE far below 1e-7, not bit for bit). */
int cuda_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm, float eps,
                      const float *cos_t, const float *sin_t, int rows, int heads, int kv_heads,
                      int head_dim, void *stream);

#endif
