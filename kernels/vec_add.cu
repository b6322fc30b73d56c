/* CUDA residual add: one thread per element. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/vec_add.h"
}

static const int kThreads = 256;

__global__ static void vec_add_kernel(float *x, const float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" int cuda_vec_add(float *x, const float *y, int n, void *stream) {
    if (n < 0 || (n > 0 && (!x || !y)))
        return strata_set_error(STRATA_EINVAL, "cuda_vec_add: bad arguments (n %d)", n);
    if (n == 0) return STRATA_OK;
    vec_add_kernel<<<cuda_blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(x, y, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
