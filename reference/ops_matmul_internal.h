/* Private to reference/ops_matmul.c and ops_matmul_prefill.c: the matmul job, the leaf tree, and
 * the SIMD helpers both files' kernels share (the arithmetic they implement: reference/ops.h). */
#ifndef STRATA_REFERENCE_OPS_MATMUL_INTERNAL_H
#define STRATA_REFERENCE_OPS_MATMUL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "reference/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OPS_HAVE_X86 1
#else
#define OPS_HAVE_X86 0
#endif

struct matmul_job {
    float *out;
    const float *x;
    const struct ops_weight *w;
    int n;
    int leaves; /* 1: plain dot products; else matmul_split's leaf tree */
    enum ops_path path;
};

/* Leaf j of `leaves` over K columns: [leaf_start(j), leaf_start(j + 1)). */
static inline int leaf_start(int j, int leaves, int k_len) {
    return (int)((int64_t)j * k_len / leaves);
}

/* The balanced binary tree over v[0..count) (count a power of two), pairs of neighbours
 * first: ((v0 + v1) + (v2 + v3)) + ... Overwrites v. */
static inline float tree_sum(float *v, int count) {
    for (; count > 1; count /= 2)
        for (int i = 0; i < count / 2; ++i)
            v[i] = v[2 * i] + v[2 * i + 1];
    return v[0];
}

#if OPS_HAVE_X86
#define WIDEN_BF16(v) bf16_to_f32(v)
#define WIDEN_F32(v) (v)

#define AVX2_TARGET __attribute__((target("avx2,fma")))

AVX2_TARGET static inline __m256 load8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_TARGET static inline __m256 load8_f32(const float *p) {
    return _mm256_loadu_ps(p);
}

/* s = a0 + a1; t[i] = s[i] + s[i+4]; r = (t0 + t2) + (t1 + t3). */
AVX2_TARGET static inline float fold_avx(__m256 a0, __m256 a1) {
    __m256 s = _mm256_add_ps(a0, a1);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* [t0+t2, t1+t3, ..] */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))

AVX512_TARGET static inline __m512 load16_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512_TARGET static inline __m512 load16_f32(const float *p) {
    return _mm512_loadu_ps(p);
}

/* The low half is a0, the high half a1: the same adds as fold_avx(a0, a1). */
AVX512_TARGET static inline float fold_avx512(__m512 a) {
    __m256 a0 = _mm512_castps512_ps256(a);
    __m256 a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 s = _mm256_add_ps(a0, a1);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

/* fold_avx512 of 16 accumulators at once, each lane of the result one of them, bit for bit: the
 * same adds in the same tree, several accumulators per instruction (IEEE addition is
 * commutative, so which operand of an add is which changes nothing): lo + hi halves, then the
 * 128-bit quarters, then lanes (0, 2) and (1, 3), then the two sums. Lane 4k + e of the result
 * is accumulator 4e + k (fold16_order_avx512 puts them in order). */
AVX512_TARGET static inline __m512 fold_pair_avx512(__m512 a, __m512 b) { /* s_a | s_b */
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
AVX512_TARGET static inline __m512 fold_quad_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = fold_pair_avx512(a, b), cd = fold_pair_avx512(c, d); /* then t_a..t_d */
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}
AVX512_TARGET static inline __m512 fold16_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3,
                                                 __m512 a4, __m512 a5, __m512 a6, __m512 a7,
                                                 __m512 a8, __m512 a9, __m512 a10, __m512 a11,
                                                 __m512 a12, __m512 a13, __m512 a14, __m512 a15) {
    __m512 t0 = fold_quad_avx512(a0, a1, a2, a3), t1 = fold_quad_avx512(a4, a5, a6, a7);
    __m512 t2 = fold_quad_avx512(a8, a9, a10, a11), t3 = fold_quad_avx512(a12, a13, a14, a15);
    __m512 u0 = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 u1 = _mm512_add_ps(_mm512_shuffle_ps(t2, t3, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(t2, t3, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}
/* out[j] = lane order[j] of a fold16_avx512 result: accumulator j's fold. */
AVX512_TARGET static inline __m512i fold16_order_avx512(void) {
    return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

/* Prefetches the `bytes` the next tile will read at this step (pf advances by `bytes`), with
 * hint T0 (AVX2, measured on Zen 3) or NTA (AVX-512: on Zen 5 the decode pass over Qwen3-0.6B's
 * matrices streamed 41-42 GB/s with T0 and 43 with NTA at 1 thread, 50 and 52 at 2; a weight
 * is read once per token, so keeping it out of the outer caches costs nothing). */
#define PREFETCH_STEP_HINT(pf, bytes, hint)                                                        \
    do {                                                                                           \
        for (int pb_ = 0; pb_ < (bytes); pb_ += 64)                                                \
            _mm_prefetch((pf) + pb_, hint);                                                        \
        (pf) += (bytes);                                                                           \
    } while (0)
#define PREFETCH_STEP(pf, bytes) PREFETCH_STEP_HINT(pf, bytes, _MM_HINT_T0)

/* The 1 row x 1 token kernels (ops_matmul.c), also the prefill tiles' leftovers. */
float avx2_dot1_bf16(const uint16_t *w, const float *x, int k_len);
float avx2_dot1_f32(const float *w, const float *x, int k_len);
float avx512_dot1_bf16(const uint16_t *w, const float *x, int k_len);
float avx512_dot1_f32(const float *w, const float *x, int k_len);

/* Rows [r0, r1) of a prefill job through the path's register tiles (ops_matmul_prefill.c);
 * returns 0, having done nothing, where they do not take the job (too few tokens, too wide a
 * row, a path without tiles). */
int matmul_prefill_tiled(const struct matmul_job *job, int r0, int r1);
#endif

#endif
