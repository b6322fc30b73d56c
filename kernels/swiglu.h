/* CUDA twin of reference/ops.h swiglu (naming convention: kernels/README.md).
 *   out[i] = silu(gate[i]) * up[i],  silu(z) = z / (1 + exp(-z))     (fp32) */
#ifndef STRATA_KERNELS_SWIGLU_H
#define STRATA_KERNELS_SWIGLU_H

/* out [n], gate [n], up [n], device pointers; out may equal gate. Asynchronous on
 * `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream);

#endif
