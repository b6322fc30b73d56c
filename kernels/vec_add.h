/* CUDA twin of reference/ops.h vec_add (naming convention: kernels/README.md).
 *   x[i] += y[i]     (fp32; bitwise equal to the reference) */
#ifndef STRATA_KERNELS_VEC_ADD_H
#define STRATA_KERNELS_VEC_ADD_H

/* x [n] in place, y [n], device pointers. Asynchronous on `stream`; 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
int cuda_vec_add(float *x, const float *y, int n, void *stream);

#endif
