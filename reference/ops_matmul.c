/* matmul (ops.h): three implementations of one arithmetic, chosen at run time with cpuid so the
 * build needs no -march flag.
 *
 * - portable C with fmaf: two 8-lane accumulators a0, a1 over 16-element blocks;
 * - AVX2+FMA: a0 and a1 are two ymm registers;
 * - AVX-512F: a0 and a1 are the low and high 256 bits of one zmm register. Lane j of the low
 *   half accumulates w[k+j]*x[k+j] and lane j of the high half w[k+8+j]*x[k+8+j], exactly the
 *   fp32 FMAs of a0[j] and a1[j]; the fold adds the halves (= a0 + a1) and then runs the same
 *   tree. bf16 is widened 16 at a time (zero-extend to 32 bits, shift left 16: exact).
 *
 * All three do the same correctly rounded operations in the same order (the same lane tree,
 * the same scalar fma tail), so every path gives identical bits and a pipeline may mix
 * machines with different instruction sets. Tiles (4 weight rows x 1 token for decode, 1 row
 * x 4 tokens for prefill) only interleave independent output elements. The decode tile also
 * prefetches the next tile linearly (one tile ahead, at the rate it consumes): weight rows are
 * short (often 2 KiB) and the hardware prefetcher ramps up too slowly on four interleaved
 * short streams; measured on the decode shapes, ~+35% read bandwidth at K = 1024. Prefetch
 * never changes arithmetic. */
#include <pthread.h>
#include <math.h>
#include <string.h>

#include "reference/ops.h"
#include "reference/ops_matmul_internal.h"
#include "reference/ops_q8.h"

/* ---------------------------------------------------------------- portable dot product */

static float fold_lanes(const float s[8]) {
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

static float portable_dot(const void *w_row, enum ops_dtype dtype, const float *x, int k_len) {
    float a0[8] = {0}, a1[8] = {0};
    int k = 0;
    if (dtype == OPS_BF16) {
        const uint16_t *w = w_row;
        for (; k + 16 <= k_len; k += 16)
            for (int l = 0; l < 8; ++l) {
                a0[l] = fmaf(bf16_to_f32(w[k + l]), x[k + l], a0[l]);
                a1[l] = fmaf(bf16_to_f32(w[k + 8 + l]), x[k + 8 + l], a1[l]);
            }
    } else {
        const float *w = w_row;
        for (; k + 16 <= k_len; k += 16)
            for (int l = 0; l < 8; ++l) {
                a0[l] = fmaf(w[k + l], x[k + l], a0[l]);
                a1[l] = fmaf(w[k + 8 + l], x[k + 8 + l], a1[l]);
            }
    }
    float s[8];
    for (int l = 0; l < 8; ++l)
        s[l] = a0[l] + a1[l];
    float r = fold_lanes(s);
    for (; k < k_len; ++k) {
        float wk = dtype == OPS_BF16 ? bf16_to_f32(((const uint16_t *)w_row)[k])
                                     : ((const float *)w_row)[k];
        r = fmaf(wk, x[k], r);
    }
    return r;
}

#if OPS_HAVE_X86

/* ---------------------------------------------------------------- AVX2 + FMA kernels */

/* Generates, for one weight element type, two kernels with the ops.h order:
 * dot1 (1 row x 1 token) and tok4 (1 row x 4 tokens). */
#define DEFINE_AVX2_KERNELS(SUF, WT, LOAD, WIDEN)                                                  \
    AVX2_TARGET float avx2_dot1_##SUF(const WT *w, const float *x, int k_len) {                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                 \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            a0 = _mm256_fmadd_ps(LOAD(w + k), _mm256_loadu_ps(x + k), a0);                         \
            a1 = _mm256_fmadd_ps(LOAD(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);                 \
        }                                                                                          \
        float r = fold_avx(a0, a1);                                                                \
        for (; k < k_len; ++k)                                                                     \
            r = fmaf(WIDEN(w[k]), x[k], r);                                                        \
        return r;                                                                                  \
    }                                                                                              \
    AVX2_TARGET static void avx2_tok4_##SUF(float out[4], const WT *w, const float *x, size_t ldx, \
                                            int k_len) {                                           \
        const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;                  \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                         \
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            __m256 w0 = LOAD(w + k), w1 = LOAD(w + k + 8);                                         \
            a00 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a00);                               \
            a01 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a01);                           \
            a10 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), a10);                               \
            a11 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), a11);                           \
            a20 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), a20);                               \
            a21 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + k + 8), a21);                           \
            a30 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), a30);                               \
            a31 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + k + 8), a31);                           \
        }                                                                                          \
        out[0] = fold_avx(a00, a01);                                                               \
        out[1] = fold_avx(a10, a11);                                                               \
        out[2] = fold_avx(a20, a21);                                                               \
        out[3] = fold_avx(a30, a31);                                                               \
        for (; k < k_len; ++k) {                                                                   \
            float wk = WIDEN(w[k]);                                                                \
            out[0] = fmaf(wk, x0[k], out[0]);                                                      \
            out[1] = fmaf(wk, x1[k], out[1]);                                                      \
            out[2] = fmaf(wk, x2[k], out[2]);                                                      \
            out[3] = fmaf(wk, x3[k], out[3]);                                                      \
        }                                                                                          \
    }

DEFINE_AVX2_KERNELS(bf16, uint16_t, load8_bf16, WIDEN_BF16)
DEFINE_AVX2_KERNELS(f32, float, load8_f32, WIDEN_F32)

/* The 4-row decode tile (f32 weights; bf16 has its own below). */
#define DEFINE_AVX2_ROWS4(SUF, WT, LOAD, WIDEN)                                                    \
    AVX2_TARGET static void avx2_rows4_##SUF(float out[4], const WT *w, size_t ldw,                \
                                             const float *x, int k_len, const char **pfp) {        \
        const WT *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;                     \
        const char *pf = *pfp;                                                                     \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                         \
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            PREFETCH_STEP(pf, 4 * 16 * (int)sizeof(WT));                                           \
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);                   \
            a00 = _mm256_fmadd_ps(LOAD(w0 + k), x0, a00);                                          \
            a01 = _mm256_fmadd_ps(LOAD(w0 + k + 8), x1, a01);                                      \
            a10 = _mm256_fmadd_ps(LOAD(w1 + k), x0, a10);                                          \
            a11 = _mm256_fmadd_ps(LOAD(w1 + k + 8), x1, a11);                                      \
            a20 = _mm256_fmadd_ps(LOAD(w2 + k), x0, a20);                                          \
            a21 = _mm256_fmadd_ps(LOAD(w2 + k + 8), x1, a21);                                      \
            a30 = _mm256_fmadd_ps(LOAD(w3 + k), x0, a30);                                          \
            a31 = _mm256_fmadd_ps(LOAD(w3 + k + 8), x1, a31);                                      \
        }                                                                                          \
        out[0] = fold_avx(a00, a01);                                                               \
        out[1] = fold_avx(a10, a11);                                                               \
        out[2] = fold_avx(a20, a21);                                                               \
        out[3] = fold_avx(a30, a31);                                                               \
        for (; k < k_len; ++k) {                                                                   \
            out[0] = fmaf(WIDEN(w0[k]), x[k], out[0]);                                             \
            out[1] = fmaf(WIDEN(w1[k]), x[k], out[1]);                                             \
            out[2] = fmaf(WIDEN(w2[k]), x[k], out[2]);                                             \
            out[3] = fmaf(WIDEN(w3[k]), x[k], out[3]);                                             \
        }                                                                                          \
        *pfp = pf;                                                                                 \
    }

DEFINE_AVX2_ROWS4(f32, float, load8_f32, WIDEN_F32)

/* The bf16 decode tile widens with unpacks instead of zero-extend + shift (fewer uops per
 * byte: ~30% more in-cache throughput on Zen 3, ~+4% decode tok/s at 1 thread). unpacklo/hi(0, w)
 * give, per 16-element block, lanes [k..k+3, k+8..k+11] and [k+4..k+7, k+12..k+15] already shifted
 * into fp32 position, so accumulator `lo` holds a0[0..3] | a1[0..3] and `hi` holds a0[4..7] |
 * a1[4..7]: lane for lane the FMAs of ops.h (x is permuted to match). The fold adds the same pairs
 * in the same tree. */
AVX2_TARGET static inline float fold_avx_split(__m256 lo, __m256 hi) {
    __m128 s03 = _mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
    __m128 s47 = _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
    __m128 t = _mm_add_ps(s03, s47);
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

#define UNPACK_FMA(R)                                                                              \
    do {                                                                                           \
        __m256i v = _mm256_loadu_si256((const __m256i *)(w##R + k));                               \
        lo##R = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), xl, lo##R);   \
        hi##R = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), xh, hi##R);   \
    } while (0)

AVX2_TARGET static void avx2_rows4_bf16(float out[4], const uint16_t *w, size_t ldw, const float *x,
                                        int k_len, const char **pfp) {
    const uint16_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    const char *pf = *pfp;
    const __m256i zero = _mm256_setzero_si256();
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
    __m256 lo2 = lo0, hi2 = lo0, lo3 = lo0, hi3 = lo0;
    int k = 0;
    for (; k + 16 <= k_len; k += 16) {
        PREFETCH_STEP(pf, 4 * 16 * 2);
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        __m256 xl = _mm256_permute2f128_ps(x0, x1, 0x20); /* x[k..k+3], x[k+8..k+11] */
        __m256 xh = _mm256_permute2f128_ps(x0, x1, 0x31); /* x[k+4..k+7], x[k+12..k+15] */
        UNPACK_FMA(0);
        UNPACK_FMA(1);
        UNPACK_FMA(2);
        UNPACK_FMA(3);
    }
    out[0] = fold_avx_split(lo0, hi0);
    out[1] = fold_avx_split(lo1, hi1);
    out[2] = fold_avx_split(lo2, hi2);
    out[3] = fold_avx_split(lo3, hi3);
    for (; k < k_len; ++k) {
        out[0] = fmaf(bf16_to_f32(w0[k]), x[k], out[0]);
        out[1] = fmaf(bf16_to_f32(w1[k]), x[k], out[1]);
        out[2] = fmaf(bf16_to_f32(w2[k]), x[k], out[2]);
        out[3] = fmaf(bf16_to_f32(w3[k]), x[k], out[3]);
    }
    *pfp = pf;
}

/* ---------------------------------------------------------------- AVX-512F kernels */

#define DEFINE_AVX512_KERNELS(SUF, WT, LOAD, WIDEN)                                                \
    AVX512_TARGET float avx512_dot1_##SUF(const WT *w, const float *x, int k_len) {                \
        __m512 a = _mm512_setzero_ps();                                                            \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16)                                                           \
            a = _mm512_fmadd_ps(LOAD(w + k), _mm512_loadu_ps(x + k), a);                           \
        float r = fold_avx512(a);                                                                  \
        for (; k < k_len; ++k)                                                                     \
            r = fmaf(WIDEN(w[k]), x[k], r);                                                        \
        return r;                                                                                  \
    }                                                                                              \
    AVX512_TARGET static void avx512_rows4_##SUF(float out[4], const WT *w, size_t ldw,            \
                                                 const float *x, int k_len, const char **pfp) {    \
        const WT *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;                     \
        const char *pf = *pfp;                                                                     \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            PREFETCH_STEP_HINT(pf, 4 * 16 * (int)sizeof(WT), _MM_HINT_NTA);                        \
            __m512 xv = _mm512_loadu_ps(x + k);                                                    \
            a0 = _mm512_fmadd_ps(LOAD(w0 + k), xv, a0);                                            \
            a1 = _mm512_fmadd_ps(LOAD(w1 + k), xv, a1);                                            \
            a2 = _mm512_fmadd_ps(LOAD(w2 + k), xv, a2);                                            \
            a3 = _mm512_fmadd_ps(LOAD(w3 + k), xv, a3);                                            \
        }                                                                                          \
        out[0] = fold_avx512(a0);                                                                  \
        out[1] = fold_avx512(a1);                                                                  \
        out[2] = fold_avx512(a2);                                                                  \
        out[3] = fold_avx512(a3);                                                                  \
        for (; k < k_len; ++k) {                                                                   \
            out[0] = fmaf(WIDEN(w0[k]), x[k], out[0]);                                             \
            out[1] = fmaf(WIDEN(w1[k]), x[k], out[1]);                                             \
            out[2] = fmaf(WIDEN(w2[k]), x[k], out[2]);                                             \
            out[3] = fmaf(WIDEN(w3[k]), x[k], out[3]);                                             \
        }                                                                                          \
        *pfp = pf;                                                                                 \
    }                                                                                              \
    AVX512_TARGET static void avx512_tok4_##SUF(float out[4], const WT *w, const float *x,         \
                                                size_t ldx, int k_len) {                           \
        const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;                  \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            __m512 wv = LOAD(w + k);                                                               \
            a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x0 + k), a0);                                 \
            a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x1 + k), a1);                                 \
            a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x2 + k), a2);                                 \
            a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x3 + k), a3);                                 \
        }                                                                                          \
        out[0] = fold_avx512(a0);                                                                  \
        out[1] = fold_avx512(a1);                                                                  \
        out[2] = fold_avx512(a2);                                                                  \
        out[3] = fold_avx512(a3);                                                                  \
        for (; k < k_len; ++k) {                                                                   \
            float wk = WIDEN(w[k]);                                                                \
            out[0] = fmaf(wk, x0[k], out[0]);                                                      \
            out[1] = fmaf(wk, x1[k], out[1]);                                                      \
            out[2] = fmaf(wk, x2[k], out[2]);                                                      \
            out[3] = fmaf(wk, x3[k], out[3]);                                                      \
        }                                                                                          \
    }

DEFINE_AVX512_KERNELS(bf16, uint16_t, load16_bf16, WIDEN_BF16)
DEFINE_AVX512_KERNELS(f32, float, load16_f32, WIDEN_F32)

#endif

/* ---------------------------------------------------------------- path selection */

#if OPS_HAVE_X86
static int cached_avx2, cached_avx512, cached_avx512_vnni;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void detect_cpu(void) {
    __builtin_cpu_init();
    cached_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    cached_avx512 = cached_avx2 && __builtin_cpu_supports("avx512f");
    cached_avx512_vnni = cached_avx512 && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#endif

/* Detected once per process (pthread_once: stages in threads of one process, e.g. the TP
 * tests, may run their first matmul at the same time). */
static int cpu_has(enum ops_path path) {
#if OPS_HAVE_X86
    pthread_once(&cpu_once, detect_cpu);
    if (path == OPS_PATH_AVX2) return cached_avx2;
    if (path == OPS_PATH_AVX512) return cached_avx512;
#endif
    return path == OPS_PATH_PORTABLE;
}

int ops_avx512_vnni_available(void) {
#if OPS_HAVE_X86
    pthread_once(&cpu_once, detect_cpu);
    return cached_avx512_vnni;
#else
    return 0;
#endif
}

static enum ops_path forced_path = OPS_PATH_AUTO;

int ops_path_available(enum ops_path path) {
    if (path == OPS_PATH_AUTO) return 1;
    return cpu_has(path);
}

int ops_force_path(enum ops_path path) {
    if (!ops_path_available(path)) return 0;
    forced_path = path;
    return 1;
}

enum ops_path ops_matmul_path(void) {
    if (forced_path != OPS_PATH_AUTO) return forced_path;
    if (cpu_has(OPS_PATH_AVX512)) return OPS_PATH_AVX512;
    if (cpu_has(OPS_PATH_AVX2)) return OPS_PATH_AVX2;
    return OPS_PATH_PORTABLE;
}

const char *ops_path_name(enum ops_path path) {
    switch (path) {
    case OPS_PATH_AUTO: return "auto";
    case OPS_PATH_PORTABLE: return "portable";
    case OPS_PATH_AVX2: return "avx2";
    case OPS_PATH_AVX512: return "avx512";
    }
    return "?";
}

int ops_force_portable(int force) {
    ops_force_path(force ? OPS_PATH_PORTABLE : OPS_PATH_AUTO);
    return cpu_has(OPS_PATH_AVX2);
}

/* ---------------------------------------------------------------- matmul */

#define MATMUL_ROWS_PER_TASK 16

static void matmul_rows_portable(const struct matmul_job *job, int r0, int r1) {
    const struct ops_weight *w = job->w;
    size_t esz = w->dtype == OPS_BF16 ? 2 : 4;
    float leaf[OPS_SPLIT_LEAVES];
    for (int r = r0; r < r1; ++r) {
        const char *row = (const char *)w->data + (size_t)r * (size_t)w->cols * esz;
        for (int t = 0; t < job->n; ++t) {
            const float *x = job->x + (size_t)t * (size_t)w->cols;
            for (int j = 0; j < job->leaves; ++j) {
                const int k0 = leaf_start(j, job->leaves, w->cols);
                leaf[j] = portable_dot(row + (size_t)k0 * esz, w->dtype, x + k0,
                                       leaf_start(j + 1, job->leaves, w->cols) - k0);
            }
            job->out[(size_t)t * (size_t)w->rows + (size_t)r] = tree_sum(leaf, job->leaves);
        }
    }
}

#if OPS_HAVE_X86
/* Prefill (n > 1) walks the weight rows in blocks of PREFILL_ROW_BLOCK rows and, inside a
 * block, every 4-token group over every row of the block: the block's rows (32 KiB of bf16 at
 * K = 1024) stay in L2 while the token groups pass, and one group's inputs (16 KiB at K = 1024)
 * stay in L1 across the block's rows. Row-outer order re-read every token's input per weight
 * row: n * K * 4 bytes from L2 or, on a long prompt, from DRAM, per 2 KiB of weights. The
 * order of outputs changes, not how any output is computed. */
#define PREFILL_ROW_BLOCK 32

/* Rows [r0, r1) of one SIMD path: 4-row tiles for one token, 4-token tiles otherwise. With
 * leaves > 1 each tile runs once per leaf (the decode tile's prefetch stream continues
 * across the leaves, so it still reads the next tile ahead linearly) and the leaf results
 * are combined by tree_sum. */
#define DEFINE_SIMD_ROWS(ISA, SUF, WT)                                                             \
    static void matmul_rows_##ISA##_##SUF(const struct matmul_job *job, int r0, int r1) {          \
        const struct ops_weight *w = job->w;                                                       \
        const WT *base = w->data;                                                                  \
        const int L = job->leaves, K = w->cols;                                                    \
        size_t ld = (size_t)K, rows = (size_t)w->rows;                                             \
        float tile[4], leaf[4][OPS_SPLIT_LEAVES];                                                  \
        int kb[OPS_SPLIT_LEAVES + 1];                                                              \
        for (int j = 0; j <= L; ++j)                                                               \
            kb[j] = leaf_start(j, L, K);                                                           \
        if (job->n == 1) {                                                                         \
            int r = r0;                                                                            \
            for (; r + 4 <= r1; r += 4) {                                                          \
                const WT *wr = base + (size_t)r * ld;                                              \
                const char *pf = (const char *)(wr + 4 * ld);                                      \
                if (L == 1) {                                                                      \
                    ISA##_rows4_##SUF(tile, wr, ld, job->x, K, &pf);                               \
                    memcpy(job->out + r, tile, sizeof tile);                                       \
                    continue;                                                                      \
                }                                                                                  \
                for (int j = 0; j < L; ++j) {                                                      \
                    ISA##_rows4_##SUF(tile, wr + kb[j], ld, job->x + kb[j], kb[j + 1] - kb[j],     \
                                      &pf);                                                        \
                    for (int i = 0; i < 4; ++i)                                                    \
                        leaf[i][j] = tile[i];                                                      \
                }                                                                                  \
                for (int i = 0; i < 4; ++i)                                                        \
                    job->out[r + i] = tree_sum(leaf[i], L);                                        \
            }                                                                                      \
            for (; r < r1; ++r) {                                                                  \
                const WT *wr = base + (size_t)r * ld;                                              \
                for (int j = 0; j < L; ++j)                                                        \
                    leaf[0][j] = ISA##_dot1_##SUF(wr + kb[j], job->x + kb[j], kb[j + 1] - kb[j]);  \
                job->out[r] = tree_sum(leaf[0], L);                                                \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        for (int rb = r0; rb < r1; rb += PREFILL_ROW_BLOCK) {                                      \
            const int re = r1 - rb < PREFILL_ROW_BLOCK ? r1 : rb + PREFILL_ROW_BLOCK;              \
            int t = 0;                                                                             \
            for (; t + 4 <= job->n; t += 4) {                                                      \
                const float *x = job->x + (size_t)t * ld;                                          \
                for (int r = rb; r < re; ++r) {                                                    \
                    const WT *row = base + (size_t)r * ld;                                         \
                    for (int j = 0; j < L; ++j) {                                                  \
                        ISA##_tok4_##SUF(tile, row + kb[j], x + kb[j], ld, kb[j + 1] - kb[j]);     \
                        for (int i = 0; i < 4; ++i)                                                \
                            leaf[i][j] = tile[i];                                                  \
                    }                                                                              \
                    for (int i = 0; i < 4; ++i)                                                    \
                        job->out[(size_t)(t + i) * rows + (size_t)r] = tree_sum(leaf[i], L);       \
                }                                                                                  \
            }                                                                                      \
            for (; t < job->n; ++t) {                                                              \
                const float *x = job->x + (size_t)t * ld;                                          \
                for (int r = rb; r < re; ++r) {                                                    \
                    const WT *row = base + (size_t)r * ld;                                         \
                    for (int j = 0; j < L; ++j)                                                    \
                        leaf[0][j] = ISA##_dot1_##SUF(row + kb[j], x + kb[j], kb[j + 1] - kb[j]);  \
                    job->out[(size_t)t * rows + (size_t)r] = tree_sum(leaf[0], L);                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
DEFINE_SIMD_ROWS(avx2, bf16, uint16_t)
DEFINE_SIMD_ROWS(avx2, f32, float)
DEFINE_SIMD_ROWS(avx512, bf16, uint16_t)
DEFINE_SIMD_ROWS(avx512, f32, float)
#endif

static void matmul_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct matmul_job *job = ctx;
    int r0 = begin * MATMUL_ROWS_PER_TASK;
    int r1 = end * MATMUL_ROWS_PER_TASK;
    int bf16 = job->w->dtype == OPS_BF16;
    if (r1 > job->w->rows) r1 = job->w->rows;
#if OPS_HAVE_X86
    if (matmul_prefill_tiled(job, r0, r1)) return;
    if (job->path == OPS_PATH_AVX512) {
        if (bf16)
            matmul_rows_avx512_bf16(job, r0, r1);
        else
            matmul_rows_avx512_f32(job, r0, r1);
        return;
    }
    if (job->path == OPS_PATH_AVX2) {
        if (bf16)
            matmul_rows_avx2_bf16(job, r0, r1);
        else
            matmul_rows_avx2_f32(job, r0, r1);
        return;
    }
#endif
    (void)bf16;
    matmul_rows_portable(job, r0, r1);
}

void matmul(float *out, const float *x, const struct ops_weight *w, int n,
            struct thread_pool *pool) {
    matmul_split(out, x, w, n, 1, pool);
}

void matmul_split(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                  struct thread_pool *pool) {
    if (w->dtype == OPS_Q8) {
        ops_q8_matmul(out, x, w, n, pool);
        return;
    }
    struct matmul_job job = {out, x, w, n, leaves, ops_matmul_path()};
    int tasks = (w->rows + MATMUL_ROWS_PER_TASK - 1) / MATMUL_ROWS_PER_TASK;
    thread_pool_run(pool, matmul_task, &job, tasks);
}

/* matmul_multi's job: the matrices' row tasks laid end to end, first[i] the first task of
 * matrix i (first[count] = all tasks). */
struct matmul_multi_job {
    struct matmul_job jobs[OPS_MULTI_MAX];
    int first[OPS_MULTI_MAX + 1];
    int count;
};

/* Tasks [begin, end) of the concatenation: each matrix's part is the row range matmul_task
 * would give it, so every output element has matmul's bits. */
static void matmul_multi_task(void *ctx, int begin, int end, int worker) {
    const struct matmul_multi_job *mj = ctx;
    for (int i = 0; i < mj->count && begin < end; ++i) {
        const int lo = mj->first[i], hi = mj->first[i + 1];
        const int b = begin > lo ? begin : lo, e = end < hi ? end : hi;
        if (b < e) matmul_task((void *)&mj->jobs[i], b - lo, e - lo, worker);
    }
}

void matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count, const float *x,
                  int n, struct thread_pool *pool) {
    int q8 = count > OPS_MULTI_MAX;
    for (int i = 0; i < count && !q8; ++i)
        q8 = ws[i]->dtype == OPS_Q8;
    if (q8) { /* q8 has its own tiles and dispatch; mixed or > OPS_MULTI_MAX: one call each */
        int all_q8 = count <= OPS_MULTI_MAX;
        for (int i = 0; i < count && all_q8; ++i)
            all_q8 = ws[i]->dtype == OPS_Q8;
        if (all_q8) {
            ops_q8_matmul_multi(outs, ws, count, x, n, pool);
            return;
        }
        for (int i = 0; i < count; ++i)
            matmul(outs[i], x, ws[i], n, pool);
        return;
    }
    struct matmul_multi_job mj = {.count = count};
    const enum ops_path path = ops_matmul_path();
    for (int i = 0; i < count; ++i) {
        mj.jobs[i] = (struct matmul_job){outs[i], x, ws[i], n, 1, path};
        mj.first[i + 1] =
            mj.first[i] + (ws[i]->rows + MATMUL_ROWS_PER_TASK - 1) / MATMUL_ROWS_PER_TASK;
    }
    thread_pool_run(pool, matmul_multi_task, &mj, mj.first[count]);
}

void matmul_serial(float *out, const float *x, const struct ops_weight *w, int n) {
    if (w->dtype == OPS_Q8) {
        ops_q8_matmul(out, x, w, n, NULL);
        return;
    }
    struct matmul_job job = {out, x, w, n, 1, ops_matmul_path()};
    matmul_task(&job, 0, (w->rows + MATMUL_ROWS_PER_TASK - 1) / MATMUL_ROWS_PER_TASK, 0);
}

void ops_tree_sum(float *out, const float *parts, int count, size_t n) {
    float v[OPS_SPLIT_LEAVES];
    for (size_t i = 0; i < n; ++i) {
        for (int k = 0; k < count; ++k)
            v[k] = parts[(size_t)k * n + i];
        out[i] = tree_sum(v, count);
    }
}
