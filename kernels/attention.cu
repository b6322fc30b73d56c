/* CUDA causal GQA attention: one block per (query i, head h), 128 threads. Scores are
 * computed one key per thread (sequential dot over d), the max by a block reduction
 * (exact in any order), the exps in parallel; then the reference's split-invariant order
 * (reference/ops.h): per aligned block of OPS_ATTN_BLOCK positions the sum of exps (thread
 * 0) and of e_j v_j[d] (thread d), sequential in ascending j, the blocks combined by the
 * aligned binary tree, kept per thread as the reference's binary counter (tree_acc in
 * reference/ops.c). The scores of block b live in scratch row b. */
#include <math.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/attention.h"
#include "reference/ops.h"
}

static const int kThreads = 128;
static const int kTreeDepth = 32; /* 2^32 blocks */

/* One thread's binary counter over blocks: push a block's sum; equal-sized neighbours merge
 * (left + right); finish folds the rest right to left. reference/ops.c's tree_acc, scalar. */
struct TreeAcc {
    float v[kTreeDepth];
    int level[kTreeDepth];
    int top;
};

__device__ static inline void tree_push(TreeAcc &a, float x) {
    a.v[a.top] = x;
    a.level[a.top++] = 0;
    while (a.top >= 2 && a.level[a.top - 2] == a.level[a.top - 1]) {
        a.v[a.top - 2] = __fadd_rn(a.v[a.top - 2], a.v[a.top - 1]);
        a.level[a.top - 2]++;
        a.top--;
    }
}

__device__ static inline float tree_finish(TreeAcc &a) {
    for (int i = a.top - 1; i >= 1; --i)
        a.v[i - 1] = __fadd_rn(a.v[i - 1], a.v[i]);
    return a.v[0];
}

/* The aligned tree over the blocks of exps[0, ctx_len) (times values[j * d_len + d] when
 * values is not NULL), each block summed in ascending j from 0. */
__device__ static float block_tree(const float *exps, const float *values, int ctx_len,
                                   int d_len, int d) {
    TreeAcc a;
    a.top = 0;
    for (int b0 = 0; b0 < ctx_len; b0 += OPS_ATTN_BLOCK) {
        const int b1 = min(b0 + OPS_ATTN_BLOCK, ctx_len);
        float acc = 0.0f;
        for (int j = b0; j < b1; ++j)
            acc = __fadd_rn(acc, values ? __fmul_rn(exps[j], values[(size_t)j * (size_t)d_len + d])
                                        : exps[j]);
        tree_push(a, acc);
    }
    return tree_finish(a);
}

__global__ static void attention_kernel(float *out, const float *q, const float *k_cache,
                                        const float *v_cache, size_t kv_head_stride,
                                        float *scratch, int pos, int n, int nh, int group,
                                        int d_len, float scale) {
    __shared__ float shared[32];
    __shared__ float row_max, row_inv;
    const int i = blockIdx.x / nh, h = blockIdx.x % nh;
    const int ctx_len = pos + i + 1;
    float *scores = scratch + (size_t)blockIdx.x * (size_t)(pos + n);
    const float *qv = q + ((size_t)i * (size_t)nh + (size_t)h) * (size_t)d_len;
    const float *keys = k_cache + (size_t)(h / group) * kv_head_stride;
    const float *values = v_cache + (size_t)(h / group) * kv_head_stride;

    float local_max = -INFINITY;
    for (int j = threadIdx.x; j < ctx_len; j += blockDim.x) {
        const float *kj = keys + (size_t)j * (size_t)d_len;
        float dot = 0.0f;
        for (int d = 0; d < d_len; ++d)
            dot = __fadd_rn(dot, __fmul_rn(qv[d], kj[d]));
        const float s = __fmul_rn(dot, scale);
        scores[j] = s;
        local_max = fmaxf(local_max, s);
    }
    local_max = cuda_warp_max(local_max);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = local_max;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = shared[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            m = fmaxf(m, shared[w]);
        row_max = m;
    }
    __syncthreads();
    const float max = row_max;
    for (int j = threadIdx.x; j < ctx_len; j += blockDim.x)
        scores[j] = expf(__fsub_rn(scores[j], max));
    __syncthreads();
    if (threadIdx.x == 0) row_inv = __fdiv_rn(1.0f, block_tree(scores, NULL, ctx_len, d_len, 0));
    __syncthreads();
    const float inv = row_inv;
    float *o = out + ((size_t)i * (size_t)nh + (size_t)h) * (size_t)d_len;
    for (int d = threadIdx.x; d < d_len; d += blockDim.x)
        o[d] = __fmul_rn(block_tree(scores, values, ctx_len, d_len, d), inv);
}

extern "C" int cuda_attention(float *out, const float *q, const float *k_cache,
                              const float *v_cache, size_t kv_head_stride, float *scratch, int pos,
                              int n, int nh, int nkv, int head_dim, void *stream) {
    if (n < 0 || pos < 0 || nh <= 0 || nkv <= 0 || nh % nkv || head_dim <= 0 ||
        (n > 0 && (!out || !q || !k_cache || !v_cache || !scratch)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_attention: bad arguments (n %d, pos %d, nh %d, nkv %d, "
                                "head_dim %d)",
                                n, pos, nh, nkv, head_dim);
    if (n == 0) return STRATA_OK;
    if ((long long)n * nh > 2147483647LL)
        return strata_set_error(STRATA_EINVAL, "cuda_attention: %d x %d blocks", n, nh);
    /* As the reference: 1 / sqrtf(D), on the host so the bits are glibc's. */
    const float scale = 1.0f / sqrtf((float)head_dim);
    attention_kernel<<<(unsigned)(n * nh), kThreads, 0, (cudaStream_t)stream>>>(
        out, q, k_cache, v_cache, kv_head_stride, scratch, pos, n, nh, nh / nkv, head_dim, scale);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
