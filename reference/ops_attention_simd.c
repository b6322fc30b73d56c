/* ops_attention_simd.h: attention's scores and weighted sums on AVX2 and AVX-512, bit for bit
 * the portable loops of reference/ops_attention.c.
 *
 * Scores: a score is a chain of fmaf over d, so the vector runs across keys instead: 8 keys'
 * rows are transposed 8 columns at a time (lane i of column t = key i's element d + t) and
 * each lane performs fma(q[d], k[d], s) in ascending d, exactly the scalar chain of its key.
 * Two groups of 8 keys interleave so that their chains overlap (one chain is latency bound).
 * Weighted sums: independent per d, so lanes are d's and the loop over j keeps its order.
 * A vector FMA rounds once per lane, as fmaf does; nothing else is fused. */
#include "reference/ops_attention_simd.h"

#include <math.h>

#include "reference/ops.h"
#include "runtime/base/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>

#define AVX2_TARGET __attribute__((target("avx2,fma")))

int attn_simd_enabled(void) {
    const enum ops_path p = ops_matmul_path();
    return p == OPS_PATH_AVX2 || p == OPS_PATH_AVX512;
}

/* Widening is exact either way (F16C's half -> single is IEEE's; bf16 is the top half of
 * the f32 bits), so the vector path gives the scalar path's values. */
__attribute__((target("avx2,f16c"))) static void widen_avx2(float *dst, const uint16_t *src,
                                                            size_t n, int bf16) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        const __m256 f = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                              : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + i, f);
    }
    for (; i < n; ++i)
        dst[i] = bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
}

/* CPUID leaf 1 rather than __builtin_cpu_supports: clang does not know the "f16c" feature
 * name there. Detected once per process (pthread_once: stages in threads of one process may
 * widen their first block at the same time). */
static int cached_f16c;
static pthread_once_t f16c_once = PTHREAD_ONCE_INIT;

static void detect_f16c(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    cached_f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

void attn_widen(float *dst, const uint16_t *src, size_t n, int bf16) {
    pthread_once(&f16c_once, detect_f16c);
    /* attn_simd_enabled implies AVX2 is there and chosen. */
    if (cached_f16c && attn_simd_enabled()) {
        widen_avx2(dst, src, n, bf16);
        return;
    }
    for (size_t i = 0; i < n; ++i)
        dst[i] = bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
}

AVX2_TARGET static void add_avx2(float *left, const float *right, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(left + i,
                         _mm256_add_ps(_mm256_loadu_ps(left + i), _mm256_loadu_ps(right + i)));
    for (; i < n; ++i)
        left[i] += right[i];
}

__attribute__((target("avx512f,avx2"))) static void add_avx512(float *left, const float *right,
                                                               int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(left + i,
                         _mm512_add_ps(_mm512_loadu_ps(left + i), _mm512_loadu_ps(right + i)));
    add_avx2(left + i, right + i, n - i);
}

void attn_add(float *left, const float *right, int n) {
    if (attn_avx512_enabled()) {
        add_avx512(left, right, n);
    } else if (attn_simd_enabled()) {
        add_avx2(left, right, n);
    } else {
        for (int i = 0; i < n; ++i)
            left[i] += right[i];
    }
}

/* c[t] lane i = r[i] lane t. */
AVX2_TARGET static inline void transpose8(__m256 c[8], const __m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* s = fma(q[d + t], c[t], s) for t = 0 .. 7, in order. */
AVX2_TARGET static inline __m256 add_columns(__m256 s, const float *q, const __m256 c[8]) {
    for (int t = 0; t < 8; ++t)
        s = _mm256_fmadd_ps(_mm256_set1_ps(q[t]), c[t], s);
    return s;
}

AVX2_TARGET static inline void load_rows(__m256 r[8], const float *k, size_t ld, int d) {
    for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(k + (size_t)i * ld + (size_t)d);
}

/* Key i's element d for i = 0 .. 7 (the d_len % 8 tail). */
AVX2_TARGET static inline __m256 column(const float *k, size_t ld, int d) {
    return _mm256_set_ps(k[7 * ld + (size_t)d], k[6 * ld + (size_t)d], k[5 * ld + (size_t)d],
                         k[4 * ld + (size_t)d], k[3 * ld + (size_t)d], k[2 * ld + (size_t)d],
                         k[ld + (size_t)d], k[(size_t)d]);
}

AVX2_TARGET void attn_scores_avx2(float *scores, const float *q, const float *keys, size_t ld,
                                  int count, int d_len, float scale) {
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 r[8], c[8];
    int j = 0;
    for (; j + 16 <= count; j += 16) {
        const float *ka = keys + (size_t)j * ld, *kb = ka + 8 * ld;
        __m256 sa = _mm256_setzero_ps(), sb = _mm256_setzero_ps();
        int d = 0;
        for (; d + 8 <= d_len; d += 8) {
            if (d % 16 == 0) /* the next 16 keys' line at d: see scores16 below */
                for (int i = 0; i < 16; ++i)
                    _mm_prefetch((const char *)(ka + (size_t)(16 + i) * ld + (size_t)d),
                                 _MM_HINT_T0);
            load_rows(r, ka, ld, d);
            transpose8(c, r);
            sa = add_columns(sa, q + d, c);
            load_rows(r, kb, ld, d);
            transpose8(c, r);
            sb = add_columns(sb, q + d, c);
        }
        for (; d < d_len; ++d) {
            const __m256 qd = _mm256_set1_ps(q[d]);
            sa = _mm256_fmadd_ps(qd, column(ka, ld, d), sa);
            sb = _mm256_fmadd_ps(qd, column(kb, ld, d), sb);
        }
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sa, vscale));
        _mm256_storeu_ps(scores + j + 8, _mm256_mul_ps(sb, vscale));
    }
    for (; j + 8 <= count; j += 8) {
        const float *ka = keys + (size_t)j * ld;
        __m256 sa = _mm256_setzero_ps();
        int d = 0;
        for (; d + 8 <= d_len; d += 8) {
            load_rows(r, ka, ld, d);
            transpose8(c, r);
            sa = add_columns(sa, q + d, c);
        }
        for (; d < d_len; ++d)
            sa = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), column(ka, ld, d), sa);
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sa, vscale));
    }
}

/* ops_expf (reference/ops_exp.c) on 4 lanes of double: the same operations, one per lane.
 * AVX2 has no 64-bit arithmetic shift: k is taken as 32-bit lanes (the low half of each
 * shifted value's bits) and sign-extended after its shift. */
AVX2_TARGET static inline __m256d exp4_avx2(__m128 x) {
    const __m128 c = _mm_min_ps(_mm_set1_ps(OPS_EXP_HI), _mm_max_ps(_mm_set1_ps(OPS_EXP_LO), x));
    const __m256d z = _mm256_mul_pd(_mm256_cvtps_pd(c), _mm256_set1_pd(OPS_EXP_INV_LN2_32));
    const __m256d shifted = _mm256_add_pd(z, _mm256_set1_pd(OPS_EXP_SHIFT));
    const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(shifted, _mm256_set1_pd(OPS_EXP_SHIFT)));
    const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(shifted),
                                                   _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    const __m128i k = _mm256_castsi256_si128(lo);
    const __m256i t = _mm256_i32gather_epi64((const long long *)(const void *)ops_exp_table,
                                             _mm_and_si128(k, _mm_set1_epi32(31)), 8);
    const __m256i e = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_srai_epi32(k, 5)), 52);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, e));
    __m256d p = _mm256_mul_pd(r, _mm256_set1_pd(OPS_EXP_A4));
    p = _mm256_mul_pd(_mm256_add_pd(p, _mm256_set1_pd(OPS_EXP_A3)), r);
    p = _mm256_mul_pd(_mm256_add_pd(p, _mm256_set1_pd(OPS_EXP_A2)), r);
    p = _mm256_mul_pd(_mm256_add_pd(p, _mm256_set1_pd(OPS_EXP_A1)), r);
    p = _mm256_add_pd(p, _mm256_set1_pd(1.0));
    return _mm256_mul_pd(s, p);
}

AVX2_TARGET void attn_exp8_avx2(float *dst, const float *src) {
    _mm_storeu_ps(dst, _mm256_cvtpd_ps(exp4_avx2(_mm_loadu_ps(src))));
    _mm_storeu_ps(dst + 4, _mm256_cvtpd_ps(exp4_avx2(_mm_loadu_ps(src + 4))));
}

/* Eight accumulators (64 d's) per pass over the j's: eight add chains hide the add latency.
 * Values j at values + j * ld (d_len <= ld: the AVX-512 version hands its last d's over). */
AVX2_TARGET static void weighted_sum_avx2(float *o, const float *p, const float *values, int count,
                                          int d_len, size_t ld) {
    int d = 0;
    for (; d + 64 <= d_len; d += 64) {
        __m256 a[8];
        for (int i = 0; i < 8; ++i)
            a[i] = _mm256_setzero_ps();
        for (int j = 0; j < count; ++j) {
            const float *v = values + (size_t)j * ld + (size_t)d;
            const __m256 pj = _mm256_set1_ps(p[j]);
            for (int i = 0; i < 8; ++i)
                a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * i), a[i]);
        }
        for (int i = 0; i < 8; ++i)
            _mm256_storeu_ps(o + d + 8 * i, a[i]);
    }
    for (; d + 8 <= d_len; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int j = 0; j < count; ++j)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                                _mm256_loadu_ps(values + (size_t)j * ld + (size_t)d), a);
        _mm256_storeu_ps(o + d, a);
    }
    for (; d < d_len; ++d) {
        float a = 0.0f;
        for (int j = 0; j < count; ++j)
            a = fmaf(p[j], values[(size_t)j * ld + (size_t)d], a);
        o[d] = a;
    }
}

AVX2_TARGET void attn_weighted_sum_avx2(float *o, const float *p, const float *values, int count,
                                        int d_len) {
    weighted_sum_avx2(o, p, values, count, d_len, (size_t)d_len);
}

/* ---------------------------------------------------------------- AVX-512F */
/* The same loops 16 wide: 16 keys per vector for the scores (16 x 16 transposes), and 16 d's
 * per vector for the weighted sums. One transpose serves every query head of a GQA group
 * (up to ATTN512_HEADS at a time): each head's scores are its own chains, in ascending d. */
#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#define ATTN512_HEADS 8

int attn_avx512_enabled(void) {
    return ops_matmul_path() == OPS_PATH_AVX512;
}

/* ops_expf (reference/ops_exp.c) on 8 lanes of double: the same operations, one per lane. */
AVX512_TARGET static inline __m256 exp8_avx512(__m256 x) {
    const __m256 c =
        _mm256_min_ps(_mm256_set1_ps(OPS_EXP_HI), _mm256_max_ps(_mm256_set1_ps(OPS_EXP_LO), x));
    const __m512d z = _mm512_mul_pd(_mm512_cvtps_pd(c), _mm512_set1_pd(OPS_EXP_INV_LN2_32));
    const __m512d shifted = _mm512_add_pd(z, _mm512_set1_pd(OPS_EXP_SHIFT));
    const __m512d r = _mm512_sub_pd(z, _mm512_sub_pd(shifted, _mm512_set1_pd(OPS_EXP_SHIFT)));
    /* k: the low 32 bits of shifted's bits, sign-extended */
    const __m512i k = _mm512_srai_epi64(_mm512_slli_epi64(_mm512_castpd_si512(shifted), 32), 32);
    const __m512i t = _mm512_i64gather_epi64(_mm512_and_si512(k, _mm512_set1_epi64(31)),
                                             (const void *)ops_exp_table, 8);
    const __m512d s =
        _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(_mm512_srai_epi64(k, 5), 52)));
    __m512d p = _mm512_mul_pd(r, _mm512_set1_pd(OPS_EXP_A4));
    p = _mm512_mul_pd(_mm512_add_pd(p, _mm512_set1_pd(OPS_EXP_A3)), r);
    p = _mm512_mul_pd(_mm512_add_pd(p, _mm512_set1_pd(OPS_EXP_A2)), r);
    p = _mm512_mul_pd(_mm512_add_pd(p, _mm512_set1_pd(OPS_EXP_A1)), r);
    p = _mm512_add_pd(p, _mm512_set1_pd(1.0));
    return _mm512_cvtpd_ps(_mm512_mul_pd(s, p));
}

AVX512_TARGET void attn_exp16_avx512(float *dst, const float *src) {
    _mm256_storeu_ps(dst, exp8_avx512(_mm256_loadu_ps(src)));
    _mm256_storeu_ps(dst + 8, exp8_avx512(_mm256_loadu_ps(src + 8)));
}

/* c[t] lane i = r[i] lane t, for 16 x 16. */
AVX512_TARGET static inline void transpose16(__m512 c[16], const __m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* lanes per 128-bit part: rows i..i+3, one column each */
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[4g + m], 128-bit part p: rows 4g..4g+3 of column 4p + m. Gather the parts. */
    for (int m = 0; m < 4; ++m) {
        __m512 a = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88); /* parts 0, 2 of g = 0, 1 */
        __m512 b = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd); /* parts 1, 3 */
        __m512 e = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
        __m512 f = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
        c[m] = _mm512_shuffle_f32x4(a, e, 0x88);      /* column m: part 0 of g = 0..3 */
        c[8 + m] = _mm512_shuffle_f32x4(a, e, 0xdd);  /* column 8 + m */
        c[4 + m] = _mm512_shuffle_f32x4(b, f, 0x88);  /* column 4 + m */
        c[12 + m] = _mm512_shuffle_f32x4(b, f, 0xdd); /* column 12 + m */
    }
}

/* Key i's element d for i = 0 .. 15 (the d_len % 16 tail). */
AVX512_TARGET static inline __m512 column16(const float *k, size_t ld, int d) {
    float v[16];
    for (int i = 0; i < 16; ++i)
        v[i] = k[(size_t)i * ld + (size_t)d];
    return _mm512_loadu_ps(v);
}

AVX512_TARGET static void scores16(float *const *scores, const float *const *q, int heads,
                                   const float *k, size_t ld, int j, int d_len, __m512 vscale) {
    __m512 s[ATTN512_HEADS], r[16], c[16];
    for (int h = 0; h < heads; ++h)
        s[h] = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= d_len; d += 16) {
        for (int i = 0; i < 16; ++i) {
            /* The next 16 keys' line at this d (past the keys asked for too: a prefetch never
             * faults). The KV cache comes from DRAM (a layer's weights evict it), and 16
             * strided rows defeat the hardware prefetcher: without this, two thirds of the
             * scores' time was the wait on these loads. */
            _mm_prefetch((const char *)(k + (size_t)(16 + i) * ld + (size_t)d), _MM_HINT_T0);
            r[i] = _mm512_loadu_ps(k + (size_t)i * ld + (size_t)d);
        }
        transpose16(c, r);
        for (int h = 0; h < heads; ++h)
            for (int t = 0; t < 16; ++t)
                s[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d + t]), c[t], s[h]);
    }
    for (; d < d_len; ++d) {
        const __m512 col = column16(k, ld, d);
        for (int h = 0; h < heads; ++h)
            s[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h][d]), col, s[h]);
    }
    for (int h = 0; h < heads; ++h)
        _mm512_storeu_ps(scores[h] + j, _mm512_mul_ps(s[h], vscale));
}

AVX512_TARGET void attn_scores_avx512(float *const *scores, const float *const *q, int heads,
                                      const float *keys, size_t ld, int count, int d_len,
                                      float scale) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int h0 = 0; h0 < heads; h0 += ATTN512_HEADS) {
        const int hn = heads - h0 < ATTN512_HEADS ? heads - h0 : ATTN512_HEADS;
        for (int j = 0; j + 16 <= count; j += 16)
            scores16(scores + h0, q + h0, hn, keys + (size_t)j * ld, ld, j, d_len, vscale);
    }
}

/* Eight accumulators (128 d's) per pass over the j's, as attn_weighted_sum_avx2's eight. */
AVX512_TARGET void attn_weighted_sum_avx512(float *o, const float *p, const float *values,
                                            int count, int d_len) {
    int d = 0;
    for (; d + 128 <= d_len; d += 128) {
        __m512 a[8];
        for (int i = 0; i < 8; ++i)
            a[i] = _mm512_setzero_ps();
        for (int j = 0; j < count; ++j) {
            const float *v = values + (size_t)j * (size_t)d_len + (size_t)d;
            const __m512 pj = _mm512_set1_ps(p[j]);
            for (int i = 0; i < 8; ++i)
                a[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * i), a[i]);
        }
        for (int i = 0; i < 8; ++i)
            _mm512_storeu_ps(o + d + 16 * i, a[i]);
    }
    if (d < d_len) /* the rest: the AVX2 loops, the same per-d chains */
        weighted_sum_avx2(o + d, p, values + d, count, d_len - d, (size_t)d_len);
}

#else
int attn_avx512_enabled(void) {
    return 0;
}
void attn_exp16_avx512(float *dst, const float *src) {
    for (int i = 0; i < 16; ++i)
        dst[i] = ops_expf(src[i]);
}
void attn_exp8_avx2(float *dst, const float *src) {
    for (int i = 0; i < 8; ++i)
        dst[i] = ops_expf(src[i]);
}
void attn_scores_avx512(float *const *scores, const float *const *q, int heads, const float *keys,
                        size_t ld, int count, int d_len, float scale) {
    (void)scores, (void)q, (void)heads, (void)keys, (void)ld, (void)count, (void)d_len, (void)scale;
}
void attn_weighted_sum_avx512(float *o, const float *p, const float *values, int count, int d_len) {
    (void)o, (void)p, (void)values, (void)count, (void)d_len;
}
void attn_widen(float *dst, const uint16_t *src, size_t n, int bf16) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = bf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
}
void attn_add(float *left, const float *right, int n) {
    for (int i = 0; i < n; ++i)
        left[i] += right[i];
}
int attn_simd_enabled(void) {
    return 0;
}
void attn_scores_avx2(float *scores, const float *q, const float *keys, size_t ld, int count,
                      int d_len, float scale) {
    (void)scores, (void)q, (void)keys, (void)ld, (void)count, (void)d_len, (void)scale;
}
void attn_weighted_sum_avx2(float *o, const float *p, const float *values, int count, int d_len) {
    (void)o, (void)p, (void)values, (void)count, (void)d_len;
}
#endif
