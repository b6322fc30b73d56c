/* CUDA twin of reference/ops.h add_rmsnorm (naming convention: kernels/README.md). Plain C
 * header: no CUDA types; the stream is a `void *` (a cudaStream_t, NULL for the default
 * stream). */
#ifndef STRATA_KERNELS_ADD_RMSNORM_H
#define STRATA_KERNELS_ADD_RMSNORM_H

/* h [n, dim] += y, then out [n, dim] = RMSNorm(h) * weight [dim]; device pointers, out
 * aliasing neither h nor y. Asynchronous on `stream`; 0, or STRATA_EINVAL / STRATA_EDEVICE
 * with the message in strata_last_error(). One launch with the bits of cuda_vec_add then
 * cuda_rmsnorm (against the reference: the add bitwise, the norm NMSE-close). */
int cuda_add_rmsnorm(float *out, float *h, const float *y, const float *weight, float eps, int n,
                     int dim, void *stream);

#endif
