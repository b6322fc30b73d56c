/* ops_attention_simd.h: a prefill tile's attention with its queries as the lanes of a vector
 * (16 on AVX-512, 8 on AVX2; the loops are ops_attention_lanes.inc, once per width), bit for
 * bit attention_group_task of reference/ops_attention.c.
 *
 * The key-lane loops (ops_attention_simd.c) need each block of keys transposed (d-major) for
 * every query vector that reads it, and a tile of 8 queries spent a third of the scores' time
 * on shuffles. Here lane x is query x: a score s[j] (lanes: queries) fmas Qt[d] * k_j[d] in
 * ascending d, with k_j[d] one broadcast scalar and Qt the tile's queries transposed once per
 * tile; a weighted sum o[d] (lanes: queries) fmas P[j] * v_j[d] in ascending j. Every lane
 * performs exactly its query's scalar chain (fmaf after fmaf), so nothing changes but how
 * many queries one instruction serves.
 *
 * The queries of a tile end at different positions (causal): each score runs to the tile's
 * last position (an earlier query's extra scores go unused, as in the key-lane loops), and a
 * key past a query's end is masked out of its max, its exps' sum and its weighted sums
 * (masked FMAs and adds keep the lane's old value: not even a +0 reaches it). The block tree is one
 * binary counter for all lanes; a query whose last block was just pushed folds the counter
 * (without consuming it) into its result, as tree_finish would have at that point. */
#include "reference/ops_attention_simd.h"

#include <math.h>
#include <string.h>

#include "reference/ops.h"

#define LANES 16 /* the widest: scratch is sized for it */
_Static_assert(OPS_ATTN_BLOCK == 16, "a block count is one shift by 4");
#define DEPTH 32 /* the block tree's binary counter: 2^32 blocks */

size_t attn_lanes_scratch_floats(int ctx, int d_len) {
    const size_t c = ctx > 0 ? (size_t)ctx : 0, d = d_len > 0 ? (size_t)d_len : 0;
    /* Qt [d][16], S [ctx][16], the counter's entries and the results [DEPTH + 1][d + 1][16],
     * P [16][16]. */
    return LANES * (d + c + (DEPTH + 1) * (d + 1) + OPS_ATTN_BLOCK);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* Rows [0, m) of block b of kv head g (keys; values: 1) as floats, in tmp [16][d_len] where
 * the block is partial or 16-bit (rows past m zero: all 16 rows are always read). */
static const float *block_rows(const struct ops_kv *kv, int values, int g, int b, int m, int d_len,
                               float *tmp) {
    const float *rows = attn_kv_rows(kv, values, g, b, m, d_len, tmp);
    if (m == OPS_ATTN_BLOCK) return rows;
    if (rows != tmp) memcpy(tmp, rows, (size_t)m * (size_t)d_len * sizeof(float));
    memset(tmp + (size_t)m * (size_t)d_len, 0,
           (size_t)(OPS_ATTN_BLOCK - m) * (size_t)d_len * sizeof(float));
    return tmp;
}

/* Named accumulators: an array of vectors indexed in a loop spills. */
#define ACC8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ACC16(X) ACC8(X) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* ---- AVX-512: 16 lanes, masks in mask registers, 16 accumulators (of 32 registers) */
#define LN 16
#define NACC 16
#define ACC ACC16
#define TGT __attribute__((target("avx512f,avx2,fma")))
#define NAME(f) f##_avx512
#define V __m512
#define VI __m512i
#define M __mmask16
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps(p, x)
#define V_SET1(f) _mm512_set1_ps(f)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MASK_FMA(a, b, c, m) _mm512_mask3_fmadd_ps(a, b, c, m)
#define V_MASK_ADD(acc, m, x) _mm512_mask_add_ps(acc, m, acc, x)
#define V_MASK_MOV(old, m, x) _mm512_mask_mov_ps(old, m, x)
#define V_EXP(dst, src) attn_exp16_avx512(dst, src)
#define VI_LOAD(p) _mm512_loadu_si512(p)
#define M_LEN_GT(vlen, j) _mm512_cmpgt_epi32_mask(vlen, _mm512_set1_epi32(j))
#define M_GT(in, a, b) _mm512_mask_cmp_ps_mask(in, a, b, _CMP_GT_OQ)
#define M_BLOCKS_EQ(vlen, nb)                                                                      \
    _mm512_cmpeq_epi32_mask(                                                                       \
        _mm512_srli_epi32(_mm512_add_epi32(vlen, _mm512_set1_epi32(OPS_ATTN_BLOCK - 1)), 4),       \
        _mm512_set1_epi32(nb))
#define M_ANY(m) ((m) != 0)
#include "reference/ops_attention_lanes.inc"
#undef LN
#undef NACC
#undef ACC
#undef TGT
#undef NAME
#undef V
#undef VI
#undef M
#undef V_ZERO
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_FMA
#undef V_ADD
#undef V_SUB
#undef V_MUL
#undef V_DIV
#undef V_MASK_FMA
#undef V_MASK_ADD
#undef V_MASK_MOV
#undef V_EXP
#undef VI_LOAD
#undef M_LEN_GT
#undef M_GT
#undef M_BLOCKS_EQ
#undef M_ANY

/* ---- AVX2: 8 lanes, masks as all-ones lanes applied by blends, 8 accumulators (of 16) */
#define LN 8
#define NACC 8
#define ACC ACC8
#define TGT __attribute__((target("avx2,fma")))
#define NAME(f) f##_avx2
#define V __m256
#define VI __m256i
#define M __m256
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, x) _mm256_storeu_ps(p, x)
#define V_SET1(f) _mm256_set1_ps(f)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MASK_FMA(a, b, c, m) _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), m)
#define V_MASK_ADD(acc, m, x) _mm256_blendv_ps(acc, _mm256_add_ps(acc, x), m)
#define V_MASK_MOV(old, m, x) _mm256_blendv_ps(old, x, m)
#define V_EXP(dst, src) attn_exp8_avx2(dst, src)
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define M_LEN_GT(vlen, j) _mm256_castsi256_ps(_mm256_cmpgt_epi32(vlen, _mm256_set1_epi32(j)))
#define M_GT(in, a, b) _mm256_and_ps(in, _mm256_cmp_ps(a, b, _CMP_GT_OQ))
#define M_BLOCKS_EQ(vlen, nb)                                                                      \
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(                                                        \
        _mm256_srli_epi32(_mm256_add_epi32(vlen, _mm256_set1_epi32(OPS_ATTN_BLOCK - 1)), 4),       \
        _mm256_set1_epi32(nb)))
#define M_ANY(m) (_mm256_movemask_ps(m) != 0)
#include "reference/ops_attention_lanes.inc"
#else
void attn_lanes_avx512(float *const *out, const float *const *q, const int *ctx_len, int nq,
                       const struct ops_kv *kv, int g, int d_len, float scale, float *scratch) {
    (void)out, (void)q, (void)ctx_len, (void)nq, (void)kv, (void)g, (void)d_len, (void)scale,
        (void)scratch;
}
void attn_lanes_avx2(float *const *out, const float *const *q, const int *ctx_len, int nq,
                     const struct ops_kv *kv, int g, int d_len, float scale, float *scratch) {
    (void)out, (void)q, (void)ctx_len, (void)nq, (void)kv, (void)g, (void)d_len, (void)scale,
        (void)scratch;
}
#endif
