/* AVX2 and AVX-512 versions of attention's two inner loops (reference/ops.c), chosen with
 * matmul's path (ops_matmul_path: avx2 runs the AVX2 ones, avx512 both, the 16-wide first). Each
 * gives the portable loop's bits: the same fp32 multiplies and adds (never fused) in the same order
 * per output, only computed for several outputs at once. Private to reference/ops.c. */
#ifndef STRATA_REFERENCE_OPS_ATTENTION_SIMD_H
#define STRATA_REFERENCE_OPS_ATTENTION_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this build and CPU path run the AVX2 versions. */
int attn_simd_enabled(void);

/* scores[j] = (Σ_d q[d] * keys[j][d], ascending d) * scale for j < count, count a multiple of
 * 8 (keys j at keys + j * ld). */
void attn_scores_avx2(float *scores, const float *q, const float *keys, size_t ld, int count,
                      int d_len, float scale);

/* o[d] = Σ_j p[j] * values[j][d] over j = 0 .. count-1 in ascending order, from 0 (values j
 * at values + j * d_len). */
void attn_weighted_sum_avx2(float *o, const float *p, const float *values, int count, int d_len);

/* dst [n] = the f16 (half: 0) or bf16 (1) values src [n] widened to f32, exactly (a 16-bit KV
 * cache's block, read for attention): 8 at a time with F16C / AVX2 where the CPU has them. */
void attn_widen(float *dst, const uint16_t *src, size_t n, int bf16);

/* left[i] += right[i] for i < n (a merge of two nodes of attention's block tree): 8 or 16 at
 * a time where the AVX2 / AVX-512 versions run; each add is the scalar one. */
void attn_add(float *left, const float *right, int n);

/* 1 when the AVX-512 versions run (the avx512 matmul path). */
int attn_avx512_enabled(void);

/* attn_scores_avx2 16 keys per vector, for `heads` query heads over the same keys (one
 * transpose serves them all): scores[h][j] = (Σ_d q[h][d] * keys[j][d], ascending d) * scale
 * for j < count, count a multiple of 16. */
void attn_scores_avx512(float *const *scores, const float *const *q, int heads, const float *keys,
                        size_t ld, int count, int d_len, float scale);

/* attn_weighted_sum_avx2, 16 d's per vector. */
void attn_weighted_sum_avx512(float *o, const float *p, const float *values, int count, int d_len);

#endif
