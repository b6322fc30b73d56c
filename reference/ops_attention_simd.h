/* AVX2 versions of attention's two inner loops (reference/ops.c), chosen with matmul's path
 * (ops_matmul_path: avx2 and avx512 run them). Each gives the portable loop's bits: the same
 * fp32 multiplies and adds (never fused) in the same order per output, only computed for
 * several outputs at once. Private to reference/ops.c. */
#ifndef STRATA_REFERENCE_OPS_ATTENTION_SIMD_H
#define STRATA_REFERENCE_OPS_ATTENTION_SIMD_H

#include <stddef.h>

/* 1 when this build and CPU path run the AVX2 versions. */
int attn_simd_enabled(void);

/* scores[j] = (Σ_d q[d] * keys[j][d], ascending d) * scale for j < count, count a multiple of
 * 8 (keys j at keys + j * ld). */
void attn_scores_avx2(float *scores, const float *q, const float *keys, size_t ld, int count,
                      int d_len, float scale);

/* o[d] = Σ_j p[j] * values[j][d] over j = 0 .. count-1 in ascending order, from 0 (values j
 * at values + j * d_len). */
void attn_weighted_sum_avx2(float *o, const float *p, const float *values, int count, int d_len);

#endif
