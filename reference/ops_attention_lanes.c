/* ops_attention_simd.h: a prefill tile's attention with its queries as the 16 lanes of an
 * AVX-512 vector, bit for bit attention_group_task of reference/ops.c.
 *
 * The key-lane loops (ops_attention_simd.c) need each block of keys transposed (d-major) for
 * every query vector that reads it, and a tile of 8 queries spent a third of the scores' time
 * on shuffles. Here lane x is query x: a score s[j] (lanes: queries) adds Qt[d] * k_j[d] in
 * ascending d, with k_j[d] one broadcast scalar and Qt the tile's queries transposed once per
 * tile; a weighted sum o[d] (lanes: queries) adds P[j] * v_j[d] in ascending j. Every lane
 * performs exactly its query's scalar chain (multiply, then add; never fused), so nothing
 * changes but how many queries one instruction serves.
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

#define LANES 16
_Static_assert(OPS_ATTN_BLOCK == 16, "a block is one shift by 4 and one 16-lane mask per key");
#define DEPTH 32 /* the block tree's binary counter: 2^32 blocks */

size_t attn_lanes_scratch_floats(int ctx, int d_len) {
    const size_t c = ctx > 0 ? (size_t)ctx : 0, d = d_len > 0 ? (size_t)d_len : 0;
    /* Qt [d][16], S [ctx][16], the counter's entries and the results [DEPTH + 1][d + 1][16],
     * P [16][16]. */
    return LANES * (d + c + (DEPTH + 1) * (d + 1) + OPS_ATTN_BLOCK);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))

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

/* Sixteen named accumulators: an array of __m512 indexed in a loop spills. */
#define ACC16(X)                                                                                   \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* S [j][16] = (Σ_d Qt[d] * k_j[d], ascending d) * scale for the keys j < last. */
AVX512_TARGET static void lane_scores(float *S, const float *Qt, const struct ops_kv *kv, int g,
                                      int last, int d_len, float scale) {
    float tmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM];
    const __m512 vscale = _mm512_set1_ps(scale);
    const size_t ld = (size_t)d_len;
    for (int b0 = 0, b = 0; b0 < last; b0 += OPS_ATTN_BLOCK, ++b) {
        const int m = last - b0 < OPS_ATTN_BLOCK ? last - b0 : OPS_ATTN_BLOCK;
        const float *k = block_rows(kv, 0, g, b, m, d_len, tmp);
#define DECL(j) __m512 s##j = _mm512_setzero_ps();
        ACC16(DECL)
#undef DECL
        for (int d = 0; d < d_len; ++d) {
            const __m512 qd = _mm512_loadu_ps(Qt + (size_t)d * LANES);
#define STEP(j) s##j = _mm512_fmadd_ps(qd, _mm512_set1_ps(k[(j)*ld + (size_t)d]), s##j);
            ACC16(STEP)
#undef STEP
        }
        float *out = S + (size_t)b0 * LANES;
#define STORE(j)                                                                                   \
    if ((j) < m) _mm512_storeu_ps(out + (j)*LANES, _mm512_mul_ps(s##j, vscale));
        ACC16(STORE)
#undef STORE
    }
}

/* o [d][16] = Σ_j P[j] * v_j[d] over the block's keys j < m in ascending j, lane x only where
 * key j is inside its query (mask[j]), from 0; d in [d0, d0 + 16). */
AVX512_TARGET static void lane_weighted16(float *o, const float *P, const __mmask16 *mask,
                                          const float *v, int m, size_t ld, int d0) {
#define DECL(t) __m512 a##t = _mm512_setzero_ps();
    ACC16(DECL)
#undef DECL
    for (int j = 0; j < m; ++j) {
        const __m512 p = _mm512_loadu_ps(P + (size_t)j * LANES);
        const float *vj = v + (size_t)j * ld + (size_t)d0;
        const __mmask16 k = mask[j];
#define STEP(t) a##t = _mm512_mask3_fmadd_ps(p, _mm512_set1_ps(vj[t]), a##t, k);
        ACC16(STEP)
#undef STEP
    }
#define STORE(t) _mm512_storeu_ps(o + (size_t)(d0 + (t)) * LANES, a##t);
    ACC16(STORE)
#undef STORE
}

/* The same for one d (the d_len % 16 tail). */
AVX512_TARGET static void lane_weighted1(float *o, const float *P, const __mmask16 *mask,
                                         const float *v, int m, size_t ld, int d) {
    __m512 a = _mm512_setzero_ps();
    for (int j = 0; j < m; ++j)
        a = _mm512_mask3_fmadd_ps(_mm512_loadu_ps(P + (size_t)j * LANES),
                                  _mm512_set1_ps(v[(size_t)j * ld + (size_t)d]), a, mask[j]);
    _mm512_storeu_ps(o + (size_t)d * LANES, a);
}

/* The counter's value (entries 0 .. top-1 folded right to left, as tree_finish does) into the
 * lanes `done` of fin; the entries stay as they are. */
AVX512_TARGET static void lane_fold(float *fin, const float *stack, int top, size_t w,
                                    __mmask16 done) {
    for (size_t e = 0; e < w; e += LANES) {
        __m512 r = _mm512_loadu_ps(stack + (size_t)(top - 1) * w + e);
        for (int i = top - 2; i >= 0; --i)
            r = _mm512_add_ps(_mm512_loadu_ps(stack + (size_t)i * w + e), r);
        _mm512_storeu_ps(fin + e, _mm512_mask_mov_ps(_mm512_loadu_ps(fin + e), done, r));
    }
}

AVX512_TARGET void attn_lanes_avx512(float *const *out, const float *const *q, const int *ctx_len,
                                     int nq, const struct ops_kv *kv, int g, int d_len, float scale,
                                     float *scratch) {
    const size_t w = (size_t)(d_len + 1) * LANES; /* one counter entry: o [d][16], l [16] */
    int last = 0, lens[LANES];
    for (int x = 0; x < LANES; ++x) {
        lens[x] = x < nq ? ctx_len[x] : 0; /* no key: a lane without a query */
        if (lens[x] > last) last = lens[x];
    }
    float *Qt = scratch, *S = Qt + (size_t)d_len * LANES, *stack = S + (size_t)last * LANES;
    float *fin = stack + DEPTH * w, *P = fin + w;
    for (int d = 0; d < d_len; ++d)
        for (int x = 0; x < LANES; ++x)
            Qt[(size_t)d * LANES + (size_t)x] = x < nq ? q[x][d] : 0.0f;
    lane_scores(S, Qt, kv, g, last, d_len, scale);

    /* Each query's max over its own keys: max_of's first key, then a strictly greater one. */
    const __m512i vlen = _mm512_loadu_si512(lens);
    __m512 max = _mm512_loadu_ps(S);
    for (int j = 1; j < last; ++j) {
        const __m512 s = _mm512_loadu_ps(S + (size_t)j * LANES);
        const __mmask16 in = _mm512_cmpgt_epi32_mask(vlen, _mm512_set1_epi32(j));
        max = _mm512_mask_mov_ps(max, _mm512_mask_cmp_ps_mask(in, s, max, _CMP_GT_OQ), s);
    }

    float vtmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM], diff[LANES];
    int64_t size[DEPTH];
    __mmask16 mask[OPS_ATTN_BLOCK];
    int top = 0;
    for (int b0 = 0, b = 0; b0 < last; b0 += OPS_ATTN_BLOCK, ++b) {
        const int m = last - b0 < OPS_ATTN_BLOCK ? last - b0 : OPS_ATTN_BLOCK;
        const float *v = block_rows(kv, 1, g, b, m, d_len, vtmp);
        float *o = stack + (size_t)top * w;
        __m512 l = _mm512_setzero_ps();
        for (int j = 0; j < m; ++j) { /* e_j = expf(s_j - max) and l = Σ e_j, ascending j */
            mask[j] = _mm512_cmpgt_epi32_mask(vlen, _mm512_set1_epi32(b0 + j));
            _mm512_storeu_ps(diff,
                             _mm512_sub_ps(_mm512_loadu_ps(S + (size_t)(b0 + j) * LANES), max));
            attn_exp16_avx512(P + (size_t)j * LANES, diff);
            l = _mm512_mask_add_ps(l, mask[j], l, _mm512_loadu_ps(P + (size_t)j * LANES));
        }
        int d = 0;
        for (; d + LANES <= d_len; d += LANES)
            lane_weighted16(o, P, mask, v, m, (size_t)d_len, d);
        for (; d < d_len; ++d)
            lane_weighted1(o, P, mask, v, m, (size_t)d_len, d);
        _mm512_storeu_ps(o + (size_t)d_len * LANES, l);
        size[top++] = 1; /* tree_push: merge equal neighbours, left + right */
        while (top >= 2 && size[top - 2] == size[top - 1]) {
            float *left = stack + (size_t)(top - 2) * w, *right = left + w;
            for (size_t e = 0; e < w; e += LANES)
                _mm512_storeu_ps(
                    left + e, _mm512_add_ps(_mm512_loadu_ps(left + e), _mm512_loadu_ps(right + e)));
            size[top - 2] *= 2;
            top--;
        }
        /* Queries whose keys end in this block: their tree is complete. */
        const __m512i vblocks =
            _mm512_srli_epi32(_mm512_add_epi32(vlen, _mm512_set1_epi32(OPS_ATTN_BLOCK - 1)), 4);
        const __mmask16 done = _mm512_cmpeq_epi32_mask(vblocks, _mm512_set1_epi32(b + 1));
        if (done) lane_fold(fin, stack, top, w, done);
    }

    const __m512 inv =
        _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(fin + (size_t)d_len * LANES));
    for (int d = 0; d < d_len; ++d)
        _mm512_storeu_ps(fin + (size_t)d * LANES,
                         _mm512_mul_ps(_mm512_loadu_ps(fin + (size_t)d * LANES), inv));
    for (int x = 0; x < nq; ++x)
        for (int d = 0; d < d_len; ++d)
            out[x][d] = fin[(size_t)d * LANES + (size_t)x];
}
#else
void attn_lanes_avx512(float *const *out, const float *const *q, const int *ctx_len, int nq,
                       const struct ops_kv *kv, int g, int d_len, float scale, float *scratch) {
    (void)out, (void)q, (void)ctx_len, (void)nq, (void)kv, (void)g, (void)d_len, (void)scale,
        (void)scratch;
}
#endif
