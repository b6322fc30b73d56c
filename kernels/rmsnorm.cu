/* CUDA RMSNorm: one block per row; each thread sums the squares of a strided slice of the
 * row, a warp-shuffle + shared-memory reduction gives the row's mean square, then every
 * thread scales its slice. fp32 in and out. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/rmsnorm.h"
}

static const int kThreads = 256;

/* out [n, dim], x [n, dim], weight [dim]; gridDim.x = n, blockDim.x = kThreads. */
__global__ static void rmsnorm_kernel(float *out, const float *x, const float *weight, float eps,
                                      int dim) {
    __shared__ float partial[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *outr = out + (size_t)blockIdx.x * dim;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        sum += xr[i] * xr[i];
    sum = cuda_warp_sum(sum);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        sum = cuda_warp_sum(sum);
        /* 1/sqrtf as in the reference (rsqrtf is 2 ulp); once per row, so free. */
        if (lane == 0) partial[0] = 1.0f / sqrtf(sum / (float)dim + eps);
    }
    __syncthreads();
    const float scale = partial[0];
    /* Same operation order as the reference: weight * (x * scale). */
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        outr[i] = weight[i] * (xr[i] * scale);
}

extern "C" int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n,
                            int dim, void *stream) {
    if (n < 0 || dim <= 0 || (n > 0 && (!out || !x || !weight)))
        return strata_set_error(STRATA_EINVAL, "cuda_rmsnorm: bad arguments (n %d, dim %d)", n,
                                dim);
    if (n == 0) return STRATA_OK;
    rmsnorm_kernel<<<n, kThreads, 0, (cudaStream_t)stream>>>(out, x, weight, eps, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
