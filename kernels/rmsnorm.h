/* RMSNorm over rows, on the GPU and its CPU twin (shared spec qwen3-architecture.md §3):
 *   out[r, i] = x[r, i] * rsqrt(mean_i(x[r, :]^2) + eps) * w[i]      (fp32 throughout)
 * Plain C header: no CUDA types. A stream is passed as `void *` (a cudaStream_t, NULL for
 * the default stream). All GPU entry points return 0 or a negative STRATA_E* code with
 * the CUDA error text in strata_last_error(). */
#ifndef STRATA_KERNELS_RMSNORM_H
#define STRATA_KERNELS_RMSNORM_H

/* CPU twin: out [rows, dim], x [rows, dim], w [dim]. out may alias x. */
void rmsnorm_cpu(float *out, const float *x, const float *w, int rows, int dim, float eps);

/* Launches the kernel on device pointers: out [rows, dim], x [rows, dim], w [dim], all in
 * device memory; out may alias x. Asynchronous on `stream`. */
int rmsnorm_cuda_launch(float *out, const float *x, const float *w, int rows, int dim, float eps,
                        void *stream);

/* Convenience for tests and tools: host pointers in, host result out (copies both ways and
 * synchronises). */
int rmsnorm_cuda(float *out, const float *x, const float *w, int rows, int dim, float eps);

#endif
