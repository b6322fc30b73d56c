/* CUDA twins of the reference's KV-parallel attention steps (attention_kvp.h). One thread
 * block per (query, head); the order of every sum is the reference's (reference/ops_attention.c
 * attention_partial_max, attention_partial, attention_merge):
 *   - partial_max: threads take keys j in turn, each score the fused q·k chain in ascending d
 *     (attention.cu's scores_kernel code), then the block's max;
 *   - both read the rank's keys and values through its block table (struct ops_kv): key j is
 *     row j % OPS_ATTN_BLOCK of block j / OPS_ATTN_BLOCK, and a block of the sums is one
 *     block of the cache;
 *   - partial: the keys the query sees here are walked in chunks of kChunk positions whose
 *     e_j = expf(s_j - M) the block computes into shared memory; thread `col` (one per
 *     output column, col == D being l) sums each aligned block of OPS_ATTN_BLOCK positions
 *     in ascending j and pushes it into its binary counter (reference tree_acc), finished
 *     right to left at the end;
 *   - merge: thread `col` pushes the ranks' parts (flag 1) into its counter in rank order.
 * The cache stores the view's dtype; the two kernels reading it are compiled per dtype and
 * widen a 16-bit element exactly where they load it (cuda_kv_load), as the reference's
 * kv_rows widens a block: the same products and sums on the same values.
 * Simple rather than fast: a decode row's keys on one rank are one block's work (the
 * one-rank cuda_attention splits keys over blocks; a KVP rank holds 1/K of them). */
#include <stdint.h>
#include <math.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/attention_kvp.h"
#include "runtime/base/op_contract.h"
}

static const int kThreads = 128;
static const int kChunk = 256;

static_assert(kChunk % OPS_ATTN_BLOCK == 0, "a chunk holds whole blocks");

struct Args {
    float *out;         /* max [n*nh] or part [n*nh][D+2] */
    float *scores;      /* [n*nh][held] */
    const float *q, *m; /* q (step 1), the group's max (step 2) */
    const void *cache;  /* keys (step 1) or values (step 2): kv.k or kv.v, as kv.dtype */
    ops_kv kv;          /* device pointers; the struct itself is the kernel's parameter */
    int pos, nh, group, lo, held, d_len;
    float scale;
};

/* Keys [lo, pos + i] held here, as a count from local index 0. */
__device__ static inline int keys_seen(const Args &a, int i) {
    return min(a.pos + i + 1 - a.lo, a.held);
}

template <int DT> __global__ static void partial_max_kernel(Args a) {
    __shared__ float qs[OPS_ATTN_MAX_HEAD_DIM];
    __shared__ float shared[32];
    const int t = blockIdx.x, i = t / a.nh, h = t % a.nh, seen = keys_seen(a, i), D = a.d_len;
    if (seen <= 0) {
        if (threadIdx.x == 0) a.out[t] = -INFINITY;
        return;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = a.q[(size_t)t * (size_t)D + d];
    __syncthreads();
    const int g = h / a.group;
    float *scores = a.scores + (size_t)t * (size_t)a.held;
    float local_max = -INFINITY;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) {
        const size_t kj = cuda_kv_offset(a.kv, g, j, D);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d)
            dot = __fmaf_rn(qs[d], cuda_kv_load<DT>(a.cache, kj + (size_t)d), dot);
        const float s = __fmul_rn(dot, a.scale);
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
        a.out[t] = m;
    }
}

__global__ static void group_max_kernel(float *max, const float *all, int ranks, size_t n) {
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float m = max[t];
    for (int k = 0; k < ranks; ++k)
        if (all[(size_t)k * n + t] > m) m = all[(size_t)k * n + t];
    max[t] = m;
}

template <int DT> __global__ static void partial_kernel(Args a) {
    __shared__ float e[kChunk];
    const int t = blockIdx.x, i = t / a.nh, h = t % a.nh, seen = keys_seen(a, i), D = a.d_len;
    const int col = threadIdx.x;
    float *part = a.out + (size_t)t * (size_t)(D + 2);
    if (seen <= 0) {
        if (col < D + 2) part[col] = 0.0f;
        return;
    }
    const int g = h / a.group;
    const float *scores = a.scores + (size_t)t * (size_t)a.held, max = a.m[t];
    TreeAcc acc;
    acc.top = 0;
    for (int c0 = 0; c0 < seen; c0 += kChunk) {
        const int c1 = min(c0 + kChunk, seen);
        __syncthreads(); /* the previous chunk's e is read by everyone */
        for (int j = c0 + col; j < c1; j += blockDim.x)
            e[j - c0] = expf(__fsub_rn(scores[j], max));
        __syncthreads();
        if (col > D) continue;
        for (int b0 = c0; b0 < c1; b0 += OPS_ATTN_BLOCK) {
            const int b1 = min(b0 + OPS_ATTN_BLOCK, c1);
            /* Block b0 / 16 of the cache (b0 is block-aligned: kChunk is whole blocks). */
            const size_t vb = cuda_kv_offset(a.kv, g, b0, D) + (size_t)col;
            float s = 0.0f;
            for (int j = b0; j < b1; ++j)
                s = col == D ? __fadd_rn(s, e[j - c0])
                             : __fmaf_rn(e[j - c0],
                                         cuda_kv_load<DT>(a.cache, vb + (size_t)(j - b0) * D), s);
            tree_push(acc, s);
        }
    }
    if (col <= D) part[col] = tree_finish(acc);
    if (col == D + 1) part[col] = 1.0f;
}

__global__ static void merge_kernel(float *out, const float *parts, int ranks, size_t per_rank,
                                    int d_len) {
    __shared__ float o[OPS_ATTN_MAX_HEAD_DIM + 1];
    const int t = blockIdx.x, col = threadIdx.x, D = d_len;
    const size_t w = (size_t)D + 2;
    TreeAcc acc;
    acc.top = 0;
    if (col <= D) {
        for (int k = 0; k < ranks; ++k) {
            const float *p = parts + (size_t)k * per_rank + (size_t)t * w;
            if (p[D + 1] == 0.0f) continue; /* the query sees no key on rank k */
            tree_push(acc, p[col]);
        }
        o[col] = acc.top ? tree_finish(acc) : 0.0f;
    }
    __syncthreads();
    float *row = out + (size_t)t * (size_t)D;
    if (col >= D) return;
    if (acc.top == 0) { /* no key at all (not for a causal query: it sees itself) */
        row[col] = 0.0f;
        return;
    }
    row[col] = __fmul_rn(o[col], __fdiv_rn(1.0f, o[D]));
}

static int check(const char *fn, int n, int nh, int nkv, int head_dim) {
    if (n < 0 || nh <= 0 || nkv <= 0 || nh % nkv || head_dim <= 0 ||
        head_dim > OPS_ATTN_MAX_HEAD_DIM || (long long)n * nh > 2147483647LL)
        return strata_set_error(STRATA_EINVAL,
                                "%s: bad arguments (n %d, nh %d, nkv %d, head_dim %d; head_dim at "
                                "most %d)",
                                fn, n, nh, nkv, head_dim, OPS_ATTN_MAX_HEAD_DIM);
    return STRATA_OK;
}

static Args args_of(float *out, float *scores, const float *q, const float *m,
                    const struct ops_kv *kv, const void *cache, int pos, int lo, int held, int nh,
                    int nkv, int head_dim) {
    Args a;
    a.out = out;
    a.scores = scores;
    a.q = q;
    a.m = m;
    a.cache = cache;
    a.kv = *kv;
    a.pos = pos;
    a.nh = nh;
    a.group = nh / nkv;
    a.lo = lo;
    a.held = held;
    a.d_len = head_dim;
    a.scale = 1.0f / sqrtf((float)head_dim); /* on the host: glibc's bits, as the reference */
    return a;
}

/* Threads of a block with one thread per output column (D + 2 <= this). */
static unsigned column_threads(int head_dim) {
    return (unsigned)((head_dim + 2 + 31) / 32 * 32);
}

extern "C" int cuda_attention_partial_max(float *max, float *scores, const float *q,
                                          const struct ops_kv *kv, int pos, int n, int lo, int held,
                                          int nh, int nkv, int head_dim, void *stream) {
    int rc = check(__func__, n, nh, nkv, head_dim);
    if (rc || n == 0) return rc;
    if (held < 1 || !max || !scores || !q || !kv || !kv->k || !kv->blocks ||
        !cuda_kv_dtype_ok(kv->dtype))
        return strata_set_error(STRATA_EINVAL, "%s: %d keys held / NULL buffer / kv dtype %d",
                                __func__, held, kv ? (int)kv->dtype : -1);
    const Args a = args_of(max, scores, q, NULL, kv, kv->k, pos, lo, held, nh, nkv, head_dim);
    const unsigned blocks = (unsigned)(n * nh);
    cudaStream_t s = (cudaStream_t)stream;
    switch (kv->dtype) {
    case OPS_BF16: partial_max_kernel<OPS_BF16><<<blocks, kThreads, 0, s>>>(a); break;
    case OPS_F16: partial_max_kernel<OPS_F16><<<blocks, kThreads, 0, s>>>(a); break;
    default: partial_max_kernel<OPS_F32><<<blocks, kThreads, 0, s>>>(a); break;
    }
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_attention_group_max(float *max, const float *all, int ranks, size_t n,
                                        void *stream) {
    if (ranks < 1 || (n > 0 && (!max || !all)))
        return strata_set_error(STRATA_EINVAL, "%s: %d ranks", __func__, ranks);
    if (n == 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((n + kThreads - 1) / kThreads);
    group_max_kernel<<<blocks, kThreads, 0, (cudaStream_t)stream>>>(max, all, ranks, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_attention_partial(float *part, const float *scores, const float *m,
                                      const struct ops_kv *kv, int pos, int n, int lo, int held,
                                      int nh, int nkv, int head_dim, void *stream) {
    int rc = check(__func__, n, nh, nkv, head_dim);
    if (rc || n == 0) return rc;
    if (held < 1 || !part || !scores || !m || !kv || !kv->v || !kv->blocks ||
        !cuda_kv_dtype_ok(kv->dtype))
        return strata_set_error(STRATA_EINVAL, "%s: %d keys held / NULL buffer / kv dtype %d",
                                __func__, held, kv ? (int)kv->dtype : -1);
    const Args a =
        args_of(part, (float *)scores, NULL, m, kv, kv->v, pos, lo, held, nh, nkv, head_dim);
    const unsigned blocks = (unsigned)(n * nh), threads = column_threads(head_dim);
    cudaStream_t s = (cudaStream_t)stream;
    switch (kv->dtype) {
    case OPS_BF16: partial_kernel<OPS_BF16><<<blocks, threads, 0, s>>>(a); break;
    case OPS_F16: partial_kernel<OPS_F16><<<blocks, threads, 0, s>>>(a); break;
    default: partial_kernel<OPS_F32><<<blocks, threads, 0, s>>>(a); break;
    }
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_attention_merge(float *out, const float *parts, int ranks, int n, int nh,
                                    int head_dim, void *stream) {
    int rc = check(__func__, n, nh, 1, head_dim);
    if (rc || n == 0) return rc;
    if (ranks < 1 || !out || !parts)
        return strata_set_error(STRATA_EINVAL, "%s: %d ranks / NULL buffer", __func__, ranks);
    const size_t per_rank = (size_t)n * (size_t)nh * (size_t)(head_dim + 2);
    merge_kernel<<<(unsigned)(n * nh), column_threads(head_dim), 0, (cudaStream_t)stream>>>(
        out, parts, ranks, per_rank, head_dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
