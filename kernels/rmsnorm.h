/* CUDA twin of reference/ops.h rmsnorm (naming convention: kernels/README.md).
 *   out[t, i] = weight[i] * (x[t, i] * rsqrt(mean_i(x[t, :]^2) + eps))     (fp32)
 * Plain C header: no CUDA types; the stream is a `void *` (a cudaStream_t, NULL for the
 * default stream). */
#ifndef STRATA_KERNELS_RMSNORM_H
#define STRATA_KERNELS_RMSNORM_H

/* out [n, dim], x [n, dim], weight [dim], all device pointers; out may equal x.
 * Asynchronous on `stream`. Returns 0, or STRATA_EINVAL / STRATA_EDEVICE with the message
 * in strata_last_error(). The sum of squares is fp32 (the reference's is double): the two
 * agree to an NMSE far below 1e-7, not bit for bit. */
int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim,
                 void *stream);

#endif
