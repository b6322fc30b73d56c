/* CUDA matmul in the reference's fixed dot-product order (reference/ops.h): a block of 256
 * threads is 16 half-warps; half-warp j owns weight row blockIdx.x * 16 + j and up to kTok
 * tokens (blockIdx.y * kTok ...). Lane l of a half-warp accumulates the elements
 * k0 + l of every 16-element block: lanes 0..7 are the reference's a0[0..7], lanes 8..15
 * its a1[0..7]. Shuffles then fold exactly as the reference does (s = a0 + a1,
 * t[i] = s[i] + s[i + 4], (t0 + t2) + (t1 + t3)) and lane 0 runs the K % 16 tail. Tiling
 * over tokens only shares the weight loads; it never changes one element's arithmetic. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/matmul.h"
#include "reference/ops.h"
}

static const int kThreads = 256; /* 16 half-warps = 16 weight rows per block */
static const int kRowsPerBlock = kThreads / 16;
static const int kTok = 4; /* tokens per half-warp */

__device__ static inline float widen(uint16_t v) {
    return __uint_as_float((unsigned)v << 16);
}

__device__ static inline float widen(float v) {
    return v;
}

template <typename WT>
__global__ static void matmul_kernel(float *out, const float *x, const WT *w, int n, int rows,
                                     int cols) {
    const int lane = threadIdx.x & 15;
    const int r = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 4);
    const int t0 = blockIdx.y * kTok;
    const int nt = min(kTok, n - t0);
    /* Every lane takes part in the shuffles; rows past the end read the last row. */
    const WT *wr = w + (size_t)min(r, rows - 1) * (size_t)cols;
    const float *xt = x + (size_t)t0 * (size_t)cols;
    const int k16 = cols & ~15;
    float acc[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t)
        acc[t] = 0.0f;
    for (int k = lane; k < k16; k += 16) {
        const float wk = widen(wr[k]);
#pragma unroll
        for (int t = 0; t < kTok; ++t)
            if (t < nt) acc[t] = __fmaf_rn(wk, xt[(size_t)t * (size_t)cols + k], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
        float v = acc[t];
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 8, 16)); /* s[l] = a0[l] + a1[l] */
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, 16)); /* t[i] = s[i] + s[i+4] */
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 16)); /* t0 + t2, t1 + t3 */
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 16)); /* (t0+t2) + (t1+t3) */
        if (lane == 0 && r < rows && t < nt) {
            const float *xr = xt + (size_t)t * (size_t)cols;
            for (int k = k16; k < cols; ++k)
                v = __fmaf_rn(widen(wr[k]), xr[k], v);
            out[(size_t)(t0 + t) * (size_t)rows + (size_t)r] = v;
        }
    }
}

extern "C" int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n,
                           void *stream) {
    if (!w || n < 0 || w->rows <= 0 || w->cols <= 0 ||
        (w->dtype != OPS_BF16 && w->dtype != OPS_F32) ||
        (n > 0 && (!out || !x || !w->data || (const void *)out == (const void *)x)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_matmul: bad arguments (n %d, weight [%d, %d], dtype %d)", n,
                                w ? w->rows : 0, w ? w->cols : 0, w ? (int)w->dtype : -1);
    if (n == 0) return STRATA_OK;
    if ((n + kTok - 1) / kTok > 65535)
        return strata_set_error(STRATA_EINVAL, "cuda_matmul: %d rows in one call (at most %d)", n,
                                65535 * kTok);
    dim3 grid(cuda_blocks_for(w->rows, kRowsPerBlock), (unsigned)((n + kTok - 1) / kTok));
    cudaStream_t s = (cudaStream_t)stream;
    if (w->dtype == OPS_BF16)
        matmul_kernel<uint16_t><<<grid, kThreads, 0, s>>>(out, x, (const uint16_t *)w->data, n,
                                                          w->rows, w->cols);
    else
        matmul_kernel<float><<<grid, kThreads, 0, s>>>(out, x, (const float *)w->data, n, w->rows,
                                                       w->cols);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
