/* CUDA RMSNorm: one block per row, sized to the row (a thread per 4 elements, 32 to 1024
 * threads); each thread sums the squares of a strided slice of the row (16-byte loads where
 * the row allows), a warp-shuffle + shared-memory reduction gives the row's mean square,
 * then every thread scales its slice. fp32 in and out. A row is one thread's few loads
 * apart, not 16 dependent ones: a decode step's one-row norms of the 8B shape (4096 wide)
 * took 14 us each on an H200 with 256 threads and 4-byte loads. The order of the sum
 * depends on the row's width only, never on the batch or where the row lies: a width of 4k
 * sums in fours whether the pointers allow 16-byte loads or only 4-byte ones. */
#include <stdint.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/rmsnorm.h"
}

static const int kMaxThreads = 1024;

__device__ static inline float square_sum(float4 v) {
    return __fadd_rn(
        __fadd_rn(__fadd_rn(__fmul_rn(v.x, v.x), __fmul_rn(v.y, v.y)), __fmul_rn(v.z, v.z)),
        __fmul_rn(v.w, v.w));
}

/* Same operation order as the reference per element: weight * (x * scale). */
__device__ static inline float4 scaled(float4 w, float4 x, float scale) {
    return make_float4(__fmul_rn(w.x, __fmul_rn(x.x, scale)), __fmul_rn(w.y, __fmul_rn(x.y, scale)),
                       __fmul_rn(w.z, __fmul_rn(x.z, scale)),
                       __fmul_rn(w.w, __fmul_rn(x.w, scale)));
}

/* Four floats at p + 4 i: one 16-byte load where p is 16-byte aligned, else four. */
template <bool ALIGNED> __device__ static inline float4 load4(const float *p, int i) {
    if (ALIGNED) return ((const float4 *)p)[i];
    return make_float4(p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
}

template <bool ALIGNED> __device__ static inline void store4(float *p, int i, float4 v) {
    if (ALIGNED) {
        ((float4 *)p)[i] = v;
    } else {
        p[4 * i] = v.x;
        p[4 * i + 1] = v.y;
        p[4 * i + 2] = v.z;
        p[4 * i + 3] = v.w;
    }
}

/* out [n, dim], x [n, dim], weight [dim]; gridDim.x = n. V4: dim % 4 == 0, a row is summed
 * and scaled in fours (ALIGNED: every pointer 16-byte aligned, so with 16-byte loads). */
template <bool V4, bool ALIGNED>
__global__ static void rmsnorm_kernel(float *out, const float *x, const float *weight, float eps,
                                      int dim) {
    __shared__ float partial[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *outr = out + (size_t)blockIdx.x * dim;
    float sum = 0.0f;
    if (V4)
        for (int i = threadIdx.x; i < dim / 4; i += blockDim.x)
            sum = __fadd_rn(sum, square_sum(load4<ALIGNED>(xr, i)));
    else
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            sum = __fadd_rn(sum, __fmul_rn(xr[i], xr[i]));
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
    if (V4)
        for (int i = threadIdx.x; i < dim / 4; i += blockDim.x)
            store4<ALIGNED>(outr, i,
                            scaled(load4<ALIGNED>(weight, i), load4<ALIGNED>(xr, i), scale));
    else
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            outr[i] = __fmul_rn(weight[i], __fmul_rn(xr[i], scale));
}

extern "C" int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n,
                            int dim, void *stream) {
    if (n < 0 || dim <= 0 || (n > 0 && (!out || !x || !weight)))
        return strata_set_error(STRATA_EINVAL, "cuda_rmsnorm: bad arguments (n %d, dim %d)", n,
                                dim);
    if (n == 0) return STRATA_OK;
    /* the path by the width alone (the bits follow it); the loads by where the rows lie */
    const bool v4 = dim % 4 == 0,
               aligned = (((uintptr_t)out | (uintptr_t)x | (uintptr_t)weight) & 15) == 0;
    const int per_thread = v4 ? 4 : 1, want = (dim + per_thread - 1) / per_thread;
    const int threads = want >= kMaxThreads ? kMaxThreads : (want + 31) / 32 * 32;
    cudaStream_t s = (cudaStream_t)stream;
    if (v4 && aligned)
        rmsnorm_kernel<true, true><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    else if (v4)
        rmsnorm_kernel<true, false><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    else
        rmsnorm_kernel<false, false><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
