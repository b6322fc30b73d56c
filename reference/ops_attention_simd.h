/* AVX2 and AVX-512 versions of attention's two inner loops (reference/ops_attention.c), chosen with
 * matmul's path (ops_matmul_path: avx2 runs the AVX2 ones, avx512 both, the 16-wide first). Each
 * gives the portable loop's bits: the same fp32 multiplies and adds (never fused) in the same order
 * per output, only computed for several outputs at once. Private to reference/ops_attention.c. */
#ifndef STRATA_REFERENCE_OPS_ATTENTION_SIMD_H
#define STRATA_REFERENCE_OPS_ATTENTION_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/op_contract.h"

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

/* The first m rows (d_len each) of block b of kv head g, keys (values: 1) as floats: the
 * cache's own for OPS_F32, else widened (exactly) into tmp [OPS_ATTN_BLOCK * d_len]. */
static inline const float *attn_kv_rows(const struct ops_kv *kv, int values, int g, int b, int m,
                                        int d_len, float *tmp) {
    const size_t at = (size_t)kv->blocks[b] * kv->block_stride + (size_t)g * kv->head_stride;
    const void *base = values ? kv->v : kv->k;
    if (kv->dtype == OPS_F32) return (const float *)base + at;
    attn_widen(tmp, (const uint16_t *)base + at, (size_t)m * (size_t)d_len, kv->dtype == OPS_BF16);
    return tmp;
}

/* ops_expf's constants (reference/ops_exp.c): the table 2^(i/32), the clamp, 32/ln2, the
 * rounding shift 1.5 * 2^52 and the Taylor coefficients (ln2/32)^n / n!. */
extern const double ops_exp_table[32];
#define OPS_EXP_LO (-200.0f)
#define OPS_EXP_HI 200.0f
#define OPS_EXP_INV_LN2_32 0x1.71547652b82fep+5
#define OPS_EXP_SHIFT 0x1.8p52
#define OPS_EXP_A1 0x1.62e42fefa39efp-6
#define OPS_EXP_A2 0x1.ebfbdff82c58fp-13
#define OPS_EXP_A3 0x1.c6b08d704a0c0p-20
#define OPS_EXP_A4 0x1.3b2ab6fba4e77p-27

/* dst[i] = ops_expf(src[i]) for i < 16 (AVX-512) or 8 (AVX2), the same operations in vector
 * lanes. */
void attn_exp16_avx512(float *dst, const float *src);
void attn_exp8_avx2(float *dst, const float *src);

/* Floats of attn_lanes_avx512's scratch for keys [0, ctx). */
size_t attn_lanes_scratch_floats(int ctx, int d_len);

/* One GQA tile's attention with its nq <= 16 (AVX-512) or 8 (AVX2) query vectors as the
 * lanes of a vector (ops_attention_lanes.c): out[x] [d_len] = attention of q[x] [d_len] over
 * positions [0, ctx_len[x]) of kv head g, the bits of attention_group_task. scratch
 * [attn_lanes_scratch_floats(max ctx_len, d_len)]. On the path that has the instructions
 * (attn_avx512_enabled, attn_simd_enabled). */
void attn_lanes_avx512(float *const *out, const float *const *q, const int *ctx_len, int nq,
                       const struct ops_kv *kv, int g, int d_len, float scale, float *scratch);
void attn_lanes_avx2(float *const *out, const float *const *q, const int *ctx_len, int nq,
                     const struct ops_kv *kv, int g, int d_len, float scale, float *scratch);

#endif
