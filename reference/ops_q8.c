/* q8 weights: the quantiser and the matmul kernels (format and arithmetic: ops_q8.h).
 *
 * Three implementations of one arithmetic, chosen with the bf16 matmul's path (ops_matmul_path):
 * portable C, AVX2, and AVX-512 VNNI (the avx512 path where the CPU has it, else AVX2). Tiles as in
 * ops_matmul.c: 4 weight rows x 1 token for decode (with a linear prefetch one tile ahead), 1 row x
 * 4 tokens for prefill; tiles only interleave independent output elements. */
#include <math.h>
#include <string.h>

#include "reference/ops_q8.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q8_HAVE_X86 1
#else
#define Q8_HAVE_X86 0
#endif

#define Q8_ROWS_PER_TASK 16
/* The quantised tokens of one pool run: every chunk re-reads all the weights, so a chunk
 * should hold a whole prompt's worth (227 tokens at K = 1024, 75 at K = 3072). */
#define Q8_ACT_STACK_BYTES (256 * 1024)
#define Q8_PREFILL_ROW_BLOCK 32

int ops_q8_supported(int cols) {
    return cols > 0 && cols <= OPS_Q8_MAX_COLS;
}

size_t ops_q8_bytes(int rows, int cols) {
    size_t ld = ops_q8_ld(cols);
    return (size_t)rows * (ld + ld / OPS_Q8_BLOCK * sizeof(float));
}

/* ---------------------------------------------------------------- quantiser */

/* Round to nearest, ties to even, for |v| < 2^22: adding and removing 1.5 * 2^23 leaves the
 * integer part (default rounding mode; C11 without -ffast-math keeps both operations). Unlike
 * rintf it vectorises without SSE4.1. NaN ends at -127 through the clamp. */
static int8_t round_clamp_127(float v) {
    const float magic = 12582912.0f;
    float r = (v + magic) - magic;
    if (!(r >= -127.0f)) r = -127.0f;
    if (r > 127.0f) r = 127.0f;
    return (int8_t)r;
}

/* One block of 32 values (a partial block arrives zero-padded, which leaves max|x| and the
 * padding's q = 0 as they should be). Fixed trip counts so that the compiler vectorises it:
 * the quantiser runs over every weight at load. q = round(x / d), not x * (1 / d): the
 * reciprocal moves some values across a rounding boundary, and the goldens' MoE routers are
 * sensitive enough to that to flip experts (measured: one case went from 100% to 71% greedy
 * agreement). A max|x| so small that d underflows to 0 gives q = 0. */
static float quantize_block(int8_t q[OPS_Q8_BLOCK], const float x[OPS_Q8_BLOCK]) {
    float amax = 0.0f;
    for (int i = 0; i < OPS_Q8_BLOCK; ++i) { /* not fmaxf: a libm call at -O2 */
        float v = fabsf(x[i]);
        amax = v > amax ? v : amax;
    }
    float d = amax / 127.0f;
    if (d == 0.0f) {
        memset(q, 0, OPS_Q8_BLOCK);
        return 0.0f;
    }
    for (int i = 0; i < OPS_Q8_BLOCK; ++i)
        q[i] = round_clamp_127(x[i] / d);
    return d;
}

#if Q8_HAVE_X86
#define AVX2_TARGET __attribute__((target("avx2,fma")))

/* quantize_block in AVX2, the same correctly rounded operations (max is exact in any order;
 * vmaxps(v, m) keeps m when v is NaN, as the scalar compare does; the clamp sends NaN to -127
 * in both), so the same bits: the load-time quantiser is the hot spot of loading a q8 model. */
AVX2_TARGET static float quantize_block_avx2(int8_t q[OPS_Q8_BLOCK], const float x[OPS_Q8_BLOCK]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float d = _mm_cvtss_f32(h) / 127.0f;
    if (d == 0.0f) {
        memset(q, 0, OPS_Q8_BLOCK);
        return 0.0f;
    }
    const __m256 dv = _mm256_set1_ps(d), magic = _mm256_set1_ps(12582912.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i iv[4];
    for (int i = 0; i < 4; ++i) {
        __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(v[i], dv), magic), magic);
        r = _mm256_min_ps(_mm256_max_ps(r, lo), hi); /* max(NaN, lo) = lo */
        iv[i] = _mm256_cvttps_epi32(r);
    }
    /* int32 x 32 -> int8 x 32: the packs interleave 128-bit lanes; the permute undoes it. */
    __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return d;
}
#endif

void ops_q8_quantize_row(int8_t *q, float *scale, const float *x, int k) {
    int b = 0;
#if Q8_HAVE_X86
    if (ops_matmul_path() != OPS_PATH_PORTABLE)
        for (; (b + 1) * OPS_Q8_BLOCK <= k; ++b)
            scale[b] =
                quantize_block_avx2(q + (size_t)b * OPS_Q8_BLOCK, x + (size_t)b * OPS_Q8_BLOCK);
#endif
    for (; (b + 1) * OPS_Q8_BLOCK <= k; ++b)
        scale[b] = quantize_block(q + (size_t)b * OPS_Q8_BLOCK, x + (size_t)b * OPS_Q8_BLOCK);
    if (b * OPS_Q8_BLOCK < k) {
        float tail[OPS_Q8_BLOCK] = {0};
        memcpy(tail, x + (size_t)b * OPS_Q8_BLOCK, (size_t)(k - b * OPS_Q8_BLOCK) * sizeof(float));
        scale[b] = quantize_block(q + (size_t)b * OPS_Q8_BLOCK, tail);
    }
}

struct quantize_job {
    int8_t *q;
    float *scale;
    const struct ops_weight *src;
};

static void quantize_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct quantize_job *job = ctx;
    const struct ops_weight *w = job->src;
    float row[OPS_Q8_MAX_COLS];
    size_t ld = ops_q8_ld(w->cols), nb = ld / OPS_Q8_BLOCK;
    for (int r = begin; r < end; ++r) {
        ops_weight_row(row, w, r);
        ops_q8_quantize_row(job->q + (size_t)r * ld, job->scale + (size_t)r * nb, row, w->cols);
    }
}

void ops_q8_quantize_weight(struct ops_weight *out, void *buf, const struct ops_weight *src,
                            struct thread_pool *pool) {
    struct ops_weight w = *src;
    int8_t *q = buf;
    float *scale = (float *)(q + (size_t)w.rows * ops_q8_ld(w.cols));
    struct quantize_job job = {q, scale, &w};
    if (pool)
        thread_pool_run(pool, quantize_task, &job, w.rows);
    else
        quantize_task(&job, 0, w.rows, 0);
    *out = (struct ops_weight){q, OPS_Q8, w.rows, w.cols};
}

void ops_q8_dequantize_row(float *out, const struct ops_weight *w, int row) {
    size_t ld = ops_q8_ld(w->cols);
    const int8_t *q = (const int8_t *)w->data + (size_t)row * ld;
    const float *d = ops_q8_scales(w) + (size_t)row * (ld / OPS_Q8_BLOCK);
    for (int c = 0; c < w->cols; ++c)
        out[c] = (float)q[c] * d[c / OPS_Q8_BLOCK];
}

/* ---------------------------------------------------------------- portable dot product */

static float fold8(const float s[8]) {
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

/* One weight row (q [nb*32], dw [nb]) times one quantised token (qx, dx). */
static float q8_dot_portable(const int8_t *q, const float *dw, const int8_t *qx, const float *dx,
                             int nb) {
    float acc[8] = {0};
    for (int b = 0; b < nb; ++b) {
        const int8_t *wb = q + (size_t)b * OPS_Q8_BLOCK, *xb = qx + (size_t)b * OPS_Q8_BLOCK;
        float d = dw[b] * dx[b];
        for (int l = 0; l < 8; ++l) {
            int32_t p = 0;
            for (int j = 0; j < 4; ++j)
                p += (int32_t)wb[4 * l + j] * (int32_t)xb[4 * l + j];
            acc[l] = fmaf(d, (float)p, acc[l]);
        }
    }
    return fold8(acc);
}

/* ---------------------------------------------------------------- AVX2 kernels */
#if Q8_HAVE_X86

/* Lane l = exact int32 sum of w[4l+j] * x[4l+j], j = 0..3, as f32 (see ops_q8.h). */
AVX2_TARGET static inline __m256 q8_block_avx2(__m256i w, __m256i x) {
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

AVX2_TARGET static inline __m256i load32(const int8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* fold8 on a register: t[i] = s[i] + s[i+4]; (t0 + t2) + (t1 + t3). */
AVX2_TARGET static inline float fold8_avx2(__m256 s) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

AVX2_TARGET static float q8_dot1_avx2(const int8_t *q, const float *dw, const int8_t *qx,
                                      const float *dx, int nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256 p = q8_block_avx2(load32(q + 32 * b), load32(qx + 32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[b]), p, acc);
    }
    return fold8_avx2(acc);
}

/* Four rows (q, q + ld, ...; scales dw, dw + ldd, ...) x one token; prefetches the next tile. */
AVX2_TARGET static void q8_rows4_avx2(float out[4], const int8_t *q, size_t ld, const float *dw,
                                      size_t ldd, const int8_t *qx, const float *dx, int nb) {
    const int8_t *q0 = q, *q1 = q + ld, *q2 = q + 2 * ld, *q3 = q + 3 * ld;
    const float *d0 = dw, *d1 = dw + ldd, *d2 = dw + 2 * ldd, *d3 = dw + 3 * ldd;
    const char *pf = (const char *)(q + 4 * ld);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < nb; ++b) {
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
        pf += 4 * OPS_Q8_BLOCK;
        __m256i xv = load32(qx + 32 * b);
        float d = dx[b];
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(d0[b] * d), q8_block_avx2(load32(q0 + 32 * b), xv), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(d1[b] * d), q8_block_avx2(load32(q1 + 32 * b), xv), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(d2[b] * d), q8_block_avx2(load32(q2 + 32 * b), xv), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(d3[b] * d), q8_block_avx2(load32(q3 + 32 * b), xv), a3);
    }
    out[0] = fold8_avx2(a0);
    out[1] = fold8_avx2(a1);
    out[2] = fold8_avx2(a2);
    out[3] = fold8_avx2(a3);
}

/* One row x four tokens (qx + t * ldx, dx + t * ldd). */
AVX2_TARGET static void q8_tok4_avx2(float out[4], const int8_t *q, const float *dw,
                                     const int8_t *qx, size_t ldx, const float *dx, size_t ldd,
                                     int nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < nb; ++b) {
        __m256i w = load32(q + 32 * b), aw = _mm256_sign_epi8(w, w);
        __m256i ones = _mm256_set1_epi16(1);
        __m256 p[4];
        for (int t = 0; t < 4; ++t) {
            __m256i xv = load32(qx + (size_t)t * ldx + 32 * b);
            __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
            p[t] = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        }
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[b]), p[0], a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[ldd + b]), p[1], a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[2 * ldd + b]), p[2], a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[3 * ldd + b]), p[3], a3);
    }
    out[0] = fold8_avx2(a0);
    out[1] = fold8_avx2(a1);
    out[2] = fold8_avx2(a2);
    out[3] = fold8_avx2(a3);
}

/* ---------------------------------------------------------------- AVX-512 VNNI kernels */

/* Two blocks per zmm: lanes 0..7 hold block b's p_l and lanes 8..15 block b + 1's, each the
 * exact int32 sum over bytes 4l..4l+3 that vpdpbusd (unsigned x signed, groups of 4 bytes)
 * forms, so the integers are the AVX2 kernel's. The sign moves onto the other operand as
 * there: |a| x (b negated where a < 0), with AVX-512BW masks instead of vpsignb (no zmm form).
 * The f32 steps stay per block and in block order, acc = fma(d_b, p_b, acc) on the low half
 * and then fma(d_{b+1}, p_{b+1}, acc) on the high half, so every path keeps ops_q8.h's bits;
 * an odd last block takes the AVX2 block. */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

VNNI_TARGET static inline __m512i load64(const int8_t *p) {
    return _mm512_loadu_si512((const void *)p);
}

/* p (two blocks' p_l) as f32, applied to acc with block b's scale, then block b + 1's. */
VNNI_TARGET static inline __m256 q8_fma_pair(__m256 acc, __m512i p, float d0, float d1) {
    __m512 f = _mm512_cvtepi32_ps(p);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm512_castps512_ps256(f), acc);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
    return _mm256_fmadd_ps(_mm256_set1_ps(d1), hi, acc);
}

/* |a| as unsigned bytes and b negated where a < 0: |a| * b' = a * b byte for byte. */
#define VNNI_DOT(ua, neg, b)                                                                       \
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), (ua),                                              \
                        _mm512_mask_sub_epi8((b), (neg), _mm512_setzero_si512(), (b)))

VNNI_TARGET static float q8_dot1_vnni(const int8_t *q, const float *dw, const int8_t *qx,
                                      const float *dx, int nb) {
    __m256 acc = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i xv = load64(qx + 32 * b);
        __m512i p = VNNI_DOT(_mm512_abs_epi8(xv), _mm512_movepi8_mask(xv), load64(q + 32 * b));
        acc = q8_fma_pair(acc, p, dw[b] * dx[b], dw[b + 1] * dx[b + 1]);
    }
    if (b < nb) {
        __m256 p = q8_block_avx2(load32(q + 32 * b), load32(qx + 32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[b]), p, acc);
    }
    return fold8_avx2(acc);
}

#define VNNI_ROW(R)                                                                                \
    a##R = q8_fma_pair(a##R, VNNI_DOT(ux, neg, load64(q##R + 32 * b)), d##R[b] * e0,               \
                       d##R[b + 1] * e1)
#define AVX2_ROW(R)                                                                                \
    a##R = _mm256_fmadd_ps(_mm256_set1_ps(d##R[b] * e0), q8_block_avx2(load32(q##R + 32 * b), xs), \
                           a##R)

/* q8_rows4_avx2 with two blocks per step. */
VNNI_TARGET static void q8_rows4_vnni(float out[4], const int8_t *q, size_t ld, const float *dw,
                                      size_t ldd, const int8_t *qx, const float *dx, int nb) {
    const int8_t *q0 = q, *q1 = q + ld, *q2 = q + 2 * ld, *q3 = q + 3 * ld;
    const float *d0 = dw, *d1 = dw + ldd, *d2 = dw + 2 * ldd, *d3 = dw + 3 * ldd;
    const char *pf = (const char *)(q + 4 * ld);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        for (int i = 0; i < 4; ++i)
            _mm_prefetch(pf + 64 * i, _MM_HINT_T0);
        pf += 8 * OPS_Q8_BLOCK;
        __m512i xv = load64(qx + 32 * b), ux = _mm512_abs_epi8(xv);
        __mmask64 neg = _mm512_movepi8_mask(xv);
        const float e0 = dx[b], e1 = dx[b + 1];
        VNNI_ROW(0);
        VNNI_ROW(1);
        VNNI_ROW(2);
        VNNI_ROW(3);
    }
    if (b < nb) {
        __m256i xs = load32(qx + 32 * b);
        const float e0 = dx[b];
        AVX2_ROW(0);
        AVX2_ROW(1);
        AVX2_ROW(2);
        AVX2_ROW(3);
    }
    out[0] = fold8_avx2(a0);
    out[1] = fold8_avx2(a1);
    out[2] = fold8_avx2(a2);
    out[3] = fold8_avx2(a3);
}

/* q8_tok4_avx2 with two blocks per step (the sign moves onto the tokens: |w| is shared). */
VNNI_TARGET static void q8_tok4_vnni(float out[4], const int8_t *q, const float *dw,
                                     const int8_t *qx, size_t ldx, const float *dx, size_t ldd,
                                     int nb) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wv = load64(q + 32 * b), uw = _mm512_abs_epi8(wv);
        __mmask64 neg = _mm512_movepi8_mask(wv);
        for (int t = 0; t < 4; ++t) {
            __m512i p = VNNI_DOT(uw, neg, load64(qx + (size_t)t * ldx + 32 * b));
            acc[t] = q8_fma_pair(acc[t], p, dw[b] * dx[(size_t)t * ldd + b],
                                 dw[b + 1] * dx[(size_t)t * ldd + b + 1]);
        }
    }
    if (b < nb) {
        __m256i wv = load32(q + 32 * b);
        for (int t = 0; t < 4; ++t) {
            __m256 p = q8_block_avx2(wv, load32(qx + (size_t)t * ldx + 32 * b));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[(size_t)t * ldd + b]), p, acc[t]);
        }
    }
    for (int t = 0; t < 4; ++t)
        out[t] = fold8_avx2(acc[t]);
}
#endif

/* ---------------------------------------------------------------- matmul */

/* One SIMD path's kernels (AVX2, AVX-512 VNNI); they give identical bits. */
struct q8_kernels {
    float (*dot1)(const int8_t *q, const float *dw, const int8_t *qx, const float *dx, int nb);
    void (*rows4)(float out[4], const int8_t *q, size_t ld, const float *dw, size_t ldd,
                  const int8_t *qx, const float *dx, int nb);
    void (*tok4)(float out[4], const int8_t *q, const float *dw, const int8_t *qx, size_t ldx,
                 const float *dx, size_t ldd, int nb);
};

#if Q8_HAVE_X86
static const struct q8_kernels q8_avx2 = {q8_dot1_avx2, q8_rows4_avx2, q8_tok4_avx2};
static const struct q8_kernels q8_vnni = {q8_dot1_vnni, q8_rows4_vnni, q8_tok4_vnni};
#endif

struct q8_job {
    float *out;       /* [n, rows] */
    const int8_t *qx; /* [n, ld] quantised tokens (ld = ops_q8_ld(cols)) */
    const float *dx;  /* [n, ld / 32] */
    const struct ops_weight *w;
    int n;
    const struct q8_kernels *simd; /* NULL: portable */
};

static void q8_rows_portable(const struct q8_job *job, int r0, int r1) {
    const struct ops_weight *w = job->w;
    size_t cols = ops_q8_ld(w->cols), nb = cols / OPS_Q8_BLOCK, rows = (size_t)w->rows;
    for (int r = r0; r < r1; ++r) {
        const int8_t *q = (const int8_t *)w->data + (size_t)r * cols;
        const float *dw = ops_q8_scales(w) + (size_t)r * nb;
        for (int t = 0; t < job->n; ++t)
            job->out[(size_t)t * rows + (size_t)r] = q8_dot_portable(
                q, dw, job->qx + (size_t)t * cols, job->dx + (size_t)t * nb, (int)nb);
    }
}

#if Q8_HAVE_X86
static void q8_rows_simd(const struct q8_job *job, int r0, int r1) {
    const struct q8_kernels *kn = job->simd;
    const struct ops_weight *w = job->w;
    const int8_t *base = w->data;
    size_t cols = ops_q8_ld(w->cols), nb = cols / OPS_Q8_BLOCK, rows = (size_t)w->rows;
    float tile[4];
    if (job->n == 1) {
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            kn->rows4(tile, base + (size_t)r * cols, cols, ops_q8_scales(w) + (size_t)r * nb, nb,
                      job->qx, job->dx, (int)nb);
            memcpy(job->out + r, tile, sizeof tile);
        }
        for (; r < r1; ++r)
            job->out[r] = kn->dot1(base + (size_t)r * cols, ops_q8_scales(w) + (size_t)r * nb,
                                   job->qx, job->dx, (int)nb);
        return;
    }
    /* Prefill: rows in blocks of Q8_PREFILL_ROW_BLOCK (32 KiB of q8 at K = 1024, in L2), and
     * inside a block every 4-token group over its rows (the group's inputs stay in L1), as
     * ops_matmul.c's 1 x 4 tiles do. Only the order of the outputs changes. */
    for (int rb = r0; rb < r1; rb += Q8_PREFILL_ROW_BLOCK) {
        const int re = r1 - rb < Q8_PREFILL_ROW_BLOCK ? r1 : rb + Q8_PREFILL_ROW_BLOCK;
        int t = 0;
        for (; t + 4 <= job->n; t += 4)
            for (int r = rb; r < re; ++r) {
                kn->tok4(tile, base + (size_t)r * cols, ops_q8_scales(w) + (size_t)r * nb,
                         job->qx + (size_t)t * cols, cols, job->dx + (size_t)t * nb, nb, (int)nb);
                for (int i = 0; i < 4; ++i)
                    job->out[(size_t)(t + i) * rows + (size_t)r] = tile[i];
            }
        for (; t < job->n; ++t)
            for (int r = rb; r < re; ++r)
                job->out[(size_t)t * rows + (size_t)r] =
                    kn->dot1(base + (size_t)r * cols, ops_q8_scales(w) + (size_t)r * nb,
                             job->qx + (size_t)t * cols, job->dx + (size_t)t * nb, (int)nb);
    }
}
#endif

static void q8_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct q8_job *job = ctx;
    int r0 = begin * Q8_ROWS_PER_TASK, r1 = end * Q8_ROWS_PER_TASK;
    if (r1 > job->w->rows) r1 = job->w->rows;
#if Q8_HAVE_X86
    if (job->simd) {
        q8_rows_simd(job, r0, r1);
        return;
    }
#endif
    q8_rows_portable(job, r0, r1);
}

/* ops_q8_matmul_multi: the tokens quantised once for all the matrices, and one pool run over
 * their row tasks laid end to end (as matmul_multi does for bf16), so q / k / v and gate / up
 * cost one quantisation and one barrier each, not one per matrix. Each output element is
 * ops_q8_matmul's: the same quantised row, the same tile. */
struct q8_multi_job {
    struct q8_job jobs[OPS_MULTI_MAX];
    int first[OPS_MULTI_MAX + 1];
    int count;
};

static void q8_multi_task(void *ctx, int begin, int end, int worker) {
    const struct q8_multi_job *mj = ctx;
    for (int i = 0; i < mj->count && begin < end; ++i) {
        const int lo = mj->first[i], hi = mj->first[i + 1];
        const int b = begin > lo ? begin : lo, e = end < hi ? end : hi;
        if (b < e) q8_task((void *)&mj->jobs[i], b - lo, e - lo, worker);
    }
}

/* Tokens are quantised into a stack buffer in chunks that fit it (at least one token, by
 * OPS_Q8_MAX_COLS), so the forward pass allocates nothing; each chunk is one pool run (or,
 * without a pool, runs on the calling thread). The chunking cannot change a result: each
 * output element depends on its row and token only. */
void ops_q8_matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count,
                         const float *x, int n, struct thread_pool *pool) {
    int same = count >= 1 && count <= OPS_MULTI_MAX;
    for (int i = 1; i < count && same; ++i)
        same = ws[i]->cols == ws[0]->cols;
    if (!same) {
        for (int i = 0; i < count; ++i)
            ops_q8_matmul_multi(&outs[i], &ws[i], 1, x, n, pool);
        return;
    }
    _Alignas(64) unsigned char buf[Q8_ACT_STACK_BYTES];
    const int K = ws[0]->cols;
    const size_t cols = ops_q8_ld(K), nb = cols / OPS_Q8_BLOCK;
    const int per_chunk = (int)(sizeof buf / (cols + nb * sizeof(float)));
    const enum ops_path path = ops_matmul_path();
    const struct q8_kernels *simd = NULL;
#if Q8_HAVE_X86
    if (path == OPS_PATH_AVX2 || path == OPS_PATH_AVX512)
        simd = path == OPS_PATH_AVX512 && ops_avx512_vnni_available() ? &q8_vnni : &q8_avx2;
#endif
    for (int t0 = 0; t0 < n; t0 += per_chunk) {
        const int c = n - t0 < per_chunk ? n - t0 : per_chunk;
        int8_t *qx = (int8_t *)buf;
        float *dx = (float *)(buf + (size_t)c * cols); /* ld % 32 == 0: aligned */
        for (int t = 0; t < c; ++t)
            ops_q8_quantize_row(qx + (size_t)t * cols, dx + (size_t)t * nb,
                                x + (size_t)(t0 + t) * (size_t)K, K);
        struct q8_multi_job mj = {.count = count};
        for (int i = 0; i < count; ++i) {
            mj.jobs[i] =
                (struct q8_job){outs[i] + (size_t)t0 * (size_t)ws[i]->rows, qx, dx, ws[i], c, simd};
            mj.first[i + 1] = mj.first[i] + (ws[i]->rows + Q8_ROWS_PER_TASK - 1) / Q8_ROWS_PER_TASK;
        }
        if (pool)
            thread_pool_run(pool, q8_multi_task, &mj, mj.first[count]);
        else
            q8_multi_task(&mj, 0, mj.first[count], 0);
    }
}

void ops_q8_matmul(float *out, const float *x, const struct ops_weight *w, int n,
                   struct thread_pool *pool) {
    ops_q8_matmul_multi(&out, &w, 1, x, n, pool);
}
