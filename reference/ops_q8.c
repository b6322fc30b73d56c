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

/* One weight row (q [nb*32], dw [nb]) times one quantised token (qx, dx): 16 lanes, block b
 * into lanes 8 (b % 2) + l (ops_q8.h). */
static float q8_dot_portable(const int8_t *q, const float *dw, const int8_t *qx, const float *dx,
                             int nb) {
    float acc[16] = {0};
    for (int b = 0; b < nb; ++b) {
        const int8_t *wb = q + (size_t)b * OPS_Q8_BLOCK, *xb = qx + (size_t)b * OPS_Q8_BLOCK;
        float d = dw[b] * dx[b], *a = acc + 8 * (b % 2);
        for (int l = 0; l < 8; ++l) {
            int32_t p = 0;
            for (int j = 0; j < 4; ++j)
                p += (int32_t)wb[4 * l + j] * (int32_t)xb[4 * l + j];
            a[l] = fmaf(d, (float)p, a[l]);
        }
    }
    float s[8];
    for (int l = 0; l < 8; ++l)
        s[l] = acc[l] + acc[8 + l];
    return fold8(s);
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

/* The lanes' sum: s = even + odd lanes, t[i] = s[i] + s[i+4]; (t0 + t2) + (t1 + t3). */
AVX2_TARGET static inline float fold16_avx2(__m256 even, __m256 odd) {
    __m256 s = _mm256_add_ps(even, odd);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

/* acc += d * p for block b of row q and token qx. */
#define Q8_STEP_AVX2(acc, q, dw, qx, dx, b)                                                        \
    acc = _mm256_fmadd_ps(_mm256_set1_ps((dw)[b] * (dx)[b]),                                       \
                          q8_block_avx2(load32((q) + 32 * (b)), load32((qx) + 32 * (b))), acc)

AVX2_TARGET static float q8_dot1_avx2(const int8_t *q, const float *dw, const int8_t *qx,
                                      const float *dx, int nb) {
    __m256 even = _mm256_setzero_ps(), odd = even;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        Q8_STEP_AVX2(even, q, dw, qx, dx, b);
        Q8_STEP_AVX2(odd, q, dw, qx, dx, b + 1);
    }
    if (b < nb) Q8_STEP_AVX2(even, q, dw, qx, dx, b);
    return fold16_avx2(even, odd);
}

#define Q8_ROWS4_STEP(E, b)                                                                        \
    do {                                                                                           \
        Q8_STEP_AVX2(a0##E, q0, d0, qx, dx, b);                                                    \
        Q8_STEP_AVX2(a1##E, q1, d1, qx, dx, b);                                                    \
        Q8_STEP_AVX2(a2##E, q2, d2, qx, dx, b);                                                    \
        Q8_STEP_AVX2(a3##E, q3, d3, qx, dx, b);                                                    \
    } while (0)

/* Four rows (q, q + ld, ...; scales dw, dw + ldd, ...) x one token; prefetches the next tile. */
AVX2_TARGET static void q8_rows4_avx2(float out[4], const int8_t *q, size_t ld, const float *dw,
                                      size_t ldd, const int8_t *qx, const float *dx, int nb) {
    const int8_t *q0 = q, *q1 = q + ld, *q2 = q + 2 * ld, *q3 = q + 3 * ld;
    const float *d0 = dw, *d1 = dw + ldd, *d2 = dw + 2 * ldd, *d3 = dw + 3 * ldd;
    const char *pf = (const char *)(q + 4 * ld);
    __m256 a0e = _mm256_setzero_ps(), a0o = a0e, a1e = a0e, a1o = a0e, a2e = a0e, a2o = a0e;
    __m256 a3e = a0e, a3o = a0e;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        for (int i = 0; i < 4; ++i)
            _mm_prefetch(pf + 64 * i, _MM_HINT_T0);
        pf += 8 * OPS_Q8_BLOCK;
        Q8_ROWS4_STEP(e, b);
        Q8_ROWS4_STEP(o, b + 1);
    }
    if (b < nb) Q8_ROWS4_STEP(e, b);
    out[0] = fold16_avx2(a0e, a0o);
    out[1] = fold16_avx2(a1e, a1o);
    out[2] = fold16_avx2(a2e, a2o);
    out[3] = fold16_avx2(a3e, a3o);
}

/* One row x four tokens (qx + t * ldx, dx + t * ldd): block b into acc[t][b % 2]. */
AVX2_TARGET static inline void q8_tok4_block_avx2(__m256 acc[4], const int8_t *q, const float *dw,
                                                  const int8_t *qx, size_t ldx, const float *dx,
                                                  size_t ldd, int b) {
    __m256i w = load32(q + 32 * b), aw = _mm256_sign_epi8(w, w);
    __m256i ones = _mm256_set1_epi16(1);
    for (int t = 0; t < 4; ++t) {
        __m256i xv = load32(qx + (size_t)t * ldx + 32 * b);
        __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
        __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[b] * dx[(size_t)t * ldd + b]), p, acc[t]);
    }
}

AVX2_TARGET static void q8_tok4_avx2(float out[4], const int8_t *q, const float *dw,
                                     const int8_t *qx, size_t ldx, const float *dx, size_t ldd,
                                     int nb) {
    __m256 even[4], odd[4];
    for (int t = 0; t < 4; ++t)
        even[t] = odd[t] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8_tok4_block_avx2(even, q, dw, qx, ldx, dx, ldd, b);
        q8_tok4_block_avx2(odd, q, dw, qx, ldx, dx, ldd, b + 1);
    }
    if (b < nb) q8_tok4_block_avx2(even, q, dw, qx, ldx, dx, ldd, b);
    for (int t = 0; t < 4; ++t)
        out[t] = fold16_avx2(even[t], odd[t]);
}

/* ---------------------------------------------------------------- AVX-512 VNNI kernels */

/* One zmm accumulator per output holds the 16 lanes: a pair of blocks (b even, b + 1) is one
 * vpdpbusd (unsigned x signed bytes, lane l of each 256-bit half the exact int32 sum over bytes
 * 4l..4l+3 of its block: the AVX2 kernel's integers), one conversion and one FMA with the
 * scales [d_b x 8, d_{b+1} x 8]. The sign moves onto the other operand as in AVX2: |a| x (b
 * negated where a < 0), with AVX-512BW masks (vpsignb has no zmm form). The scales of
 * Q8_CHUNK blocks are formed 16 at a time (each the same f32 product dw * dx) and spread with
 * a permute. An odd last block is a masked FMA on the low half. The lanes' sum is ops_q8.h's. */
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define Q8_CHUNK 16

VNNI_TARGET static inline __m512i load64(const int8_t *p) {
    return _mm512_loadu_si512((const void *)p);
}

/* Block b's 32 bytes in the low half, zeros above (b the odd last block). */
VNNI_TARGET static inline __m512i load_last(const int8_t *p) {
    return _mm512_maskz_loadu_epi8((__mmask64)0xffffffffu, p);
}

/* fold16_avx2 of a zmm's halves. */
VNNI_TARGET static inline float fold16_avx512(__m512 a) {
    return fold16_avx2(_mm512_castps512_ps256(a),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* |a| as unsigned bytes and b negated where a < 0: |a| * b' = a * b byte for byte. */
#define VNNI_DOT(ua, neg, b)                                                                       \
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), (ua),                                              \
                        _mm512_mask_sub_epi8((b), (neg), _mm512_setzero_si512(), (b)))

/* The scales d = dw[i] * dx[i] of the chunk's cn blocks (the rest 0). */
VNNI_TARGET static inline __m512 chunk_scales(const float *dw, const float *dx, int cn) {
    const __mmask16 m = (__mmask16)((1u << cn) - 1u);
    return _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dw), _mm512_maskz_loadu_ps(m, dx));
}

/* The permute index of pair i of a chunk: [i x 8, i + 1 x 8]. */
VNNI_TARGET static inline __m512i pair_index(int i) {
    return _mm512_add_epi32(_mm512_set1_epi32(i),
                            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
}

/* acc += scales (pair at idx) * p for a pair of blocks; for an odd last block, the low half. */
VNNI_TARGET static inline __m512 q8_pair_fma(__m512 acc, __m512 scales, __m512i idx, __m512i p) {
    return _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, scales), _mm512_cvtepi32_ps(p), acc);
}
VNNI_TARGET static inline __m512 q8_last_fma(__m512 acc, __m512 scales, int i, __m512i p) {
    return _mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(i), scales),
                                 _mm512_cvtepi32_ps(p), acc, (__mmask16)0x00ff);
}

VNNI_TARGET static float q8_dot1_vnni(const int8_t *q, const float *dw, const int8_t *qx,
                                      const float *dx, int nb) {
    __m512 acc = _mm512_setzero_ps();
    for (int c0 = 0; c0 < nb; c0 += Q8_CHUNK) {
        const int cn = nb - c0 < Q8_CHUNK ? nb - c0 : Q8_CHUNK;
        const __m512 sc = chunk_scales(dw + c0, dx + c0, cn);
        int i = 0;
        for (; i + 2 <= cn; i += 2) {
            const size_t o = (size_t)(c0 + i) * OPS_Q8_BLOCK;
            __m512i xv = load64(qx + o);
            __m512i p = VNNI_DOT(_mm512_abs_epi8(xv), _mm512_movepi8_mask(xv), load64(q + o));
            acc = q8_pair_fma(acc, sc, pair_index(i), p);
        }
        if (i < cn) {
            const size_t o = (size_t)(c0 + i) * OPS_Q8_BLOCK;
            __m512i xv = load_last(qx + o);
            __m512i p = VNNI_DOT(_mm512_abs_epi8(xv), _mm512_movepi8_mask(xv), load_last(q + o));
            acc = q8_last_fma(acc, sc, i, p);
        }
    }
    return fold16_avx512(acc);
}

/* Four rows x T tokens: T = 1 is the decode tile, T = 2..4 a decode step of a few requests and
 * prefill's token groups (they replaced a 1 x 4 tile whose rows did not stream: lm_head with 2
 * tokens 9.8 -> 4.4 ms, 1 token 4.5; 3072 x 1024 x 64 tokens 109 -> 121 GMAC/s). Each token's
 * |x| and sign mask are shared by the four rows, each row's scales by the tokens; the next four
 * rows are prefetched one tile ahead, and their scales too: the scales are a stream of their own
 * (after all the int8 rows), which the weights' prefetch does not cover (without it the chunk's
 * first permute waited on DRAM: 27.8 GB/s instead of 36 over Qwen3-0.6B's matrices). So the
 * weights stream from DRAM once for all the tokens. out[t * 4 + r]. */
#define DEFINE_Q8_R4TN_VNNI(T)                                                                     \
    VNNI_TARGET static void q8_r4t##T##_vnni(float *out, const int8_t *q, size_t ld,               \
                                             const float *dw, size_t ldd, const int8_t *qx,        \
                                             size_t ldx, const float *dx, size_t lddx, int nb) {   \
        const char *pf = (const char *)(q + 4 * ld);                                               \
        __m512 acc[T][4], sc[T][4];                                                                \
        _Pragma("GCC unroll 16") for (int i = 0; i < (T)*4; ++i) acc[i / 4][i % 4] =               \
            _mm512_setzero_ps();                                                                   \
        for (int c0 = 0; c0 < nb; c0 += Q8_CHUNK) {                                                \
            const int cn = nb - c0 < Q8_CHUNK ? nb - c0 : Q8_CHUNK;                                \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r)                                    \
                _mm_prefetch((const char *)(dw + (size_t)(r + 4) * ldd + c0), _MM_HINT_T0);        \
            _Pragma("GCC unroll 16") for (int i = 0; i < (T)*4; ++i) sc[i / 4][i % 4] =            \
                chunk_scales(dw + (size_t)(i % 4) * ldd + c0, dx + (size_t)(i / 4) * lddx + c0,    \
                             cn);                                                                  \
            int i = 0;                                                                             \
            for (; i + 2 <= cn; i += 2) {                                                          \
                const size_t o = (size_t)(c0 + i) * OPS_Q8_BLOCK;                                  \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k)                                \
                    _mm_prefetch(pf + 64 * k, _MM_HINT_T0);                                        \
                pf += 8 * OPS_Q8_BLOCK;                                                            \
                const __m512i idx = pair_index(i);                                                 \
                __m512i w[4];                                                                      \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) w[r] =                         \
                    load64(q + (size_t)r * ld + o);                                                \
                _Pragma("GCC unroll 4") for (int t = 0; t < (T); ++t) {                            \
                    __m512i xv = load64(qx + (size_t)t * ldx + o), ux = _mm512_abs_epi8(xv);       \
                    __mmask64 neg = _mm512_movepi8_mask(xv);                                       \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) acc[t][r] =                \
                        q8_pair_fma(acc[t][r], sc[t][r], idx, VNNI_DOT(ux, neg, w[r]));            \
                }                                                                                  \
            }                                                                                      \
            if (i < cn) {                                                                          \
                const size_t o = (size_t)(c0 + i) * OPS_Q8_BLOCK;                                  \
                _Pragma("GCC unroll 4") for (int t = 0; t < (T); ++t) {                            \
                    __m512i xv = load_last(qx + (size_t)t * ldx + o), ux = _mm512_abs_epi8(xv);    \
                    __mmask64 neg = _mm512_movepi8_mask(xv);                                       \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; ++r) acc[t][r] = q8_last_fma(   \
                        acc[t][r], sc[t][r], i, VNNI_DOT(ux, neg, load_last(q + r * ld + o)));     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int i = 0; i < (T)*4; ++i) out[i] =                          \
            fold16_avx512(acc[i / 4][i % 4]);                                                      \
    }
DEFINE_Q8_R4TN_VNNI(1)
DEFINE_Q8_R4TN_VNNI(2)
DEFINE_Q8_R4TN_VNNI(3)
DEFINE_Q8_R4TN_VNNI(4)

/* The decode tile (the rows4 slot of struct q8_kernels): 4 x 1. */
VNNI_TARGET static void q8_rows4_vnni(float out[4], const int8_t *q, size_t ld, const float *dw,
                                      size_t ldd, const int8_t *qx, const float *dx, int nb) {
    q8_r4t1_vnni(out, q, ld, dw, ldd, qx, 0, dx, 0, nb);
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
    /* [T], T = 2..4: 4 rows x T tokens for every n >= 2 (NULL: tok4 over each row, dot1 for
     * the tokens left; tok4 NULL where these are set) */
    void (*r4t[5])(float *out, const int8_t *q, size_t ld, const float *dw, size_t ldd,
                   const int8_t *qx, size_t ldx, const float *dx, size_t lddx, int nb);
};

#if Q8_HAVE_X86
static const struct q8_kernels q8_avx2 = {q8_dot1_avx2, q8_rows4_avx2, q8_tok4_avx2, {NULL}};
static const struct q8_kernels q8_vnni = {
    q8_dot1_vnni, q8_rows4_vnni, NULL, {NULL, NULL, q8_r4t2_vnni, q8_r4t3_vnni, q8_r4t4_vnni}};
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
/* n >= 2 tokens through the 4 x T tiles: rows in blocks of Q8_PREFILL_ROW_BLOCK, token groups of
 * equal size T <= 4 (the last group overlapping the one before), the last rows a tile
 * overlapping the one before (its repeated outputs are the same bits; dot1 where a task has
 * fewer than 4 rows). */
static void q8_rows_tiled(const struct q8_job *job, int r0, int r1) {
    const struct q8_kernels *kn = job->simd;
    const struct ops_weight *w = job->w;
    const int8_t *base = w->data;
    const size_t cols = ops_q8_ld(w->cols), nb = cols / OPS_Q8_BLOCK, rows = (size_t)w->rows;
    const int n = job->n, groups = (n + 3) / 4, T = (n + groups - 1) / groups;
    float tile[16];
    for (int rb = r0; rb < r1; rb += Q8_PREFILL_ROW_BLOCK) {
        const int re = r1 - rb < Q8_PREFILL_ROW_BLOCK ? r1 : rb + Q8_PREFILL_ROW_BLOCK;
        for (int t0 = 0; t0 < n; t0 += T) {
            const int t = t0 + T <= n ? t0 : n - T;
            int r = rb;
            for (; r < re && re - rb >= 4; r += 4) {
                if (r + 4 > re) r = re - 4;
                kn->r4t[T](tile, base + (size_t)r * cols, cols, ops_q8_scales(w) + (size_t)r * nb,
                           nb, job->qx + (size_t)t * cols, cols, job->dx + (size_t)t * nb, nb,
                           (int)nb);
                for (int i = 0; i < T; ++i)
                    for (int k = 0; k < 4; ++k)
                        job->out[(size_t)(t + i) * rows + (size_t)(r + k)] = tile[4 * i + k];
            }
            for (; r < re; ++r)
                for (int i = 0; i < T; ++i)
                    job->out[(size_t)(t + i) * rows + (size_t)r] = kn->dot1(
                        base + (size_t)r * cols, ops_q8_scales(w) + (size_t)r * nb,
                        job->qx + (size_t)(t + i) * cols, job->dx + (size_t)(t + i) * nb, (int)nb);
        }
    }
}

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
    if (kn->r4t[2]) {
        q8_rows_tiled(job, r0, r1);
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
