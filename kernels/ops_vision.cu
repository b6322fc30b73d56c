/* CUDA twins of reference/ops_vision.h: LayerNorm one block per row (double tree sums),
 * the elementwise ops one thread per element, each the reference's fp32 sequence of
 * correctly rounded operations (nvcc --fmad=false, explicit __f*_rn where it matters). */
#include <math.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/ops_vision.h"
}

static const int kThreads = 256;

/* Block-wide double sum; every thread gets it. shared holds kThreads / 32 doubles. */
__device__ static double block_sum_double(double v, double *shared) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* shared may still be read by the previous reduction */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? shared[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__global__ static void layernorm_kernel(float *out, const float *x, const float *weight,
                                        const float *bias, float eps, int dim) {
    __shared__ double shared[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)dim;
    float *o = out + (size_t)blockIdx.x * (size_t)dim;
    double sum = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        sum += (double)xr[i];
    const double mean = block_sum_double(sum, shared) / (double)dim;
    double sq = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const double d = (double)xr[i] - mean;
        sq += d * d;
    }
    sq = block_sum_double(sq, shared); /* its barriers end every read of x above */
    const float mean_f = (float)mean;
    const float rstd = (float)(1.0 / sqrt(sq / (double)dim + (double)eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float centered = __fmul_rn(__fsub_rn(xr[i], mean_f), rstd);
        o[i] = __fadd_rn(__fmul_rn(centered, weight[i]), bias[i]);
    }
}

extern "C" int cuda_layernorm(float *out, const float *x, const float *weight, const float *bias,
                              float eps, int n, int dim, void *stream) {
    if (n < 0 || dim <= 0 || (n > 0 && (!out || !x || !weight || !bias)))
        return strata_set_error(STRATA_EINVAL, "cuda_layernorm: bad arguments (n %d, dim %d)", n,
                                dim);
    if (n == 0) return STRATA_OK;
    layernorm_kernel<<<(unsigned)n, kThreads, 0, (cudaStream_t)stream>>>(out, x, weight, bias, eps,
                                                                         dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

__global__ static void add_bias_kernel(float *x, const float *bias, long long total, int dim) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = __fadd_rn(x[i], bias[i % dim]);
}

extern "C" int cuda_add_bias(float *x, const float *bias, int n, int dim, void *stream) {
    if (n < 0 || dim <= 0 || (n > 0 && (!x || !bias)))
        return strata_set_error(STRATA_EINVAL, "cuda_add_bias: bad arguments (n %d, dim %d)", n,
                                dim);
    const long long total = (long long)n * dim;
    if (total == 0) return STRATA_OK;
    add_bias_kernel<<<(unsigned)((total + kThreads - 1) / kThreads), kThreads, 0,
                      (cudaStream_t)stream>>>(x, bias, total, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

__global__ static void gelu_tanh_kernel(float *out, const float *x, int n, float beta) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float z = x[i];
    const float cube = __fmul_rn(__fmul_rn(z, z), z);
    const float inner = __fmul_rn(beta, __fadd_rn(z, __fmul_rn(0.044715f, cube)));
    out[i] = __fmul_rn(__fmul_rn(0.5f, z), __fadd_rn(1.0f, tanhf(inner)));
}

__global__ static void gelu_erf_kernel(float *out, const float *x, int n, float inv_sqrt2) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float z = x[i];
    out[i] = __fmul_rn(__fmul_rn(0.5f, z), __fadd_rn(1.0f, erff(__fmul_rn(z, inv_sqrt2))));
}

extern "C" int cuda_gelu_tanh(float *out, const float *x, int n, void *stream) {
    if (n < 0 || (n > 0 && (!out || !x)))
        return strata_set_error(STRATA_EINVAL, "cuda_gelu_tanh: bad arguments (n %d)", n);
    if (n == 0) return STRATA_OK;
    /* The reference's constant, rounded on the host: (float)(sqrt(2) * (2 / sqrt(pi)) / 2). */
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5);
    gelu_tanh_kernel<<<cuda_blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(out, x, n,
                                                                                          beta);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_gelu_erf(float *out, const float *x, int n, void *stream) {
    if (n < 0 || (n > 0 && (!out || !x)))
        return strata_set_error(STRATA_EINVAL, "cuda_gelu_erf: bad arguments (n %d)", n);
    if (n == 0) return STRATA_OK;
    gelu_erf_kernel<<<cuda_blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(
        out, x, n, (float)M_SQRT1_2);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

/* Element i of the reference's linspace_f32(end, steps). */
__device__ static float linspace_at(float end, int steps, int i) {
    if (steps == 1) return 0.0f;
    const float step = __fdiv_rn(end, (float)(steps - 1));
    return i < steps / 2 ? __fmul_rn(step, (float)i)
                         : __fsub_rn(end, __fmul_rn(step, (float)(steps - 1 - i)));
}

__global__ static void linspace_kernel(float *out, float end, int steps) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < steps) out[i] = linspace_at(end, steps, i);
}

extern "C" int cuda_linspace_f32(float *out, float end, int steps, void *stream) {
    if (steps < 1 || !out)
        return strata_set_error(STRATA_EINVAL, "cuda_linspace_f32: bad arguments (steps %d)",
                                steps);
    linspace_kernel<<<cuda_blocks_for(steps, kThreads), kThreads, 0, (cudaStream_t)stream>>>(
        out, end, steps);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

/* Element (row, i) of the table; rows of every frame are the first frame's (the reference
 * copies them). Row order within a frame: (bh, bw, ih, iw) with merge windows. */
__global__ static void pos_embed_kernel(float *out, const float *table, int grid, int h, int w,
                                        int merge, int dim, long long total) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int i = (int)(idx % dim);
    const long long local = (idx / dim) % ((long long)h * w);
    const int iw = (int)(local % merge), ih = (int)(local / merge % merge);
    const int bw = (int)(local / ((long long)merge * merge) % (w / merge));
    const int bh = (int)(local / ((long long)merge * merge * (w / merge)));
    const int r = bh * merge + ih, c = bw * merge + iw;
    const float hr = linspace_at((float)(grid - 1), h, r),
                wc = linspace_at((float)(grid - 1), w, c);
    const int h0 = (int)hr, w0 = (int)wc;
    const int h1 = h0 + 1 < grid ? h0 + 1 : grid - 1, w1 = w0 + 1 < grid ? w0 + 1 : grid - 1;
    const float dh = __fsub_rn(hr, (float)h0), dw = __fsub_rn(wc, (float)w0);
    const float one_dh = __fsub_rn(1.0f, dh), one_dw = __fsub_rn(1.0f, dw);
    const float w00 = __fmul_rn(one_dh, one_dw), w01 = __fmul_rn(one_dh, dw);
    const float w10 = __fmul_rn(dh, one_dw), w11 = __fmul_rn(dh, dw);
    const size_t g = (size_t)grid, d = (size_t)dim;
    const float a = __fmul_rn(table[((size_t)h0 * g + (size_t)w0) * d + i], w00);
    const float b = __fmul_rn(table[((size_t)h0 * g + (size_t)w1) * d + i], w01);
    const float cc = __fmul_rn(table[((size_t)h1 * g + (size_t)w0) * d + i], w10);
    const float e = __fmul_rn(table[((size_t)h1 * g + (size_t)w1) * d + i], w11);
    out[idx] = __fadd_rn(__fadd_rn(__fadd_rn(a, b), cc), e);
}

extern "C" int cuda_vision_pos_embed(float *out, const float *table, int grid, int t, int h, int w,
                                     int merge, int dim, void *stream) {
    if (grid < 1 || t < 0 || h < 0 || w < 0 || merge < 1 || dim <= 0 || h % merge || w % merge ||
        (t > 0 && h > 0 && w > 0 && (!out || !table)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_vision_pos_embed: bad arguments (grid %d, t %d, h %d, w %d, "
                                "merge %d, dim %d)",
                                grid, t, h, w, merge, dim);
    const long long total = (long long)t * h * w * dim;
    if (total == 0) return STRATA_OK;
    pos_embed_kernel<<<(unsigned)((total + kThreads - 1) / kThreads), kThreads, 0,
                       (cudaStream_t)stream>>>(out, table, grid, h, w, merge, dim, total);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

__global__ static void vision_rope_kernel(float *cos_out, float *sin_out, const float *inv_freq,
                                          int row, int col, int quarter) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= quarter) return;
    const float fr = __fmul_rn((float)row, inv_freq[j]), fc = __fmul_rn((float)col, inv_freq[j]);
    cos_out[j] = cosf(fr);
    sin_out[j] = sinf(fr);
    cos_out[quarter + j] = cosf(fc);
    sin_out[quarter + j] = sinf(fc);
}

extern "C" int cuda_vision_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq,
                                        int row, int col, int quarter, void *stream) {
    if (quarter < 0 || (quarter > 0 && (!cos_out || !sin_out || !inv_freq)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_vision_rope_cos_sin: bad arguments (quarter %d)", quarter);
    if (quarter == 0) return STRATA_OK;
    vision_rope_kernel<<<cuda_blocks_for(quarter, kThreads), kThreads, 0, (cudaStream_t)stream>>>(
        cos_out, sin_out, inv_freq, row, col, quarter);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

/* ---------------------------------------------------------------- vision_attention */

/* The reference's dot-product order (reference/ops.h: two 8-lane accumulators over
 * 16-element blocks, s = a0 + a1, t[i] = s[i] + s[i+4], (t0 + t2) + (t1 + t3), the fma tail
 * in ascending k), in one thread: w[k * w_stride] against x[k], k < K. */
__device__ static float dot_ordered(const float *w, size_t w_stride, const float *x, int K) {
    float a[16];
#pragma unroll
    for (int l = 0; l < 16; ++l)
        a[l] = 0.0f;
    const int k16 = K & ~15;
    for (int k0 = 0; k0 < k16; k0 += 16)
#pragma unroll
        for (int l = 0; l < 16; ++l)
            a[l] = __fmaf_rn(w[(size_t)(k0 + l) * w_stride], x[k0 + l], a[l]);
    float s[8], t[4];
#pragma unroll
    for (int l = 0; l < 8; ++l)
        s[l] = __fadd_rn(a[l], a[l + 8]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        t[i] = __fadd_rn(s[i], s[i + 4]);
    float r = __fadd_rn(__fadd_rn(t[0], t[2]), __fadd_rn(t[1], t[3]));
    for (int k = k16; k < K; ++k)
        r = __fmaf_rn(w[(size_t)k * w_stride], x[k], r);
    return r;
}

static const int kAttnThreads = 128;
static const int kMaxHeadDim = 256;

/* One block per (query row r0 + blockIdx.x of the segment [start, start + len), head
 * blockIdx.y): the reference's attend_rows for that row: scores in matmul's dot order times
 * the scale, softmax (exact max, expf, the sum sequential in ascending j, times 1 / sum),
 * then each output element the matmul-ordered dot of the probabilities with v. */
__global__ static void vision_attention_kernel(float *out, const float *qkv, float *scores,
                                               int start, int len, int r0, int nh, int D,
                                               float scale) {
    __shared__ float qs[kMaxHeadDim];
    __shared__ float shared[32];
    __shared__ float row_inv;
    const int i = start + r0 + blockIdx.x, h = blockIdx.y;
    const size_t HD = (size_t)nh * (size_t)D, ld = 3 * HD;
    float *sc = scores + ((size_t)blockIdx.x * (size_t)nh + (size_t)h) * (size_t)len;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = qkv[(size_t)i * ld + (size_t)h * D + d];
    __syncthreads();
    const float *keys = qkv + (size_t)start * ld + HD + (size_t)h * D;
    float local_max = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float s = __fmul_rn(dot_ordered(keys + (size_t)j * ld, 1, qs, D), scale);
        sc[j] = s;
        local_max = fmaxf(local_max, s);
    }
    local_max = cuda_warp_max(local_max);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = local_max;
    __syncthreads();
    float max = shared[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
        max = fmaxf(max, shared[w]);
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        sc[j] = expf(__fsub_rn(sc[j], max));
    __syncthreads();
    if (threadIdx.x == 0) { /* the reference's sequential sum */
        float sum = 0.0f;
        for (int j = 0; j < len; ++j)
            sum = __fadd_rn(sum, sc[j]);
        row_inv = __fdiv_rn(1.0f, sum);
    }
    __syncthreads();
    const float inv = row_inv;
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        sc[j] = __fmul_rn(sc[j], inv);
    __syncthreads();
    const float *values = qkv + (size_t)start * ld + 2 * HD + (size_t)h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        out[(size_t)i * HD + (size_t)h * D + d] = dot_ordered(values + d, ld, sc, len);
}

extern "C" int cuda_vision_attention(float *out, const float *qkv, float *scratch,
                                     const int *cu_seqlens, int n_segments, int n, int nh,
                                     int head_dim, void *stream) {
    if (!cu_seqlens || n_segments < 1 || n < 0 || nh <= 0 || nh > 65535 || head_dim <= 0 ||
        head_dim > kMaxHeadDim || (n > 0 && (!out || !qkv || !scratch)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_vision_attention: bad arguments (n %d, segments %d, nh %d, "
                                "head_dim %d; head_dim at most %d)",
                                n, n_segments, nh, head_dim, kMaxHeadDim);
    int longest = 0;
    for (int s = 0; s < n_segments; ++s) {
        const int len = cu_seqlens[s + 1] - cu_seqlens[s];
        if (len < 0 || (s == 0 && cu_seqlens[0] != 0))
            return strata_set_error(STRATA_EINVAL,
                                    "cuda_vision_attention: cu_seqlens not ascending from 0 "
                                    "(segment %d)",
                                    s);
        if (len > longest) longest = len;
    }
    if (cu_seqlens[n_segments] != n)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_vision_attention: cu_seqlens ends at %d, not n = %d",
                                cu_seqlens[n_segments], n);
    const size_t cap = cuda_vision_attention_scratch(longest, nh);
    /* Python's head_dim ** -0.5, on the host as the reference computes it. */
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    cudaStream_t st = (cudaStream_t)stream;
    for (int s = 0; s < n_segments; ++s) {
        const int start = cu_seqlens[s], len = cu_seqlens[s + 1] - start;
        const size_t per_row = (size_t)nh * (size_t)len;
        if (!len) continue;
        size_t tile = cap / per_row; /* query rows whose scores fit the scratch (>= 1) */
        if (tile > (size_t)len) tile = (size_t)len;
        for (int r0 = 0; r0 < len; r0 += (int)tile) {
            const int rows = len - r0 < (int)tile ? len - r0 : (int)tile;
            vision_attention_kernel<<<dim3((unsigned)rows, (unsigned)nh), kAttnThreads, 0, st>>>(
                out, qkv, scratch, start, len, r0, nh, head_dim, scale);
            CUDA_CHECK_LAUNCH();
        }
    }
    return STRATA_OK;
}
