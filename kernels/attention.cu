/* CUDA causal GQA attention, split-K over the keys (flash-decoding's grid) in the reference's
 * split-invariant order (reference/ops.h): softmax with the max over every key seen, the sum
 * of exps and of e_j v_j[d] per aligned block of OPS_ATTN_BLOCK positions (ascending j), the
 * blocks combined by the aligned binary tree with empty blocks skipped.
 *
 * The keys of one (query i, head h) are cut into chunks of CUDA_ATTN_CHUNK positions, an
 * aligned power-of-two number of blocks, so a chunk is exactly one subtree of that tree and
 * the chunks' values combine by the top of the same tree (reference attention_merge's
 * argument for KVP ranks). A chunk is also whole blocks of the paged cache (struct ops_kv):
 * its kernels look its kChunkBlocks block ids up once, into shared memory, and read each
 * block's OPS_ATTN_BLOCK rows wherever the table puts them. Three launches, each a grid
 * over (query x head, chunk):
 *   1. scores_kernel: s_j = (q . k_j) * D^-0.5 (__fmaf_rn in ascending d) into scratch,
 *      and the chunk's max;
 *   2. chunk_kernel: M = max of the chunk maxes (exact in any order), e_j = expf(s_j - M),
 *      per block the sums of e_j and of e_j v_j[d], the chunk's subtree over its blocks ->
 *      part [D + 1] (o, l);
 *   3. merge_kernel: the aligned tree over the chunks' parts (a binary counter per thread,
 *      reference/ops_attention.c tree_acc), then out = o * (1 / l).
 * Flash-decoding's running max would rescale partial sums and so change the bits; the global
 * max costs the second launch instead. A long context thus spreads over ~ctx / 256 blocks per
 * head instead of one; nothing depends on the chunk count but the time.
 *
 * The cache stores the view's dtype: the two kernels that read it are compiled per dtype and
 * widen 16-bit elements exactly as they load them (cuda_kv_load), so the products and sums
 * are the f32 cache's on the widened values, as the reference's (reference/ops_attention.c
 * kv_rows). */
#include <stdint.h>
#include <math.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/attention.h"
#include "runtime/base/op_contract.h"
}

static const int kThreads = 128;
static const int kChunkBlocks = CUDA_ATTN_CHUNK / OPS_ATTN_BLOCK;

static_assert(CUDA_ATTN_CHUNK % OPS_ATTN_BLOCK == 0 &&
                  ((CUDA_ATTN_CHUNK / OPS_ATTN_BLOCK) & (CUDA_ATTN_CHUNK / OPS_ATTN_BLOCK - 1)) ==
                      0,
              "a chunk must be an aligned power-of-two number of blocks (one subtree)");

/* The layout of one (query, head) row of scratch (attention.h). */
struct Row {
    float *scores; /* [ctx] */
    float *maxes;  /* [chunks] */
    float *parts;  /* [chunks][D + 1] */
};

struct Args {
    const float *q;
    ops_kv kv; /* device pointers; the struct itself is the kernel's parameter */
    float *scratch;
    size_t row_floats; /* scratch floats per (query, head) row */
    float *out;
    int pos, n, nh, group, d_len, ctx, chunks;
    float scale;
};

__device__ static inline Row row_of(const Args &a, int t) {
    Row r;
    r.scores = a.scratch + (size_t)t * a.row_floats;
    r.maxes = r.scores + a.ctx;
    r.parts = r.maxes + a.chunks;
    return r;
}

/* Bottom-up aligned tree over v[0, nb) (nb <= kChunkBlocks): node [i, i + 2s) = left + right
 * when the right half holds a block, else left. The same nesting as the reference's binary
 * counter finished right to left, with compile-time indices so v stays in registers. */
__device__ static inline float chunk_tree(float (&v)[kChunkBlocks], int nb) {
#pragma unroll
    for (int s = 1; s < kChunkBlocks; s *= 2)
#pragma unroll
        for (int i = 0; i + s < kChunkBlocks; i += 2 * s)
            if (i + s < nb) v[i] = __fadd_rn(v[i], v[i + s]);
    return v[0];
}

__device__ static float block_max(float v, float *shared) {
    v = cuda_warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float m = shared[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
        m = fmaxf(m, shared[w]);
    return m;
}

/* The block ids of chunk c's nb blocks into ids[] (shared; the caller syncs before use). */
__device__ static inline void chunk_blocks(int32_t *ids, const Args &a, int c, int nb) {
    if (threadIdx.x < nb) ids[threadIdx.x] = a.kv.blocks[c * kChunkBlocks + threadIdx.x];
}

/* q . k_j over d ascending, the key row at element `at` of the cache stored as DT: f32 in
 * 16-byte loads when aligned, 16-bit elements in 8-byte loads of four, each widened
 * exactly; the adds are in order whichever load is used. */
template <int DT>
__device__ static inline float key_dot(const float *qs, const void *cache, size_t at, int D) {
    float dot = 0.0f;
    if (DT == OPS_F32) {
        const float *kj = (const float *)cache + at;
        if (((D & 3) | ((uintptr_t)kj & 15)) == 0) {
            const float4 *k4 = reinterpret_cast<const float4 *>(kj);
            for (int d4 = 0; d4 < D / 4; ++d4) {
                const float4 kv = k4[d4];
                dot = __fmaf_rn(qs[4 * d4], kv.x, dot);
                dot = __fmaf_rn(qs[4 * d4 + 1], kv.y, dot);
                dot = __fmaf_rn(qs[4 * d4 + 2], kv.z, dot);
                dot = __fmaf_rn(qs[4 * d4 + 3], kv.w, dot);
            }
            return dot;
        }
        for (int d = 0; d < D; ++d)
            dot = __fmaf_rn(qs[d], kj[d], dot);
        return dot;
    }
    const uint16_t *kj = (const uint16_t *)cache + at;
    if (((D & 3) | ((uintptr_t)kj & 7)) == 0) {
        const uint2 *k4 = reinterpret_cast<const uint2 *>(kj);
        for (int d4 = 0; d4 < D / 4; ++d4) {
            const uint2 w = k4[d4]; /* little-endian: element 4 d4 in x's low half */
            dot = __fmaf_rn(qs[4 * d4], cuda_kv_widen<DT>((uint16_t)w.x), dot);
            dot = __fmaf_rn(qs[4 * d4 + 1], cuda_kv_widen<DT>((uint16_t)(w.x >> 16)), dot);
            dot = __fmaf_rn(qs[4 * d4 + 2], cuda_kv_widen<DT>((uint16_t)w.y), dot);
            dot = __fmaf_rn(qs[4 * d4 + 3], cuda_kv_widen<DT>((uint16_t)(w.y >> 16)), dot);
        }
        return dot;
    }
    for (int d = 0; d < D; ++d)
        dot = __fmaf_rn(qs[d], cuda_kv_widen<DT>(kj[d]), dot);
    return dot;
}

template <int DT> __global__ static void scores_kernel(Args a) {
    __shared__ float qs[OPS_ATTN_MAX_HEAD_DIM];
    __shared__ float shared[32];
    __shared__ int32_t ids[kChunkBlocks];
    const int t = blockIdx.x, i = t / a.nh, h = t % a.nh, c = blockIdx.y;
    const int ctx_len = a.pos + i + 1, j0 = c * CUDA_ATTN_CHUNK;
    if (j0 >= ctx_len) return; /* past this query's causal end: no chunk */
    const int j1 = min(j0 + CUDA_ATTN_CHUNK, ctx_len), D = a.d_len, g = h / a.group;
    const Row r = row_of(a, t);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = a.q[(size_t)t * (size_t)D + d];
    chunk_blocks(ids, a, c, (j1 - j0 + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK);
    __syncthreads();
    float local_max = -INFINITY;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const int jc = j - j0; /* in the chunk: block jc / 16, row jc % 16 */
        const size_t at = (size_t)ids[jc / OPS_ATTN_BLOCK] * a.kv.block_stride +
                          (size_t)g * a.kv.head_stride + (size_t)(jc % OPS_ATTN_BLOCK) * (size_t)D;
        const float s = __fmul_rn(key_dot<DT>(qs, a.kv.k, at, D), a.scale);
        r.scores[j] = s;
        local_max = fmaxf(local_max, s);
    }
    const float m = block_max(local_max, shared);
    if (threadIdx.x == 0) r.maxes[c] = m;
}

template <int DT> __global__ static void chunk_kernel(Args a) {
    __shared__ float e[CUDA_ATTN_CHUNK];
    __shared__ float lsum[kChunkBlocks];
    __shared__ float shared[32];
    __shared__ int32_t ids[kChunkBlocks];
    const int t = blockIdx.x, i = t / a.nh, h = t % a.nh, c = blockIdx.y;
    const int ctx_len = a.pos + i + 1, j0 = c * CUDA_ATTN_CHUNK;
    if (j0 >= ctx_len) return;
    const int j1 = min(j0 + CUDA_ATTN_CHUNK, ctx_len), D = a.d_len;
    const int nb = (j1 - j0 + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
    const int my_chunks = (ctx_len + CUDA_ATTN_CHUNK - 1) / CUDA_ATTN_CHUNK;
    const Row r = row_of(a, t);
    float m = -INFINITY;
    for (int k = threadIdx.x; k < my_chunks; k += blockDim.x)
        m = fmaxf(m, r.maxes[k]);
    chunk_blocks(ids, a, c, nb); /* block_max's barriers order it before the reads below */
    const float max = block_max(m, shared);
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x)
        e[j - j0] = expf(__fsub_rn(r.scores[j], max));
    __syncthreads();
    if (threadIdx.x < nb) { /* block b's sum of exps, ascending j */
        const int b0 = threadIdx.x * OPS_ATTN_BLOCK, b1 = min(b0 + OPS_ATTN_BLOCK, j1 - j0);
        float acc = 0.0f;
        for (int j = b0; j < b1; ++j)
            acc = __fadd_rn(acc, e[j]);
        lsum[threadIdx.x] = acc;
    }
    __syncthreads();
    float *part = r.parts + (size_t)c * (size_t)(D + 1);
    if (threadIdx.x == 0) {
        float v[kChunkBlocks];
#pragma unroll
        for (int b = 0; b < kChunkBlocks; ++b)
            v[b] = b < nb ? lsum[b] : 0.0f;
        part[D] = chunk_tree(v, nb);
    }
    const size_t head = (size_t)(h / a.group) * a.kv.head_stride;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v[kChunkBlocks];
#pragma unroll
        for (int b = 0; b < kChunkBlocks; ++b) {
            float acc = 0.0f;
            const int jb = j0 + b * OPS_ATTN_BLOCK;
            if (b < nb) { /* a block past the context has no table entry */
                const size_t vb = (size_t)ids[b] * a.kv.block_stride + head + (size_t)d;
#pragma unroll
                for (int jj = 0; jj < OPS_ATTN_BLOCK; ++jj)
                    if (jb + jj < j1)
                        acc = __fmaf_rn(e[jb + jj - j0],
                                        cuda_kv_load<DT>(a.kv.v, vb + (size_t)jj * (size_t)D), acc);
            }
            v[b] = acc;
        }
        part[d] = chunk_tree(v, nb);
    }
}

__global__ static void merge_kernel(Args a) {
    __shared__ float o[OPS_ATTN_MAX_HEAD_DIM + 1];
    const int t = blockIdx.x, i = t / a.nh, D = a.d_len;
    const int my_chunks = (a.pos + i + 1 + CUDA_ATTN_CHUNK - 1) / CUDA_ATTN_CHUNK;
    const Row r = row_of(a, t);
    for (int col = threadIdx.x; col <= D; col += blockDim.x) {
        TreeAcc acc;
        acc.top = 0;
        for (int k = 0; k < my_chunks; ++k)
            tree_push(acc, r.parts[(size_t)k * (size_t)(D + 1) + col]);
        o[col] = tree_finish(acc);
    }
    __syncthreads();
    const float inv = __fdiv_rn(1.0f, o[D]);
    float *out = a.out + (size_t)t * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        out[d] = __fmul_rn(o[d], inv);
}

extern "C" int cuda_attention(float *out, const float *q, const struct ops_kv *kv, float *scratch,
                              int pos, int n, int nh, int nkv, int head_dim, void *stream) {
    if (n < 0 || pos < 0 || nh <= 0 || nkv <= 0 || nh % nkv || head_dim <= 0 ||
        head_dim > OPS_ATTN_MAX_HEAD_DIM ||
        (n > 0 && (!out || !q || !kv || !kv->k || !kv->v || !kv->blocks || !scratch ||
                   !cuda_kv_dtype_ok(kv->dtype))))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_attention: bad arguments (n %d, pos %d, nh %d, nkv %d, "
                                "head_dim %d, kv dtype %d; head_dim at most %d)",
                                n, pos, nh, nkv, head_dim, kv ? (int)kv->dtype : -1,
                                OPS_ATTN_MAX_HEAD_DIM);
    if (n == 0) return STRATA_OK;
    const long long ctx = (long long)pos + n;
    const long long chunks = (ctx + CUDA_ATTN_CHUNK - 1) / CUDA_ATTN_CHUNK;
    if ((long long)n * nh > 2147483647LL || chunks > 65535 || ctx > 2147483647LL)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_attention: %d x %d queries over %lld positions is too large "
                                "for one launch",
                                n, nh, ctx);
    Args a;
    a.q = q;
    a.kv = *kv;
    a.scratch = scratch;
    a.row_floats = cuda_attention_row_floats(pos, n, head_dim);
    a.out = out;
    a.pos = pos;
    a.n = n;
    a.nh = nh;
    a.group = nh / nkv;
    a.d_len = head_dim;
    a.ctx = (int)ctx;
    a.chunks = (int)chunks;
    /* As the reference: 1 / sqrtf(D), on the host so the bits are glibc's. */
    a.scale = 1.0f / sqrtf((float)head_dim);
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)(n * nh), (unsigned)chunks);
    switch (kv->dtype) {
    case OPS_BF16:
        scores_kernel<OPS_BF16><<<grid, kThreads, 0, s>>>(a);
        CUDA_CHECK_LAUNCH();
        chunk_kernel<OPS_BF16><<<grid, kThreads, 0, s>>>(a);
        break;
    case OPS_F16:
        scores_kernel<OPS_F16><<<grid, kThreads, 0, s>>>(a);
        CUDA_CHECK_LAUNCH();
        chunk_kernel<OPS_F16><<<grid, kThreads, 0, s>>>(a);
        break;
    default:
        scores_kernel<OPS_F32><<<grid, kThreads, 0, s>>>(a);
        CUDA_CHECK_LAUNCH();
        chunk_kernel<OPS_F32><<<grid, kThreads, 0, s>>>(a);
        break;
    }
    CUDA_CHECK_LAUNCH();
    merge_kernel<<<(unsigned)(n * nh), kThreads, 0, s>>>(a);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
