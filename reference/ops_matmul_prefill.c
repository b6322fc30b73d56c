/* matmul's prefill register tiles (ops.h's arithmetic; see ops_matmul.c for the decode tiles and
 * the path selection): AVX2 2 rows x 3 tokens over row blocks widened to f32, AVX-512 4 rows x 6
 * tokens over the rows as stored. */
#include <math.h>
#include <string.h>

#include "reference/ops_matmul_internal.h"

#if OPS_HAVE_X86
/* The prefill register tile: 2 weight rows x 3 tokens, f32 weights (bf16 rows are widened
 * into a block first, exactly). 12 accumulators (each output's a0 / a1 of ops.h) + 2 weight
 * registers + 1 input register: 15 of the 16 ymm. Per 16 columns 4 weight and 6 input loads
 * feed 12 FMAs, against 10 loads (and the widening) per 8 FMAs in the 1 x 4 tile. Every output
 * still runs its own a0 / a1 FMAs in column order, the same fold and the same scalar tail. */
/* Keeps the loaded input in a register: left alone, GCC folds each input load into both of
 * its FMAs' memory operands (16 loads per 12 FMAs instead of 10), and the tile then ran no
 * faster than the 1 x 4 one (3072 x 1024 x 64 tokens, 1 thread: 20 -> 30 GMAC/s with it). */
#define PIN(v) __asm__("" : "+x"(v))
#define R2T3_FMA(H, OFF)                                                                           \
    do {                                                                                           \
        __m256 wa = _mm256_loadu_ps(w0 + k + (OFF)), wb = _mm256_loadu_ps(w1 + k + (OFF));         \
        __m256 xv = _mm256_loadu_ps(x0 + k + (OFF));                                               \
        PIN(xv);                                                                                   \
        a00##H = _mm256_fmadd_ps(wa, xv, a00##H);                                                  \
        a10##H = _mm256_fmadd_ps(wb, xv, a10##H);                                                  \
        xv = _mm256_loadu_ps(x1 + k + (OFF));                                                      \
        PIN(xv);                                                                                   \
        a01##H = _mm256_fmadd_ps(wa, xv, a01##H);                                                  \
        a11##H = _mm256_fmadd_ps(wb, xv, a11##H);                                                  \
        xv = _mm256_loadu_ps(x2 + k + (OFF));                                                      \
        PIN(xv);                                                                                   \
        a02##H = _mm256_fmadd_ps(wa, xv, a02##H);                                                  \
        a12##H = _mm256_fmadd_ps(wb, xv, a12##H);                                                  \
    } while (0)

/* out[t * 2 + r] for rows w, w + ldw and tokens x, x + ldx, x + 2 * ldx over k_len columns. */
AVX2_TARGET static void avx2_r2t3_f32(float *out, const void *w, size_t ldw, const float *x,
                                      size_t ldx, int k_len) {
    const float *w0 = w, *w1 = w0 + ldw, *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx;
    __m256 a00l = _mm256_setzero_ps(), a00h = a00l, a01l = a00l, a01h = a00l, a02l = a00l;
    __m256 a02h = a00l, a10l = a00l, a10h = a00l, a11l = a00l, a11h = a00l, a12l = a00l;
    __m256 a12h = a00l;
    int k = 0;
    for (; k + 16 <= k_len; k += 16) {
        R2T3_FMA(l, 0);
        R2T3_FMA(h, 8);
    }
    out[0] = fold_avx(a00l, a00h);
    out[1] = fold_avx(a10l, a10h);
    out[2] = fold_avx(a01l, a01h);
    out[3] = fold_avx(a11l, a11h);
    out[4] = fold_avx(a02l, a02h);
    out[5] = fold_avx(a12l, a12h);
    for (; k < k_len; ++k) {
        out[0] = fmaf(w0[k], x0[k], out[0]);
        out[1] = fmaf(w1[k], x0[k], out[1]);
        out[2] = fmaf(w0[k], x1[k], out[2]);
        out[3] = fmaf(w1[k], x1[k], out[3]);
        out[4] = fmaf(w0[k], x2[k], out[4]);
        out[5] = fmaf(w1[k], x2[k], out[5]);
    }
}

/* The AVX-512 register tiles: 4 weight rows x T tokens (T <= 6). Each output keeps one zmm
 * accumulator whose low / high halves are ops.h's a0 / a1, as in avx512_dot1; at T = 6, 24
 * accumulators + 4 weight registers + 1 input register of the 32 zmm, and per 16 columns 4
 * weight and 6 input loads feed 24 FMAs. Every output runs its own FMAs in column order, the
 * same fold and the same scalar tail, so the bits are ops.h's. PIN512 keeps each input load in a
 * register (see the AVX2 tile): folded into the four FMAs' memory operands it would be loaded
 * four times. */
#define PIN512(v) __asm__("" : "+v"(v))

/* out[t * R + r] for rows w + r * ldw (r < R) and tokens x + t * ldx (t < T) over k_len; w points
 * to WT (f32 rows, or bf16 rows widened in registers: on Zen 5 the 4 widenings per 24 FMAs
 * ran faster than widening the block into memory first, 108 vs 91-98 GMAC/s on a 3072 x 1024
 * matrix and 64 tokens, 99 vs 79 streaming Qwen3-0.6B's lm_head from DRAM). T = 6 for prefill;
 * T = 2..5 for a decode step of 2-5 requests, which streams the weights from DRAM once for all
 * of them: those prefetch the next 4 rows linearly, as the decode tile does (n = 2 through the
 * 1 x 4 tiles took 2.2x the time of n = 1 on the lm_head; now about the same). So does the 4 x 6
 * tile for the first token group of a row block, which streams the block from DRAM; the later
 * groups find it in L2 (prefetching there cost 7% on 1024 x 3072 x 240 tokens; the first group's
 * prefetch: the lm_head with 6 tokens 17.4 -> 9.8 ms, with 64 tokens 104 -> 97 ms). The loops over
 * t and r unroll completely (T and 4 are constants), so every accumulator stays a register. */
#define DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, NAME, R, T, PF)                                    \
    AVX512_TARGET static void avx512_##NAME##_##SUF(float *out, const void *wv, size_t ldw,        \
                                                    const float *x, size_t ldx, int k_len) {       \
        const WT *w = wv;                                                                          \
        const char *pf = (const char *)(w + (R)*ldw);                                              \
        __m512 acc[T][R];                                                                          \
        _Pragma("GCC unroll 24") for (int i = 0; i < (T) * (R); ++i) acc[i / (R)][i % (R)] =       \
            _mm512_setzero_ps();                                                                   \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            if (PF) PREFETCH_STEP_HINT(pf, (R)*16 * (int)sizeof(WT), _MM_HINT_NTA);                \
            __m512 wr[R];                                                                          \
            _Pragma("GCC unroll 4") for (int r = 0; r < (R); ++r) wr[r] =                          \
                LOAD(w + (size_t)r * ldw + k);                                                     \
            _Pragma("GCC unroll 8") for (int t = 0; t < (T); ++t) {                                \
                __m512 xv = _mm512_loadu_ps(x + (size_t)t * ldx + k);                              \
                PIN512(xv);                                                                        \
                _Pragma("GCC unroll 4") for (int r = 0; r < (R); ++r) acc[t][r] =                  \
                    _mm512_fmadd_ps(wr[r], xv, acc[t][r]);                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 24") for (int i = 0; i < (T) * (R); ++i) out[i] =                      \
            fold_avx512(acc[i / (R)][i % (R)]);                                                    \
        for (; k < k_len; ++k)                                                                     \
            for (int t = 0; t < (T); ++t)                                                          \
                for (int r = 0; r < (R); ++r)                                                      \
                    out[(R)*t + r] = fmaf(WIDEN(w[(size_t)r * ldw + k]), x[(size_t)t * ldx + k],   \
                                          out[(R)*t + r]);                                         \
    }
#define DEFINE_AVX512_R4T(SUF, WT, LOAD, WIDEN)                                                    \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t2, 4, 2, 1)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t3, 4, 3, 1)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t4, 4, 4, 1)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t5, 4, 5, 1)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t6, 4, 6, 0)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r4t6_prefetch, 4, 6, 1)                                \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r2t7, 2, 7, 1)                                         \
    DEFINE_AVX512_RTN(SUF, WT, LOAD, WIDEN, r2t8, 2, 8, 1)
DEFINE_AVX512_R4T(f32, float, load16_f32, WIDEN_F32)
DEFINE_AVX512_R4T(bf16, uint16_t, load16_bf16, WIDEN_BF16)

/* The 4 x 6 tile of matmul and matmul_split wherever K's leaves are whole 16-column steps (one
 * leaf: matmul; the caller checks; no scalar tail): the leaves' loop inside one call, the 24
 * accumulators named (registers, never spilled), each leaf's accumulators folded together
 * (fold16_avx512: fold_avx512's adds, several accumulators per instruction), its results kept
 * as two vectors, and the leaves summed lane-wise by the balanced binary tree (leaves a power of
 * two <= OPS_SPLIT_LEAVES): every output's arithmetic is ops.h's, bit for bit. Against a tile
 * call per leaf with 24 scalar folds, copies and scalar tree sums, on this session's Xeon, 1
 * thread, 64 tokens: split matrices at K = 1024 66 -> 108 GFLOP/s, plain ones 102 -> 146 (the
 * r4t6 tile's array of accumulators spilled around its folds); 6 tokens over a 64 MiB matrix,
 * which the r4t6 tile's NTA prefetch streamed at 5 GB/s, 12.9 -> 3.9 ms. Whether Zen 5, where
 * that prefetch was tuned, loses by going without it is to be measured there. */
#define DEFINE_AVX512_R4T6_SPLIT(SUF, WT, LOAD)                                                    \
    AVX512_TARGET static void avx512_r4t6_split_##SUF(float *out, const void *wv, size_t ldw,      \
                                                      const float *x, size_t ldx, const int *kb,   \
                                                      int leaves) {                                \
        const WT *w = wv;                                                                          \
        __m512 lo[OPS_SPLIT_LEAVES], hi[OPS_SPLIT_LEAVES];                                         \
        for (int j = 0; j < leaves; ++j) {                                                         \
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00;          \
            __m512 a11 = a00, a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;    \
            __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00, a40 = a00, a41 = a00, a42 = a00;    \
            __m512 a43 = a00, a50 = a00, a51 = a00, a52 = a00, a53 = a00;                          \
            for (int k = kb[j]; k < kb[j + 1]; k += 16) {                                          \
                const __m512 w0 = LOAD(w + k), w1 = LOAD(w + ldw + k);                             \
                const __m512 w2 = LOAD(w + 2 * ldw + k), w3 = LOAD(w + 3 * ldw + k);               \
                __m512 xv;                                                                         \
                SPLIT_ROW(0);                                                                      \
                SPLIT_ROW(1);                                                                      \
                SPLIT_ROW(2);                                                                      \
                SPLIT_ROW(3);                                                                      \
                SPLIT_ROW(4);                                                                      \
                SPLIT_ROW(5);                                                                      \
            }                                                                                      \
            lo[j] = fold16_avx512(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, \
                                  a31, a32, a33);                                                  \
            hi[j] = fold16_avx512(a40, a41, a42, a43, a50, a51, a52, a53, a40, a41, a42, a43, a50, \
                                  a51, a52, a53);                                                  \
        }                                                                                          \
        for (int n = leaves; n > 1; n /= 2) /* tree_sum's order, lane-wise */                      \
            for (int i = 0; i < n / 2; ++i) {                                                      \
                lo[i] = _mm512_add_ps(lo[2 * i], lo[2 * i + 1]);                                   \
                hi[i] = _mm512_add_ps(hi[2 * i], hi[2 * i + 1]);                                   \
            }                                                                                      \
        const __m512i order = fold16_order_avx512();                                               \
        _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, lo[0]));                                \
        _mm256_storeu_ps(out + 16, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, hi[0])));   \
    }
/* Token t's FMAs into its 4 accumulators a<t>0..3 (xv loaded and kept in a register). */
#define SPLIT_ROW(t)                                                                               \
    do {                                                                                           \
        xv = _mm512_loadu_ps(x + (t)*ldx + k);                                                     \
        PIN512(xv);                                                                                \
        a##t##0 = _mm512_fmadd_ps(w0, xv, a##t##0);                                                \
        a##t##1 = _mm512_fmadd_ps(w1, xv, a##t##1);                                                \
        a##t##2 = _mm512_fmadd_ps(w2, xv, a##t##2);                                                \
        a##t##3 = _mm512_fmadd_ps(w3, xv, a##t##3);                                                \
    } while (0)
DEFINE_AVX512_R4T6_SPLIT(f32, float, load16_f32)
DEFINE_AVX512_R4T6_SPLIT(bf16, uint16_t, load16_bf16)

/* Prefill with enough tokens (AVX2: PREFILL_TILED_MIN; below it the 1 x 4 tiles win, widening a
 * block costs about as much as its MACs when few tokens share it): the task's rows in blocks of
 * PREFILL_BLOCK_FLOATS elements, then every token group over every row group of the block with
 * the path's register tile (AVX2: 2 rows x 3 tokens over the block widened to f32 on the stack,
 * bf16 -> f32 being exact; AVX-512: 4 x 6 on the rows as stored, bf16 widened in registers). The
 * last rows and tokens take a tile overlapping the one before (rows: dot1 where a task has fewer
 * rows than a tile). Each output's arithmetic is ops.h's (the same FMAs in the same order as the
 * portable and 1 x 4 paths): only the tiling changes, which the paths test checks bit for bit. A
 * block (192 KiB widened: 4 rows of Qwen3-8B's down_proj, K = 12288) stays in L2 while the
 * token groups pass. */
#define PREFILL_TILED_MIN 32
#define PREFILL_BLOCK_FLOATS 49152
#define PREFILL_TILE_MAX 24

typedef void prefill_tile_fn(float *out, const void *w, size_t ldw, const float *x, size_t ldx,
                             int k_len);
typedef float prefill_dot1_fn(const void *w, const float *x, int k_len);
/* A whole tile of matmul_split: leaves [kb[j], kb[j + 1]) of the rows, tree-summed. */
typedef void prefill_split_fn(float *out, const void *w, size_t ldw, const float *x, size_t ldx,
                              const int *kb, int leaves);

struct prefill_tile {
    int rows, toks;                      /* out[t * rows + r] */
    int min_tokens;                      /* fewer take the 1 x 4 tiles */
    prefill_tile_fn *tile, *tile_bf16;   /* tile_bf16 NULL: bf16 blocks are widened first */
    prefill_tile_fn *first, *first_bf16; /* the first token group of a row block (NULL: tile) */
    prefill_dot1_fn *dot1, *dot1_bf16;
    /* [n]: the tile for exactly n tokens, min_tokens <= n < toks (NULL where min_tokens >=
     * toks): a decode step of a few requests */
    prefill_tile_fn *const *few, *const *few_bf16;
    prefill_split_fn *split, *split_bf16; /* for toks tokens (NULL: a tile per leaf) */
    /* [n]: a tile of PAIR_ROWS rows for exactly n tokens, toks < n <= PAIR_TOKENS_MAX (NULL:
     * none): a decode step of 7 or 8 requests in one pass over the weights */
    prefill_tile_fn *const *pair, *const *pair_bf16;
};
#define PAIR_ROWS 2
#define PAIR_TOKENS_MAX 8
#define PAIR_X_BYTES (32 * 1024)

static float avx2_dot1_f32_v(const void *w, const float *x, int k_len) {
    return avx2_dot1_f32(w, x, k_len);
}
static float avx512_dot1_f32_v(const void *w, const float *x, int k_len) {
    return avx512_dot1_f32(w, x, k_len);
}
static float avx512_dot1_bf16_v(const void *w, const float *x, int k_len) {
    return avx512_dot1_bf16(w, x, k_len);
}

/* AVX-512 from 2 tokens: with nothing to widen in memory, the 4 x 6 tile beat the 1 x 4 tiles
 * at every n >= 6 (3072 x 1024, 1 thread: 110 vs 36 GMAC/s at 6 tokens, 74 vs 50 at 8, 109 vs
 * 50 at 24), and 2-5 tokens take a 4 x n tile (see DEFINE_AVX512_R4TN). */
static prefill_tile_fn *const few_avx512_f32[6] = {
    NULL, NULL, avx512_r4t2_f32, avx512_r4t3_f32, avx512_r4t4_f32, avx512_r4t5_f32};
static prefill_tile_fn *const few_avx512_bf16[6] = {
    NULL, NULL, avx512_r4t2_bf16, avx512_r4t3_bf16, avx512_r4t4_bf16, avx512_r4t5_bf16};
/* 7 and 8 tokens: 2 rows x n (16 accumulators), one pass over the weights, where the tokens'
 * inputs stay in L1 (PAIR_X_BYTES: K <= 1024 at 8 tokens). As 4 + 4 tokens of 4 x 4 tiles the
 * first group streamed each row block from DRAM and the second computed it again from L2 with
 * the memory idle. bf16, 8 tokens, 2 threads, matrices cycled beyond the caches: 3072 x 1024
 * 0.95 -> 0.57 ms (4 tokens: 0.49), Qwen3-0.6B's lm_head 44.7 -> 31.7 ms. At K = 3072 the
 * inputs (96 KiB) spill to L2 and the pair tile lost (0.83 -> 0.96 ms): 4 + 4 there. */
static prefill_tile_fn *const pair_avx512_f32[PAIR_TOKENS_MAX + 1] = {
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, avx512_r2t7_f32, avx512_r2t8_f32};
static prefill_tile_fn *const pair_avx512_bf16[PAIR_TOKENS_MAX + 1] = {
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, avx512_r2t7_bf16, avx512_r2t8_bf16};
static const struct prefill_tile prefill_avx2 = {.rows = 2,
                                                 .toks = 3,
                                                 .min_tokens = PREFILL_TILED_MIN,
                                                 .tile = avx2_r2t3_f32,
                                                 .dot1 = avx2_dot1_f32_v};
static const struct prefill_tile prefill_avx512 = {.rows = 4,
                                                   .toks = 6,
                                                   .min_tokens = 2,
                                                   .tile = avx512_r4t6_f32,
                                                   .tile_bf16 = avx512_r4t6_bf16,
                                                   .first = avx512_r4t6_prefetch_f32,
                                                   .first_bf16 = avx512_r4t6_prefetch_bf16,
                                                   .dot1 = avx512_dot1_f32_v,
                                                   .dot1_bf16 = avx512_dot1_bf16_v,
                                                   .few = few_avx512_f32,
                                                   .few_bf16 = few_avx512_bf16,
                                                   .split = avx512_r4t6_split_f32,
                                                   .split_bf16 = avx512_r4t6_split_bf16,
                                                   .pair = pair_avx512_f32,
                                                   .pair_bf16 = pair_avx512_bf16};

/* 1 if the tiled prefill takes this job (a block must hold a whole row group). */
static int prefill_tiled_fits(const struct matmul_job *job, const struct prefill_tile *pt) {
    return job->n >= pt->min_tokens && pt->rows * job->w->cols <= PREFILL_BLOCK_FLOATS;
}

/* One block's rows as the tiles read them: f32 (widened or stored) or bf16 (stored). */
struct prefill_rows {
    const char *base; /* row 0 of the block */
    size_t esz;       /* bytes per element */
    prefill_tile_fn *tile;
    prefill_dot1_fn *dot1;
    int rows, toks;          /* the tile's rows and tokens */
    prefill_split_fn *split; /* matmul_split's leaves in one call, or NULL */
};

static const void *row_at(const struct prefill_rows *b, size_t r, size_t ld, int k) {
    return b->base + (r * ld + (size_t)k) * b->esz;
}

static void tile_leaves(const struct prefill_tile *pt, const struct prefill_rows *b, float *out,
                        size_t r, const float *x, size_t ld, const int *kb, int leaves) {
    (void)pt;
    const int m = b->rows * b->toks;
    float tile[PREFILL_TILE_MAX], leaf[PREFILL_TILE_MAX][OPS_SPLIT_LEAVES];
    if (b->split) { /* the leaves inside one call (whole 16-column steps: prefill_tiled) */
        b->split(out, row_at(b, r, ld, 0), ld, x, ld, kb, leaves);
        return;
    }
    if (leaves == 1) {
        b->tile(out, row_at(b, r, ld, 0), ld, x, ld, kb[1]);
        return;
    }
    for (int j = 0; j < leaves; ++j) {
        b->tile(tile, row_at(b, r, ld, kb[j]), ld, x + kb[j], ld, kb[j + 1] - kb[j]);
        for (int i = 0; i < m; ++i)
            leaf[i][j] = tile[i];
    }
    for (int i = 0; i < m; ++i)
        out[i] = tree_sum(leaf[i], leaves);
}

static float dot_leaves(const struct prefill_rows *b, size_t r, const float *x, size_t ld,
                        const int *kb, int leaves) {
    float leaf[OPS_SPLIT_LEAVES];
    for (int j = 0; j < leaves; ++j)
        leaf[j] = b->dot1(row_at(b, r, ld, kb[j]), x + kb[j], kb[j + 1] - kb[j]);
    return tree_sum(leaf, leaves);
}

/* dst[i] = src[i] widened, 8 at a time (exact: the bf16 bits become the high half). */
AVX2_TARGET static void widen_bf16_avx2(float *dst, const uint16_t *src, size_t count) {
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(dst + i, load8_bf16(src + i));
    for (; i < count; ++i)
        dst[i] = bf16_to_f32(src[i]);
}

/* Token group [t, t + T) over the rows [rb, re) of block b (its row 0 is row rb). */
static void prefill_group(const struct matmul_job *job, const struct prefill_tile *pt,
                          const struct prefill_rows *b, int rb, int re, int t, const int *kb) {
    const int R = b->rows, T = b->toks, L = job->leaves;
    const size_t ld = (size_t)job->w->cols, rows = (size_t)job->w->rows;
    const float *x = job->x + (size_t)t * ld;
    float tile[PREFILL_TILE_MAX];
    int r = rb;
    for (; r < re && re - rb >= R; r += R) {
        if (r + R > re) r = re - R; /* the last rows: a tile overlapping the one before */
        tile_leaves(pt, b, tile, (size_t)(r - rb), x, ld, kb, L);
        for (int i = 0; i < T; ++i)
            for (int q = 0; q < R; ++q)
                job->out[(size_t)(t + i) * rows + (size_t)(r + q)] = tile[i * R + q];
    }
    for (; r < re; ++r)
        for (int i = 0; i < T; ++i)
            job->out[(size_t)(t + i) * rows + (size_t)r] =
                dot_leaves(b, (size_t)(r - rb), x + (size_t)i * ld, ld, kb, L);
}

static void prefill_tiled(const struct matmul_job *job, int r0, int r1,
                          const struct prefill_tile *pt) {
    const struct ops_weight *w = job->w;
    const int K = w->cols, L = job->leaves, n = job->n;
    const size_t ld = (size_t)K;
    const int widen = w->dtype == OPS_BF16 && !pt->tile_bf16;
    float wide[PREFILL_BLOCK_FLOATS];
    int kb[OPS_SPLIT_LEAVES + 1];
    for (int j = 0; j <= L; ++j)
        kb[j] = leaf_start(j, L, K);
    const int block = PREFILL_BLOCK_FLOATS / K / pt->rows * pt->rows;
    /* Token groups of equal size, at most toks: 8 tokens are 4 + 4, not 6 + 6 overlapping by 4.
     * Without a few[] table, toks (the last group overlaps the one before). */
    const int groups = (n + pt->toks - 1) / pt->toks;
    int R = pt->rows, T = pt->few ? (n + groups - 1) / groups : pt->toks;
    const int bf16 = w->dtype == OPS_BF16 && !widen;
    prefill_tile_fn *tile =
        T < pt->toks ? (bf16 ? pt->few_bf16 : pt->few)[T] : (bf16 ? pt->tile_bf16 : pt->tile);
    prefill_tile_fn *first = T < pt->toks ? tile : (bf16 ? pt->first_bf16 : pt->first);
    if (pt->pair && n > pt->toks && n <= PAIR_TOKENS_MAX &&
        (size_t)n * ld * sizeof(float) <= PAIR_X_BYTES) { /* x in L1 */
        R = PAIR_ROWS;
        T = n;
        tile = first = (bf16 ? pt->pair_bf16 : pt->pair)[n];
    }
    if (!first) first = tile;
    int whole_steps = 1;
    for (int j = 0; j < L; ++j)
        whole_steps &= (kb[j + 1] - kb[j]) % 16 == 0;
    prefill_split_fn *split =
        whole_steps && T == pt->toks && R == pt->rows ? (bf16 ? pt->split_bf16 : pt->split) : NULL;
    for (int rb = r0; rb < r1; rb += block) {
        const int re = r1 - rb < block ? r1 : rb + block;
        struct prefill_rows b = {
            (const char *)w->data + (size_t)rb * ld * 4, 4, tile, pt->dot1, R, T, split};
        if (widen) {
            widen_bf16_avx2(wide, (const uint16_t *)w->data + (size_t)rb * ld,
                            (size_t)(re - rb) * ld);
            b.base = (const char *)wide;
        } else if (bf16) {
            b = (struct prefill_rows){
                (const char *)w->data + (size_t)rb * ld * 2, 2, tile, pt->dot1_bf16, R, T, split};
        }
        /* The last tokens: a group overlapping the one before (n >= T). Its outputs for tokens
         * already done are recomputed with the same arithmetic, so rewritten with the same
         * bits, at tile speed (dot1 for the 1-5 tokens left over was a fifth of a 64-token
         * prefill's matmul time). */
        for (int t = 0; t < n; t += T) {
            b.tile = t ? tile : first;
            prefill_group(job, pt, &b, rb, re, t + T <= n ? t : n - T, kb);
        }
    }
}

int matmul_prefill_tiled(const struct matmul_job *job, int r0, int r1) {
    const struct prefill_tile *pt = job->path == OPS_PATH_AVX512 ? &prefill_avx512
                                    : job->path == OPS_PATH_AVX2 ? &prefill_avx2
                                                                 : NULL;
    if (!pt || !prefill_tiled_fits(job, pt)) return 0;
    prefill_tiled(job, r0, r1, pt);
    return 1;
}
#endif
