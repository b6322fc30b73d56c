/* The split-invariant sums of reference/ops.h ("TP and KVP change no bit"):
 *   - matmul_split: the columns cut into T rank slices (T = 2, 4, 8), each rank's partial
 *     computed with OPS_SPLIT_LEAVES / T leaves and the partials added by ops_tree_sum, equal
 *     the whole product bit for bit; on every matmul path the CPU has (portable, AVX2,
 *     AVX-512), at 1 and 3 threads, for one token (the 4-row decode tile) and batches of 6, 8
 *     and 35 (the 4 x 6, 2 x 8 and prefill tiles), with K a multiple of 16 or not;
 *   - attention vs attention_partial_max / attention_partial / attention_merge: one rank's
 *     attention over a long context (1,800 positions; 4 KVP ranks of 512) equals the KVP
 *     ranks' merge bit for bit, for a decode query and a prefill chunk that crosses a rank
 *     boundary, and for other rank sizes and counts (16 x 8, 64 x 3);
 *   - both stay close to a double-precision reference (they are a reordering, not an
 *     approximation). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/ops.h"
#include "reference/thread_pool.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rand_floats(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < n; ++i)
        x[i] = frand() * scale;
    return x;
}

/* Columns [c0, c0 + nc) of w [rows, cols] as a matrix of their own (a TP rank's slice). */
static void *slice_cols(const struct ops_weight *w, int c0, int nc, struct ops_weight *out) {
    const size_t esz = w->dtype == OPS_BF16 ? 2 : 4;
    char *data = malloc((size_t)w->rows * (size_t)nc * esz);
    assert_non_null(data);
    for (int r = 0; r < w->rows; ++r)
        memcpy(data + (size_t)r * (size_t)nc * esz,
               (const char *)w->data + ((size_t)r * (size_t)w->cols + (size_t)c0) * esz,
               (size_t)nc * esz);
    *out = (struct ops_weight){data, w->dtype, w->rows, nc};
    return data;
}

static void check_split(enum ops_dtype dt, int rows, int cols, int n, struct thread_pool **pools) {
    const size_t nw = (size_t)rows * (size_t)cols, no = (size_t)n * (size_t)rows;
    void *data = malloc(nw * (dt == OPS_BF16 ? 2 : 4));
    assert_non_null(data);
    for (size_t i = 0; i < nw; ++i) {
        if (dt == OPS_BF16)
            ((uint16_t *)data)[i] = f32_to_bf16(frand());
        else
            ((float *)data)[i] = frand();
    }
    struct ops_weight w = {data, dt, rows, cols};
    float *x = rand_floats((size_t)n * (size_t)cols, 1.0f);
    float *whole = malloc(no * sizeof(float)), *got = malloc(no * sizeof(float));
    float *parts = malloc((size_t)OPS_SPLIT_LEAVES * no * sizeof(float));
    float *xs = malloc((size_t)n * (size_t)cols * sizeof(float));
    assert_true(whole && got && parts && xs);
    ops_force_path(OPS_PATH_PORTABLE);
    matmul_split(whole, x, &w, n, OPS_SPLIT_LEAVES, pools[0]);
    /* Close to the exact sum: a reordering, not an approximation. */
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < cols; ++k) {
                const size_t wi = (size_t)r * (size_t)cols + (size_t)k;
                const double wv =
                    dt == OPS_BF16 ? bf16_to_f32(((uint16_t *)data)[wi]) : ((float *)data)[wi];
                ref += wv * (double)x[(size_t)t * (size_t)cols + (size_t)k];
                mag += fabs(wv * (double)x[(size_t)t * (size_t)cols + (size_t)k]);
            }
            assert_true(fabs(whole[(size_t)t * (size_t)rows + (size_t)r] - ref) <=
                        4e-6 * mag + 1e-30);
        }
    static const enum ops_path paths[] = {OPS_PATH_PORTABLE, OPS_PATH_AVX2, OPS_PATH_AVX512};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; ++p) {
        if (!ops_force_path(paths[p])) continue;
        for (int th = 0; th < 2; ++th) {
            matmul_split(got, x, &w, n, OPS_SPLIT_LEAVES, pools[th]);
            if (memcmp(got, whole, no * sizeof(float)))
                fail_msg("%s K %d n %d: %s path differs from portable",
                         dt == OPS_BF16 ? "bf16" : "f32", cols, n, ops_path_name(paths[p]));
            for (int T = 2; T <= OPS_SPLIT_LEAVES; T *= 2) {
                if (cols % T) continue;
                const int kc = cols / T;
                for (int r = 0; r < T; ++r) {
                    struct ops_weight ws;
                    void *sd = slice_cols(&w, r * kc, kc, &ws);
                    for (int t = 0; t < n; ++t)
                        memcpy(xs + (size_t)t * (size_t)kc,
                               x + (size_t)t * (size_t)cols + (size_t)r * (size_t)kc,
                               (size_t)kc * sizeof(float));
                    matmul_split(parts + (size_t)r * no, xs, &ws, n, OPS_SPLIT_LEAVES / T,
                                 pools[th]);
                    free(sd);
                }
                ops_tree_sum(got, parts, T, no);
                if (memcmp(got, whole, no * sizeof(float)))
                    fail_msg("%s K %d n %d %s: TP %d differs from one rank",
                             dt == OPS_BF16 ? "bf16" : "f32", cols, n, ops_path_name(paths[p]), T);
            }
        }
    }
    /* A batch row equals the same token alone (4-token tile vs 4-row decode tile). */
    if (n > 1) {
        matmul_split(got, x + (size_t)(n - 1) * (size_t)cols, &w, 1, OPS_SPLIT_LEAVES, pools[1]);
        assert_memory_equal(got, whole + (size_t)(n - 1) * (size_t)rows,
                            (size_t)rows * sizeof(float));
    }
    ops_force_path(OPS_PATH_AUTO);
    free(data);
    free(x);
    free(whole);
    free(got);
    free(parts);
    free(xs);
}

static void test_matmul_split(void **state) {
    (void)state;
    struct thread_pool *pools[2];
    assert_int_equal(thread_pool_init(&pools[0], 1), 0);
    assert_int_equal(thread_pool_init(&pools[1], 3), 0);
    static const int ks[] = {2048, 3072, 160, 96, 48, 24, 7};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; ++i)
        for (int dt = 0; dt < 2; ++dt) {
            check_split(dt ? OPS_BF16 : OPS_F32, 37, ks[i], 1, pools);
            check_split(dt ? OPS_BF16 : OPS_F32, 21, ks[i], 6, pools);
            /* 8 tokens: AVX-512's 2 x 8 tile where the inputs fit L1, else 4 + 4. */
            check_split(dt ? OPS_BF16 : OPS_F32, 21, ks[i], 8, pools);
            /* >= 32 tokens: AVX2's 2 x 3 prefill tile over widened row blocks. */
            check_split(dt ? OPS_BF16 : OPS_F32, 9, ks[i], 35, pools);
        }
    thread_pool_free(pools[0]);
    thread_pool_free(pools[1]);
}

/* ---- attention ---- */

enum { NH = 4, NKV = 2, D = 16 };

/* KVP ranks of `tokens` positions over a cache of `ctx` positions: n queries at
 * pos .. pos + n - 1 through one rank's attention() and through the ranks' partials. */
static void check_kvp(const float *k_all, const float *v_all, int ctx, int tokens, int ranks,
                      int pos, int n, struct thread_pool *pool) {
    const size_t qd = (size_t)NH * D;
    float *q = rand_floats((size_t)n * qd, 2.0f);
    float *one = malloc((size_t)n * qd * sizeof(float)),
          *got = malloc((size_t)n * qd * sizeof(float));
    float *scratch = malloc((size_t)thread_pool_size(pool) *
                            attention_scratch_floats(ctx, NH, NKV, D) * sizeof(float));
    const size_t part_n = (size_t)n * NH * (D + 2);
    float *parts = malloc((size_t)ranks * part_n * sizeof(float));
    float *maxes = malloc((size_t)(ranks + 1) * (size_t)n * NH * sizeof(float));
    float *scores = malloc((size_t)ranks * (size_t)n * NH * (size_t)tokens * sizeof(float));
    float *caches = malloc((size_t)ranks * 2 * NKV * (size_t)tokens * D * sizeof(float));
    assert_true(one && got && scratch && parts && maxes && scores && caches);
    int32_t ident[256]; /* contiguous caches: block b is the b-th run of OPS_ATTN_BLOCK rows */
    for (int b = 0; b < 256; ++b)
        ident[b] = b;
    assert_true(ctx <= 256 * OPS_ATTN_BLOCK);
    const struct ops_kv all = {(float *)k_all,     (float *)v_all,  ident,
                               OPS_ATTN_BLOCK * D, (size_t)ctx * D, OPS_F32};
    attention(one, q, &all, scratch, pos, n, NH, NKV, D, pool);
    float *m = maxes + (size_t)ranks * (size_t)n * NH;
    for (int r = 0; r < ranks; ++r) { /* rank r's cache: its positions of every kv head */
        float *kc = caches + (size_t)r * 2 * NKV * (size_t)tokens * D,
              *vc = kc + NKV * (size_t)tokens * D;
        int held = ctx - r * tokens < tokens ? ctx - r * tokens : tokens;
        for (int g = 0; g < NKV; ++g)
            for (int j = 0; j < held; ++j) {
                memcpy(kc + ((size_t)g * tokens + j) * D,
                       k_all + ((size_t)g * ctx + (size_t)(r * tokens + j)) * D, D * sizeof(float));
                memcpy(vc + ((size_t)g * tokens + j) * D,
                       v_all + ((size_t)g * ctx + (size_t)(r * tokens + j)) * D, D * sizeof(float));
            }
        const struct ops_kv mine = {kc,     NULL, ident, OPS_ATTN_BLOCK * D, (size_t)tokens * D,
                                    OPS_F32};
        attention_partial_max(maxes + (size_t)r * n * NH, scores + (size_t)r * n * NH * tokens, q,
                              &mine, pos, n, r * tokens, held, NH, NKV, D, pool);
    }
    for (size_t t = 0; t < (size_t)n * NH; ++t) { /* the group's max: exact in any order */
        m[t] = -INFINITY;
        for (int r = 0; r < ranks; ++r)
            m[t] = fmaxf(m[t], maxes[(size_t)r * n * NH + t]);
    }
    for (int r = 0; r < ranks; ++r) {
        float *vc = caches + (size_t)r * 2 * NKV * (size_t)tokens * D + NKV * (size_t)tokens * D;
        int held = ctx - r * tokens < tokens ? ctx - r * tokens : tokens;
        const struct ops_kv mine = {NULL,   vc, ident, OPS_ATTN_BLOCK * D, (size_t)tokens * D,
                                    OPS_F32};
        attention_partial(parts + (size_t)r * part_n, scores + (size_t)r * n * NH * tokens, m,
                          &mine, pos, n, r * tokens, held, NH, NKV, D, pool);
    }
    attention_merge(got, parts, ranks, n, NH, D);
    if (memcmp(got, one, (size_t)n * qd * sizeof(float)))
        fail_msg("KVP %d x %d tokens, queries [%d, %d): the merge differs from one rank", ranks,
                 tokens, pos, pos + n);
    /* One rank vs double precision: softmax(q·k) · v. */
    double worst = 0.0;
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < NH; ++h) {
            const float *qv = q + ((size_t)i * NH + h) * D;
            const int g = h / (NH / NKV), seen = pos + i + 1;
            double *s = malloc((size_t)seen * sizeof(double)), mx = -INFINITY, l = 0.0;
            assert_non_null(s);
            for (int j = 0; j < seen; ++j) {
                double dot = 0.0;
                for (int d = 0; d < D; ++d)
                    dot += (double)qv[d] * k_all[((size_t)g * ctx + j) * D + d];
                s[j] = dot / sqrt((double)D);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < seen; ++j)
                l += exp(s[j] - mx);
            for (int d = 0; d < D; ++d) {
                double o = 0.0;
                for (int j = 0; j < seen; ++j)
                    o += exp(s[j] - mx) / l * v_all[((size_t)g * ctx + j) * D + d];
                worst = fmax(worst, fabs(o - one[((size_t)i * NH + h) * D + d]));
            }
            free(s);
        }
    printf("KVP %d x %d tokens, queries [%d, %d) of %d: merge == one rank; max |err| vs double "
           "%.3g\n",
           ranks, tokens, pos, pos + n, ctx, worst);
    assert_true(worst < 1e-5);
    free(q);
    free(one);
    free(got);
    free(scratch);
    free(parts);
    free(maxes);
    free(scores);
    free(caches);
}

static void test_attention_kvp(void **state) {
    (void)state;
    struct thread_pool *pool;
    assert_int_equal(thread_pool_init(&pool, 2), 0);
    const int ctx = 1800;
    float *k = rand_floats((size_t)NKV * ctx * D, 1.5f),
          *v = rand_floats((size_t)NKV * ctx * D, 1.0f);
    check_kvp(k, v, ctx, 512, 4, ctx - 1, 1, pool); /* decode over 1,800 positions */
    check_kvp(k, v, ctx, 512, 4, 1000, 40, pool);   /* a prefill chunk across 1024 */
    check_kvp(k, v, ctx, 512, 4, 0, 20, pool);      /* only rank 0 sees keys */
    check_kvp(k, v, 100, 16, 7, 60, 40, pool);      /* one-block ranks, 7 of them */
    check_kvp(k, v, 150, 64, 3, 100, 50, pool);     /* three ranks, the last cut short */
    free(k);
    free(v);
    thread_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_split),
        cmocka_unit_test(test_attention_kvp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
