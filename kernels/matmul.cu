/* CUDA matmul in the reference's fixed dot-product order (reference/ops.h): a block is 16 (or,
 * for small matrices, 4) half-warps; a half-warp owns one weight row, or one leaf of a row
 * under cuda_matmul_split, and up to kTok tokens (a token tile: the grid's x; a call of one
 * token runs the tile built for one, T = 1, the same FMAs). Lane l of a half-warp accumulates
 * the elements k0 + l of every 16-element block: lanes 0..7 are the reference's a0[0..7],
 * lanes 8..15 its a1[0..7] (bf16 rows load 16 bytes a lane and transpose through shared
 * memory to get there: dot_rounds_bf16). Shuffles then fold exactly as the reference does
 * (s = a0 + a1, t[i] = s[i] + s[i + 4], (t0 + t2) + (t1 + t3)) and lane 0 runs the K % 16
 * tail. Tiling over tokens only shares the weight loads; it never
 * changes one element's arithmetic. cuda_matmul_split runs the same dot over each leaf's
 * columns (as the reference's matmul_split), the leaves of a row on neighbouring
 * half-warps, and the row's first lane combines them by the balanced tree. */
#include <stdint.h>
#include <string.h>
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/matmul.h"
#include "runtime/base/op_contract.h"
}

static const int kThreads = 256; /* 16 half-warps: 16 / leaves weight rows per block */
static const int kTok = 4;       /* tokens per half-warp */
/* cuda_matmul_grouped's offsets in shared memory: 16 KB, which with the 16 KB of the bf16
 * loads' transpose buffer stays inside the 48 KB a block gets without opting in. */
static const int kMaxGroups = 4096;

__device__ static inline float widen(uint16_t v) {
    return __uint_as_float((unsigned)v << 16);
}

__device__ static inline float widen(float v) {
    return v;
}

/* bf16 weights with 16-byte loads. The reference's accumulator lane l owns the columns
 * k0 + 16 b + l, 2 bytes apart from its neighbours' and 32 from its own next one: loading them
 * as dot_range's lanes do moves 32 bytes per half-warp load, too few bytes in flight to fill a
 * GPU's memory bandwidth at batch 1 (14% of the H200's on the 8B shape). Here each lane loads
 * 16 contiguous bytes (8 columns) of a 128-column chunk, U chunks a round, and the half-warp
 * transposes them through shared memory, so that lane l still reads exactly its columns in
 * ascending order and every FMA is the one dot_range would do, in the same order (bitwise the
 * same). The next round's loads are issued before this round's FMAs. Consumes whole rounds
 * from k and returns the first column it did not consume; the caller continues the chains
 * from there. Every lane of the warp must call it under the same conditions (the __syncwarp
 * calls): dot_chunks decides by the call's cols, k0 and weight address, which every row of a
 * warp shares. With R rows a half-warp (dot_range) each row has its own loads and transpose
 * buffer and one load of x serves them all. */
/* Tuning knobs, defined otherwise only by kernels/matmul_variants_bench.c's builds (the same
 * arithmetic in every variant: only the loads' schedule and the occupancy differ). */
#ifndef STRATA_MATMUL_STAGE
#define STRATA_MATMUL_STAGE 4 /* chunks per round: 64 bytes in flight per lane */
#endif
#ifndef STRATA_MATMUL_MIN_BLOCKS
#define STRATA_MATMUL_MIN_BLOCKS 3 /* __launch_bounds__'s blocks per multiprocessor */
#endif
#ifndef STRATA_MATMUL_WIDE
#define STRATA_MATMUL_WIDE 1 /* 0: every row with 2-byte loads (the first GPU run's kernel) */
#endif
#ifndef STRATA_MATMUL_STREAMING
#define STRATA_MATMUL_STREAMING 0 /* 1: the weights' 16-byte loads evict-first (__ldcs) */
#endif
#ifndef STRATA_MATMUL_ROWS
#define STRATA_MATMUL_ROWS 1 /* weight rows per half-warp in a one-token plain or multi call: */
#endif                       /* 2 shares each load of x between two rows */
#ifndef STRATA_MATMUL_ONE_TOKEN
#define STRATA_MATMUL_ONE_TOKEN 1 /* 0: a one-token call runs the kTok-token tile's kernel */
#endif
static const int kChunk = 128; /* columns: 8 blocks of 16, 16 bytes per lane */
static const int kStage = STRATA_MATMUL_STAGE;
static const int kRows = STRATA_MATMUL_ROWS;

/* Weight rows a half-warp owns in a tile of T tokens (STRATA_MATMUL_ROWS applies to one-token
 * tiles only): the kernels' R and the launches' rows per block both read it. */
__host__ __device__ static constexpr int half_rows(int T) {
    return T == 1 ? kRows : 1;
}

/* One lane's 16 bytes of a weight chunk. A weight is read once per call while x is read by
 * every row: evict-first keeps the weights' lines from pushing x out of L1 (a variant). */
__device__ static inline uint4 load_chunk(const uint16_t *p) {
#if STRATA_MATMUL_STREAMING
    return __ldcs((const uint4 *)p);
#else
    return *(const uint4 *)p;
#endif
}

template <int U, int T, int R>
__device__ static inline int dot_rounds_bf16(float (&v)[R][T], uint4 (*mine)[kStage][16],
                                             const uint16_t *const (&wr)[R], const float *xt,
                                             int cols, int k, int k16, int nt, int lane) {
    const int rounds = (k16 - k) / (U * kChunk);
    uint4 q[R][U];
    if (rounds > 0)
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int u = 0; u < U; ++u)
                q[i][u] = load_chunk(wr[i] + k + u * kChunk + lane * 8);
    for (int r = 0; r < rounds; ++r, k += U * kChunk) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int u = 0; u < U; ++u)
                mine[i][u][lane] = q[i][u];
        __syncwarp();
        if (r + 1 < rounds)
#pragma unroll
            for (int i = 0; i < R; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    q[i][u] = load_chunk(wr[i] + k + U * kChunk + u * kChunk + lane * 8);
#pragma unroll
        for (int b = 0; b < U * kChunk / 16; ++b) {
            float wk[R];
#pragma unroll
            for (int i = 0; i < R; ++i)
                wk[i] = widen(((const uint16_t *)&mine[i][0][0])[b * 16 + lane]);
            const int kk = k + b * 16 + lane;
#pragma unroll
            for (int t = 0; t < T; ++t)
                if (T == 1 || t < nt) {
                    const float xk = xt[(size_t)t * (size_t)cols + kk];
#pragma unroll
                    for (int i = 0; i < R; ++i)
                        v[i][t] = __fmaf_rn(wk[i], xk, v[i][t]);
                }
        }
        __syncwarp(); /* every lane has read the buffer before the next round fills it */
    }
    return k;
}

template <int T, int R>
__device__ static inline int dot_chunks(float (&v)[R][T], const uint16_t *const (&wr)[R],
                                        const float *xt, int cols, int k0, int k16, int nt,
                                        int lane, bool wide) {
    if (!wide) return k0;
    /* The half-warp's transpose buffer: R x kStage x 256 bytes (R x 16 KB a block of 16
     * half-warps). */
    __shared__ uint4 stage[16][R][kStage][16];
    uint4(*mine)[kStage][16] = stage[threadIdx.x >> 4];
    const int k = dot_rounds_bf16<kStage, T, R>(v, mine, wr, xt, cols, k0, k16, nt, lane);
    return dot_rounds_bf16<1, T, R>(v, mine, wr, xt, cols, k, k16, nt, lane); /* the last chunks */
}

/* f32 weights keep dot_range's 4-byte loads (the tests' and the vision tower's small
 * matrices; a model's weights are bf16). */
template <int T, int R>
__device__ static inline int dot_chunks(float (&)[R][T], const float *const (&)[R], const float *,
                                        int, int k0, int, int, int, bool) {
    return k0;
}

/* Half-warp lanes' accumulators over columns [k0, k1) of R weight rows (16-element blocks
 * from k0, as the reference's dot over that range), folded into lane 0 with the K % 16 tail:
 * v[i][t] in lane 0 is the reference's dot of row i with token t over the range. The rows
 * share each load of x; each row's chain is the one it would have alone. Every lane of the
 * half-warp must call it (the shuffles). */
template <typename WT, int T, int R>
__device__ static inline void dot_range(float (&v)[R][T], const WT *const (&wr)[R], const float *xt,
                                        int cols, int k0, int k1, int nt, int lane, bool wide) {
    const int k16 = k0 + ((k1 - k0) & ~15);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int t = 0; t < T; ++t)
            v[i][t] = 0.0f;
    for (int k = dot_chunks<T, R>(v, wr, xt, cols, k0, k16, nt, lane, wide) + lane; k < k16;
         k += 16) {
        float wk[R];
#pragma unroll
        for (int i = 0; i < R; ++i)
            wk[i] = widen(wr[i][k]);
#pragma unroll
        for (int t = 0; t < T; ++t)
            if (T == 1 || t < nt) {
                const float xk = xt[(size_t)t * (size_t)cols + k];
#pragma unroll
                for (int i = 0; i < R; ++i)
                    v[i][t] = __fmaf_rn(wk[i], xk, v[i][t]);
            }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            float a = v[i][t];
            a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 8, 16)); /* s[l] = a0[l] + a1[l] */
            a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 4, 16)); /* t[i] = s[i] + s[i+4] */
            a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 2, 16)); /* t0 + t2, t1 + t3 */
            a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, 1, 16)); /* (t0+t2) + (t1+t3) */
            if (lane == 0 && (T == 1 || t < nt)) {
                const float *xr = xt + (size_t)t * (size_t)cols;
                for (int k = k16; k < k1; ++k)
                    a = __fmaf_rn(widen(wr[i][k]), xr[k], a);
            }
            v[i][t] = a;
        }
}

/* The balanced binary tree over v[0, L) (L a power of two), pairs of neighbours first, in
 * place: reference/ops_matmul.c tree_sum. Compile-time indices: v stays in registers. */
template <int L> __device__ static inline float leaf_tree(float (&v)[L]) {
#pragma unroll
    for (int count = L; count > 1; count /= 2)
#pragma unroll
        for (int i = 0; i < count / 2; ++i)
            v[i] = __fadd_rn(v[2 * i], v[2 * i + 1]);
    return v[0];
}

/* One block's tile: half-warp h of the block computes leaf h % L of the R weight rows from
 * (row_block * half_warps / L + h / L) * R against tokens [0, nt) of xt, and each row's leaf
 * 0 lane 0 combines its leaves by matmul_split's tree into out's rows [0, nt). L == 1 is the
 * plain dot product (cuda_matmul). Leaves on their own half-warps, not one after another on
 * one, give a split call L times the threads in flight (o_proj and down ran at half the
 * plain calls' bandwidth on an H200 before). */
template <typename WT, int L, int T, int R>
__device__ static inline void matmul_tile(float *out, const float *xt, const WT *w, int nt,
                                          int rows, int cols, int row_block) {
    const int lane = threadIdx.x & 15, h = threadIdx.x >> 4, j = h % L;
    const int r0 = (row_block * ((int)(blockDim.x >> 4) / L) + h / L) * R;
    /* Every lane takes part in the shuffles; rows past the end read the last row. */
    const WT *wr[R];
#pragma unroll
    for (int i = 0; i < R; ++i)
        wr[i] = w + (size_t)min(r0 + i, rows - 1) * (size_t)cols;
    /* The 16-byte loads where every leaf of every row starts 16-byte aligned: the same answer
     * for a warp's two half-warps, as dot_chunks needs. */
    const bool wide =
        STRATA_MATMUL_WIDE && sizeof(WT) == 2 && ((uintptr_t)w & 15) == 0 && cols % (8 * L) == 0;
    float v[R][T];
    dot_range<WT, T, R>(v, wr, xt, cols, (int)((long long)j * cols / L),
                        (int)((long long)(j + 1) * cols / L), nt, lane, wide);
    if (L == 1) {
        if (lane != 0) return;
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int t = 0; t < T; ++t)
                if (r0 + i < rows && (T == 1 || t < nt))
                    out[(size_t)t * (size_t)rows + (size_t)(r0 + i)] = v[i][t];
        return;
    }
    __shared__ float leaf_sums[16][R][T]; /* per half-warp: its leaf's dot of each row, token */
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int t = 0; t < T; ++t)
                leaf_sums[h][i][t] = v[i][t];
    __syncthreads();
    if (lane != 0 || j != 0) return;
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int t = 0; t < T; ++t) {
            float leaf[L];
#pragma unroll
            for (int l = 0; l < L; ++l)
                leaf[l] = leaf_sums[h + l][i][t];
            if (r0 + i < rows && (T == 1 || t < nt))
                out[(size_t)t * (size_t)rows + (size_t)(r0 + i)] = leaf_tree<L>(leaf);
        }
}

/* At most 80 registers, so three blocks of 256 fit a multiprocessor (the plain bf16 kernel
 * took 96 and ran two): more rows' loads in flight. The token tiles are the grid's x, its
 * fastest index: the blocks that read the same weight rows for other tokens run next to
 * each other, so a batch's or a prompt's tiles find the rows in L2 instead of streaming them
 * from memory once per tile (the y-major grid did, an 8B matrix being larger than L2). */
template <typename WT, int L, int T>
__global__ static void __launch_bounds__(kThreads, STRATA_MATMUL_MIN_BLOCKS)
    matmul_kernel(float *out, const float *x, const WT *w, int n, int rows, int cols) {
    const int t0 = blockIdx.x * kTok;
    matmul_tile<WT, L, T, half_rows(T)>(out + (size_t)t0 * (size_t)rows,
                                        x + (size_t)t0 * (size_t)cols, w, min(kTok, n - t0), rows,
                                        cols, (int)blockIdx.y);
}

/* Multi: up to OPS_MULTI_MAX matrices of one K side by side in the grid's y, each from its
 * first_block; a block's rows lie in one matrix, so each element is matmul_kernel's. */
struct MultiArgs {
    float *out[OPS_MULTI_MAX];
    const void *w[OPS_MULTI_MAX];
    int rows[OPS_MULTI_MAX];
    int first_block[OPS_MULTI_MAX + 1];
    int count;
};

template <typename WT, int T>
__global__ static void __launch_bounds__(kThreads, STRATA_MATMUL_MIN_BLOCKS)
    matmul_multi_kernel(MultiArgs a, const float *x, int n, int cols) {
    const int t0 = blockIdx.x * kTok, y = (int)blockIdx.y;
    int m = 0;
    while (m + 1 < a.count && y >= a.first_block[m + 1])
        ++m;
    matmul_tile<WT, 1, T, half_rows(T)>(a.out[m] + (size_t)t0 * (size_t)a.rows[m],
                                        x + (size_t)t0 * (size_t)cols, (const WT *)a.w[m],
                                        min(kTok, n - t0), a.rows[m], cols, y - a.first_block[m]);
}

/* Grouped: block row blockIdx.y is the y-th token tile of the groups in order (each group's
 * rows cut into tiles of kTok from its first row), found by thread 0 from the offsets (read
 * into shared memory by the whole block first); blocks past the last tile return. Each tile
 * runs matmul_tile against its group's weight, so every element is cuda_matmul's (or
 * _split's) arithmetic. */
template <typename WT, int L>
__global__ static void matmul_grouped_kernel(float *out, const float *x, const void *const *ptrs,
                                             const int32_t *offsets, int n_groups, int cap,
                                             int rows, int cols) {
    extern __shared__ int group_offsets[]; /* [n_groups + 1] */
    __shared__ int tile_group, tile_t0, tile_nt;
    for (int k = threadIdx.x; k <= n_groups; k += blockDim.x)
        group_offsets[k] = offsets[k];
    __syncthreads();
    if (threadIdx.x == 0) {
        int y = (int)blockIdx.y, g = -1, t0 = 0, nt = 0;
        for (int k = 0; k < n_groups; ++k) {
            const int lo = max(group_offsets[k], 0), hi = min(group_offsets[k + 1], cap);
            const int tiles = hi > lo ? (hi - lo + kTok - 1) / kTok : 0;
            if (y < tiles) {
                g = k;
                t0 = lo + y * kTok;
                nt = min(kTok, hi - t0);
                break;
            }
            y -= tiles;
        }
        tile_group = g;
        tile_t0 = t0;
        tile_nt = nt;
    }
    __syncthreads();
    const int g = tile_group, t0 = tile_t0;
    if (g < 0) return; /* the whole block: no shuffle is left waiting */
    matmul_tile<WT, L, kTok, 1>(out + (size_t)t0 * (size_t)rows, x + (size_t)t0 * (size_t)cols,
                                (const WT *)ptrs[g], tile_nt, rows, cols, (int)blockIdx.x);
}

/* A call of one token (a batch-1 decode step's every matmul) runs the tile's kernel built for
 * one: the same FMAs for token 0, without the kTok - 1 predicated loads and FMAs per 16
 * columns that a runtime token count leaves in the loop (the issue slots a decode GEMV
 * shares with its weight loads) and with a quarter of the accumulators. */
static inline bool one_token(int n) {
    return STRATA_MATMUL_ONE_TOKEN && n == 1;
}

/* The kernel for `leaves` (1, 2, 4, else 8), plain or grouped. */
template <typename WT, int T>
static void launch_leaves_t(float *out, const float *x, const WT *w, int n, int rows, int cols,
                            int leaves, dim3 grid, int threads, cudaStream_t s) {
    switch (leaves) {
    case 1: matmul_kernel<WT, 1, T><<<grid, threads, 0, s>>>(out, x, w, n, rows, cols); break;
    case 2: matmul_kernel<WT, 2, T><<<grid, threads, 0, s>>>(out, x, w, n, rows, cols); break;
    case 4: matmul_kernel<WT, 4, T><<<grid, threads, 0, s>>>(out, x, w, n, rows, cols); break;
    default: matmul_kernel<WT, 8, T><<<grid, threads, 0, s>>>(out, x, w, n, rows, cols); break;
    }
}

template <typename WT>
static void launch_leaves(float *out, const float *x, const WT *w, int n, int rows, int cols,
                          int leaves, dim3 grid, int threads, cudaStream_t s) {
    if (one_token(n))
        launch_leaves_t<WT, 1>(out, x, w, n, rows, cols, leaves, grid, threads, s);
    else
        launch_leaves_t<WT, kTok>(out, x, w, n, rows, cols, leaves, grid, threads, s);
}

template <typename WT>
static void launch_grouped(float *out, const float *x, const void *const *ptrs,
                           const int32_t *offsets, int n_groups, int cap, int rows, int cols,
                           int leaves, dim3 grid, cudaStream_t s) {
    const size_t smem = ((size_t)n_groups + 1) * sizeof(int);
#define STRATA_GROUPED(L)                                                                          \
    matmul_grouped_kernel<WT, L>                                                                   \
        <<<grid, kThreads, smem, s>>>(out, x, ptrs, offsets, n_groups, cap, rows, cols)
    switch (leaves) {
    case 1: STRATA_GROUPED(1); break;
    case 2: STRATA_GROUPED(2); break;
    case 4: STRATA_GROUPED(4); break;
    default: STRATA_GROUPED(8); break;
    }
#undef STRATA_GROUPED
}

static int launch(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                  void *stream, const char *name) {
    if (!w || n < 0 || w->rows <= 0 || w->cols <= 0 ||
        (w->dtype != OPS_BF16 && w->dtype != OPS_F32) || leaves < 1 || leaves > OPS_SPLIT_LEAVES ||
        (leaves & (leaves - 1)) ||
        (n > 0 && (!out || !x || !w->data || (const void *)out == (const void *)x)))
        return strata_set_error(
            STRATA_EINVAL, "%s: bad arguments (n %d, weight [%d, %d], dtype %d, leaves %d)", name,
            n, w ? w->rows : 0, w ? w->cols : 0, w ? (int)w->dtype : -1, leaves);
    if (n == 0) return STRATA_OK;
    /* 16 half-warps a block, or 4 (at least one row's leaves) where that would leave fewer
     * than 256 blocks: a k_proj of 1024 rows in 64 blocks kept half of an H200's 132
     * multiprocessors idle. The tile's arithmetic does not depend on it. */
    const int threads =
        (long long)w->rows * leaves >= 16LL * 256 ? kThreads : (leaves > 4 ? 16 * leaves : 64);
    const int per_half = half_rows(one_token(n) ? 1 : kTok);
    const int row_blocks = cuda_blocks_for(w->rows, threads / 16 / leaves * per_half);
    if (row_blocks > 65535) /* the grid's y */
        return strata_set_error(STRATA_EINVAL, "%s: %d weight rows in one call (at most %d)", name,
                                w->rows, 65535 * (threads / 16 / leaves * per_half));
    dim3 grid((unsigned)((n + kTok - 1) / kTok), (unsigned)row_blocks);
    cudaStream_t s = (cudaStream_t)stream;
    if (w->dtype == OPS_BF16)
        launch_leaves(out, x, (const uint16_t *)w->data, n, w->rows, w->cols, leaves, grid, threads,
                      s);
    else
        launch_leaves(out, x, (const float *)w->data, n, w->rows, w->cols, leaves, grid, threads,
                      s);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n,
                           void *stream) {
    return launch(out, x, w, n, 1, stream, "cuda_matmul");
}

extern "C" int cuda_matmul_split(float *out, const float *x, const struct ops_weight *w, int n,
                                 int leaves, void *stream) {
    return launch(out, x, w, n, leaves, stream, "cuda_matmul_split");
}

/* One launch for every matrix (the block size from their rows together, as launch() picks it
 * for one: the tile's arithmetic does not depend on it). */
extern "C" int cuda_matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count,
                                 const float *x, int n, void *stream) {
    int bad = !outs || !ws || count < 1 || count > OPS_MULTI_MAX || n < 0;
    long long total = 0;
    for (int i = 0; !bad && i < count; ++i) {
        const struct ops_weight *w = ws[i];
        bad = !w || w->rows <= 0 || w->cols != ws[0]->cols || w->cols <= 0 ||
              w->dtype != ws[0]->dtype || (w->dtype != OPS_BF16 && w->dtype != OPS_F32) ||
              (n > 0 && (!outs[i] || !x || !w->data || (const void *)outs[i] == (const void *)x));
        if (!bad) total += w->rows;
    }
    if (bad)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_matmul_multi: bad arguments (%d matrices, n %d): each needs "
                                "rows, data, an output apart from x, and the first's K and dtype",
                                count, n);
    if (n == 0) return STRATA_OK;
    const int threads = total >= 16LL * 256 ? kThreads : 64;
    const int per_half = half_rows(one_token(n) ? 1 : kTok);
    MultiArgs a;
    memset(&a, 0, sizeof a);
    a.count = count;
    for (int i = 0; i < count; ++i) {
        a.out[i] = outs[i];
        a.w[i] = ws[i]->data;
        a.rows[i] = ws[i]->rows;
        a.first_block[i + 1] =
            a.first_block[i] + (int)cuda_blocks_for(ws[i]->rows, threads / 16 * per_half);
    }
    if (a.first_block[count] > 65535) /* the grid's y */
        return strata_set_error(STRATA_EINVAL, "cuda_matmul_multi: %lld weight rows in one call",
                                total);
    dim3 grid((unsigned)((n + kTok - 1) / kTok), (unsigned)a.first_block[count]);
    cudaStream_t s = (cudaStream_t)stream;
    const int cols = ws[0]->cols;
    if (ws[0]->dtype == OPS_BF16 && one_token(n))
        matmul_multi_kernel<uint16_t, 1><<<grid, threads, 0, s>>>(a, x, n, cols);
    else if (ws[0]->dtype == OPS_BF16)
        matmul_multi_kernel<uint16_t, kTok><<<grid, threads, 0, s>>>(a, x, n, cols);
    else if (one_token(n))
        matmul_multi_kernel<float, 1><<<grid, threads, 0, s>>>(a, x, n, cols);
    else
        matmul_multi_kernel<float, kTok><<<grid, threads, 0, s>>>(a, x, n, cols);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_matmul_grouped(float *out, const float *x, const struct ops_weight *w,
                                   const void *const *ptrs, const int32_t *offsets, int n_groups,
                                   int cap, int leaves, void *stream) {
    if (!w || w->rows <= 0 || w->cols <= 0 || (w->dtype != OPS_BF16 && w->dtype != OPS_F32) ||
        n_groups < 1 || n_groups > kMaxGroups || cap < 0 || leaves < 1 ||
        leaves > OPS_SPLIT_LEAVES || (leaves & (leaves - 1)) ||
        (cap > 0 && (!out || !x || !ptrs || !offsets || (const void *)out == (const void *)x)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_matmul_grouped: bad arguments (cap %d, %d groups, weight "
                                "[%d, %d], leaves %d)",
                                cap, n_groups, w ? w->rows : 0, w ? w->cols : 0, leaves);
    if (cap == 0) return STRATA_OK;
    /* Tiles: each group's ceil(count / kTok) <= (count + kTok - 1) / kTok over at most
     * min(n_groups, cap) non-empty groups, and never more than one per row. */
    const long long nonempty = n_groups < cap ? n_groups : cap;
    long long tiles = ((long long)cap + (kTok - 1) * nonempty) / kTok;
    if (tiles > cap) tiles = cap;
    if (tiles > 65535)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_matmul_grouped: %d rows in %d groups in one "
                                "call (at most 65535 tiles)",
                                cap, n_groups);
    dim3 grid(cuda_blocks_for(w->rows, kThreads / 16 / leaves), (unsigned)tiles);
    cudaStream_t s = (cudaStream_t)stream;
    if (w->dtype == OPS_BF16)
        launch_grouped<uint16_t>(out, x, ptrs, offsets, n_groups, cap, w->rows, w->cols, leaves,
                                 grid, s);
    else
        launch_grouped<float>(out, x, ptrs, offsets, n_groups, cap, w->rows, w->cols, leaves, grid,
                              s);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
