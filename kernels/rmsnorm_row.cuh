/* One row's RMSNorm by one block, the code cuda_rmsnorm runs per row and the fused kernels that
 * norm a row before doing more with it (qk_norm_rope.cu) share: the same block size for a
 * width (rmsnorm_threads) and the same sum, so a row gets the same bits from either. Each
 * thread sums the squares of a strided slice of the row (in fours where dim % 4 == 0:
 * 16-byte loads where the pointers allow, four 4-byte loads where not, the same sums), a
 * warp-shuffle + shared-memory reduction gives the mean square, then every thread scales its
 * slice. Device code only; included by .cu files after cuda_common.cuh. */
#ifndef STRATA_KERNELS_RMSNORM_ROW_CUH
#define STRATA_KERNELS_RMSNORM_ROW_CUH

#include <stdint.h>

static const int kRmsMaxThreads = 1024;

/* Threads of the block that norms a row of `dim` (a thread per 4 elements where dim % 4 == 0,
 * else per element; 32 to kRmsMaxThreads, a multiple of 32). */
static inline int rmsnorm_threads(int dim) {
    const int per_thread = dim % 4 == 0 ? 4 : 1, want = (dim + per_thread - 1) / per_thread;
    return want >= kRmsMaxThreads ? kRmsMaxThreads : (want + 31) / 32 * 32;
}

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

/* outr [dim] = RMSNorm(xr [dim]) * weight by the calling block (every thread must call it;
 * outr may equal xr). V4: dim % 4 == 0, summed and scaled in fours (ALIGNED: every pointer
 * 16-byte aligned, so with 16-byte loads). Ends with the block's writes done, not yet
 * visible to other threads (the caller syncs if it reads them). */
template <bool V4, bool ALIGNED>
__device__ static inline void rmsnorm_row(float *outr, const float *xr, const float *weight,
                                          float eps, int dim) {
    __shared__ float partial[32];
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

#endif
