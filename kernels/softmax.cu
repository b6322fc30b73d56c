/* CUDA softmax of one vector: one block; max, then sum of exp (storing the exps), then
 * scale, each a strided loop followed by a warp-shuffle + shared-memory block reduction. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/softmax.h"
}

static const int kThreads = 1024;

/* Every thread gets the block-wide reduction of v; `shared` holds 32 floats. */
template <bool kMax> __device__ static float block_reduce(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = kMax ? cuda_warp_max(v) : cuda_warp_sum(v);
    __syncthreads(); /* shared may still be read by the previous reduction */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = (int)(blockDim.x >> 5);
    v = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
    return kMax ? cuda_warp_max(v) : cuda_warp_sum(v);
}

__global__ static void softmax_kernel(float *x, int n) {
    __shared__ float shared[32];
    float max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        max = fmaxf(max, x[i]);
    max = block_reduce<true>(max, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(x[i] - max);
        x[i] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared);
    const float inv = 1.0f / sum; /* as the reference: multiply by the reciprocal */
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        x[i] *= inv;
}

extern "C" int cuda_softmax(float *x, int n, void *stream) {
    if (n <= 0 || !x)
        return strata_set_error(STRATA_EINVAL, "cuda_softmax: bad arguments (n %d)", n);
    softmax_kernel<<<1, kThreads, 0, (cudaStream_t)stream>>>(x, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
