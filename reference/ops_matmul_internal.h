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
