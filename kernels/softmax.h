/* CUDA twin of reference/ops.h softmax (naming convention: kernels/README.md).
 *   x = exp(x - max(x)) / sum(exp(x - max(x)))     in place, fp32 */
#ifndef STRATA_KERNELS_SOFTMAX_H
#define STRATA_KERNELS_SOFTMAX_H

/* x [n] in place, device pointer, n >= 1 (the reference reads x[0]). One block does the
 * whole vector: this is the one-vector op of the reference (a row of attention scores, a
 * router's logits), not a batched softmax. The sum is a tree in fp32 (the reference's is
 * sequential): NMSE-close, not bitwise. Asynchronous on `stream`; 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
int cuda_softmax(float *x, int n, void *stream);

#endif
