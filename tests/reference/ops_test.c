/* Unit tests of reference/ops.h against straightforward double-precision formulas, plus the
 * determinism properties: matmul is bit-identical across thread counts, across batch
 * composition, and between every matmul path (portable, AVX2, AVX-512) the CPU has. */
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
#include "runtime/base/dtype.h"
#include "reference/thread_pool.h"

static uint64_t rng = 0x1234567ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        x[i] = frand();
}

/* A random weight [rows, cols] in the given dtype; *dense receives its f32 values. */
static void *make_weight(struct ops_weight *w, float **dense, enum ops_dtype dt, int rows,
                         int cols) {
    size_t n = (size_t)rows * (size_t)cols;
    *dense = malloc(n * sizeof(float));
    void *data = malloc(n * (dt == OPS_BF16 ? 2 : 4));
    assert_non_null(*dense);
    assert_non_null(data);
    for (size_t i = 0; i < n; ++i) {
        float v = frand();
        if (dt == OPS_BF16) {
            ((uint16_t *)data)[i] = f32_to_bf16(v);
            (*dense)[i] = bf16_to_f32(((uint16_t *)data)[i]);
        } else {
            ((float *)data)[i] = v;
            (*dense)[i] = v;
        }
    }
    *w = (struct ops_weight){data, dt, rows, cols};
    return data;
}

static void test_bf16_conversion(void **state) {
    (void)state;
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0). */
    assert_int_equal(f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);
    /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even. */
    assert_int_equal(f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

static void check_matmul(enum ops_dtype dt, int rows, int cols, int n, struct thread_pool *pool) {
    struct ops_weight w;
    float *dense;
    void *data = make_weight(&w, &dense, dt, rows, cols);
    float *x = malloc((size_t)n * (size_t)cols * sizeof(float));
    float *out = malloc((size_t)n * (size_t)rows * sizeof(float));
    float *single = malloc((size_t)rows * sizeof(float));
    fill(x, (size_t)n * (size_t)cols);
    matmul(out, x, &w, n, pool);
    for (int t = 0; t < n; ++t) {
        for (int r = 0; r < rows; ++r) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < cols; ++k) {
                double p = (double)dense[(size_t)r * (size_t)cols + (size_t)k] *
                           (double)x[(size_t)t * (size_t)cols + (size_t)k];
                ref += p;
                mag += fabs(p);
            }
            double err = fabs(out[(size_t)t * (size_t)rows + (size_t)r] - ref);
            if (err > 1e-6 * mag + 1e-30)
                fail_msg("matmul %s %dx%d n=%d: out[%d][%d] = %.9g, want %.9g",
                         dt == OPS_BF16 ? "bf16" : "f32", rows, cols, n, t, r,
                         out[(size_t)t * (size_t)rows + (size_t)r], ref);
        }
        /* The same row computed alone gives the same bits (batch composition does not matter). */
        matmul(single, x + (size_t)t * (size_t)cols, &w, 1, pool);
        assert_memory_equal(single, out + (size_t)t * (size_t)rows, (size_t)rows * sizeof(float));
    }
    free(data);
    free(dense);
    free(x);
    free(out);
    free(single);
}

static void test_matmul_matches_double(void **state) {
    (void)state;
    struct thread_pool *pool;
    assert_int_equal(thread_pool_init(&pool, 2), 0);
    int rows[] = {1, 3, 4, 5, 17, 33}, cols[] = {1, 7, 16, 17, 40, 64, 100}, ns[] = {1, 2, 4, 5, 9};
    for (int dt = 0; dt < 2; ++dt)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; ++r)
            for (size_t c = 0; c < sizeof cols / sizeof *cols; ++c)
                for (size_t n = 0; n < sizeof ns / sizeof *ns; ++n)
                    check_matmul((enum ops_dtype)dt, rows[r], cols[c], ns[n], pool);
    thread_pool_free(pool);
}

/* matmul_multi (one dispatch for q/k/v or gate/up) gives each matrix exactly matmul's bits,
 * at every thread count, for decode (n = 1) and prefill, row counts that are not multiples
 * of a task's 16 rows. */
static void test_matmul_multi(void **state) {
    (void)state;
    const int rows[3] = {203, 37, 64}, cols = 333;
    for (int dt = 0; dt < 2; ++dt) {
        struct ops_weight w[3];
        float *dense[3], *base[3], *out[3];
        void *data[3];
        float *x = malloc((size_t)6 * (size_t)cols * sizeof(float));
        fill(x, (size_t)6 * (size_t)cols);
        for (int i = 0; i < 3; ++i) {
            data[i] = make_weight(&w[i], &dense[i], (enum ops_dtype)dt, rows[i], cols);
            base[i] = malloc((size_t)6 * (size_t)rows[i] * sizeof(float));
            out[i] = malloc((size_t)6 * (size_t)rows[i] * sizeof(float));
        }
        const struct ops_weight *ws[3] = {&w[0], &w[1], &w[2]};
        for (int n = 1; n <= 6; n += 5)
            for (int threads = 1; threads <= 3; ++threads) {
                struct thread_pool *pool;
                assert_int_equal(thread_pool_init(&pool, threads), 0);
                for (int i = 0; i < 3; ++i)
                    matmul(base[i], x, &w[i], n, pool);
                matmul_multi(out, ws, 3, x, n, pool);
                for (int i = 0; i < 3; ++i)
                    assert_memory_equal(out[i], base[i],
                                        (size_t)n * (size_t)rows[i] * sizeof(float));
                thread_pool_free(pool);
            }
        for (int i = 0; i < 3; ++i) {
            free(data[i]);
            free(dense[i]);
            free(base[i]);
            free(out[i]);
        }
        free(x);
    }
}

/* Same weights and inputs: every thread count and both code paths give identical bits. */
static void test_matmul_bit_identical(void **state) {
    (void)state;
    int rows = 203, cols = 333, n = 6;
    for (int dt = 0; dt < 2; ++dt) {
        struct ops_weight w;
        float *dense;
        void *data = make_weight(&w, &dense, (enum ops_dtype)dt, rows, cols);
        float *x = malloc((size_t)n * (size_t)cols * sizeof(float));
        float *base = malloc((size_t)n * (size_t)rows * sizeof(float));
        float *out = malloc((size_t)n * (size_t)rows * sizeof(float));
        fill(x, (size_t)n * (size_t)cols);
        struct thread_pool *one;
        assert_int_equal(thread_pool_init(&one, 1), 0);
        matmul(base, x, &w, n, one);
        for (int threads = 2; threads <= 5; ++threads) {
            struct thread_pool *pool;
            assert_int_equal(thread_pool_init(&pool, threads), 0);
            matmul(out, x, &w, n, pool);
            assert_memory_equal(out, base, (size_t)n * (size_t)rows * sizeof(float));
            thread_pool_free(pool);
        }
        matmul_serial(out, x, &w, n); /* the calling thread alone: the same bits */
        assert_memory_equal(out, base, (size_t)n * (size_t)rows * sizeof(float));
        int has_avx2 = ops_force_portable(1);
        matmul(out, x, &w, n, one);
        ops_force_portable(0);
        assert_memory_equal(out, base, (size_t)n * (size_t)rows * sizeof(float));
        if (dt == 0)
            printf("matmul: default path %s (AVX2+FMA %s); portable path bit-identical\n",
                   ops_path_name(ops_matmul_path()), has_avx2 ? "available" : "not available");
        thread_pool_free(one);
        free(data);
        free(dense);
        free(x);
        free(base);
        free(out);
    }
}

/* Every matmul path this CPU has gives the portable path's bits: random shapes with odd K
 * (every tail length 0..15), row counts off the 4-row and 16-row tiles, bf16 and f32 weights,
 * 1 token (decode tiles), 2..9 tokens (a decode step of several requests: AVX-512's 4 x n and
 * 2 x n tiles, 1 x 4 tiles on AVX2, plus leftovers) and 32..40
 * tokens (the register tiles over widened row blocks, AVX2's 2 x 3 and AVX-512's 4 x 6: the
 * last rows and tokens as tiles overlapping the ones before, or dot1 for a task with fewer
 * rows than a tile), 1 and 2 threads. */
static void test_matmul_paths_bit_identical(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_AVX2, OPS_PATH_AVX512};
    int compared[2] = {0, 0};
    struct thread_pool *pools[2];
    assert_int_equal(thread_pool_init(&pools[0], 1), 0);
    assert_int_equal(thread_pool_init(&pools[1], 2), 0);
    for (int trial = 0; trial < 48; ++trial) {
        enum ops_dtype dt = (enum ops_dtype)(trial % 2);
        int cols = 1 + (int)((frand() + 1.0f) * 200.0f) + trial % 16;
        int rows = 1 + (int)((frand() + 1.0f) * 40.0f);
        int n = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 2 + trial % 8 : 32 + trial % 9;
        struct ops_weight w;
        float *dense;
        void *data = make_weight(&w, &dense, dt, rows, cols);
        size_t out_n = (size_t)n * (size_t)rows;
        float *x = malloc((size_t)n * (size_t)cols * sizeof(float));
        float *want = malloc(out_n * sizeof(float)), *got = malloc(out_n * sizeof(float));
        assert_non_null(x);
        assert_non_null(want);
        assert_non_null(got);
        fill(x, (size_t)n * (size_t)cols);
        assert_int_equal(ops_force_path(OPS_PATH_PORTABLE), 1);
        matmul(want, x, &w, n, pools[0]);
        for (int p = 0; p < 2; ++p) {
            if (!ops_force_path(paths[p])) continue;
            for (int t = 0; t < 2; ++t) {
                memset(got, 0xff, out_n * sizeof(float));
                matmul(got, x, &w, n, pools[t]);
                if (memcmp(got, want, out_n * sizeof(float)))
                    fail_msg("matmul %s %s %dx%d n=%d threads %d differs from portable",
                             ops_path_name(paths[p]), dt == OPS_BF16 ? "bf16" : "f32", rows, cols,
                             n, t + 1);
            }
            compared[p]++;
        }
        ops_force_path(OPS_PATH_AUTO);
        free(data);
        free(dense);
        free(x);
        free(want);
        free(got);
    }
    for (int p = 0; p < 2; ++p) {
        if (compared[p])
            printf("matmul: %s path bit-identical to portable on %d random shapes\n",
                   ops_path_name(paths[p]), compared[p]);
        else
            printf("matmul: this CPU has no %s path; it was not compared here\n",
                   ops_path_name(paths[p]));
    }
    assert_int_equal(ops_force_path(OPS_PATH_AVX512 + 1), 0);
    thread_pool_free(pools[0]);
    thread_pool_free(pools[1]);
}

static void test_rmsnorm(void **state) {
    (void)state;
    int n = 3, dim = 37;
    float x[3 * 37], w[37], out[3 * 37];
    fill(x, sizeof x / sizeof *x);
    fill(w, 37);
    rmsnorm(out, x, w, 1e-6f, n, dim);
    for (int t = 0; t < n; ++t) {
        double ss = 0.0;
        for (int i = 0; i < dim; ++i)
            ss += (double)x[t * dim + i] * x[t * dim + i];
        double scale = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; ++i)
            assert_true(fabs(out[t * dim + i] - w[i] * x[t * dim + i] * scale) < 1e-6);
    }
    rmsnorm(x, x, w, 1e-6f, n, dim); /* in place */
    assert_memory_equal(x, out, sizeof out);
}

static void test_rope(void **state) {
    (void)state;
    enum { D = 16, HALF = 8, NH = 3 };
    float inv[HALF], c[HALF], s[HALF], x[NH * D], orig[NH * D];
    for (int j = 0; j < HALF; ++j)
        inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / D);
    fill(orig, NH * D);
    /* Position 0 is the identity. */
    rope_cos_sin(c, s, inv, 0, 0, 0, NULL, HALF);
    memcpy(x, orig, sizeof x);
    rope_apply(x, c, s, NH, D);
    assert_memory_equal(x, orig, sizeof x);
    /* Position 5: rotate_half pairing (j, j + D/2). */
    rope_cos_sin(c, s, inv, 5, 5, 5, NULL, HALF);
    memcpy(x, orig, sizeof x);
    rope_apply(x, c, s, NH, D);
    for (int h = 0; h < NH; ++h)
        for (int j = 0; j < HALF; ++j) {
            double a = 5.0 * inv[j], x0 = orig[h * D + j], x1 = orig[h * D + j + HALF];
            assert_true(fabs(x[h * D + j] - (x0 * cos(a) - x1 * sin(a))) < 1e-5);
            assert_true(fabs(x[h * D + j + HALF] - (x1 * cos(a) + x0 * sin(a))) < 1e-5);
        }
}

static void test_mrope_sections(void **state) {
    (void)state;
    enum { HALF = 64 };
    int section[3] = {24, 20, 20};
    float inv[HALF], c1[HALF], s1[HALF], c2[HALF], s2[HALF];
    for (int j = 0; j < HALF; ++j)
        inv[j] = 1.0f / powf(5e6f, (float)(2 * j) / 128.0f);
    /* Equal streams reduce to plain 1-D RoPE. */
    rope_cos_sin(c1, s1, inv, 9, 9, 9, section, HALF);
    rope_cos_sin(c2, s2, inv, 9, 9, 9, NULL, HALF);
    assert_memory_equal(c1, c2, sizeof c1);
    assert_memory_equal(s1, s2, sizeof s1);
    /* Distinct streams: h on j%3==1 (j<60), w on j%3==2 (j<60), t elsewhere (spec §5.1). */
    int pt = 3, ph = 11, pw = 17;
    rope_cos_sin(c1, s1, inv, pt, ph, pw, section, HALF);
    for (int j = 0; j < HALF; ++j) {
        int p = pt;
        if (j % 3 == 1 && j < 60) p = ph;
        if (j % 3 == 2 && j < 60) p = pw;
        assert_true(s1[j] == sinf((float)p * inv[j]));
    }
    assert_true(s1[58] == sinf((float)ph * inv[58]));
    assert_true(s1[59] == sinf((float)pw * inv[59]));
    assert_true(s1[61] == sinf((float)pt * inv[61]));
}

static void test_softmax_swiglu(void **state) {
    (void)state;
    float x[5] = {1.0f, 2.0f, 3.0f, -1.0f, 1000.0f};
    softmax(x, 4);
    double z = exp(1) + exp(2) + exp(3) + exp(-1);
    assert_true(fabs(x[0] - exp(1) / z) < 1e-7 && fabs(x[2] - exp(3) / z) < 1e-7);
    softmax(x + 4, 1);
    assert_true(x[4] == 1.0f);
    float g[3] = {-2.0f, 0.0f, 3.0f}, u[3] = {1.5f, 2.0f, -1.0f}, o[3];
    swiglu(o, g, u, 3);
    for (int i = 0; i < 3; ++i)
        assert_true(fabs(o[i] - g[i] / (1.0 + exp(-g[i])) * u[i]) < 1e-6);
}

static void test_moe_route(void **state) {
    (void)state;
    float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
    int e[3];
    float w[3];
    moe_route(e, w, logits, 0, 6, 3);
    /* Ties (experts 1 and 3) keep the lower index first. */
    assert_int_equal(e[0], 1);
    assert_int_equal(e[1], 3);
    assert_int_equal(e[2], 4);
    double z = 0.0;
    for (int i = 0; i < 6; ++i)
        z += exp(logits[i]);
    assert_true(fabs(w[0] - exp(2.0) / z) < 1e-7 && fabs(w[2] - exp(1.0) / z) < 1e-7);
    moe_route(e, w, logits, 1, 6, 3);
    double sum = exp(2.0) * 2 + exp(1.0);
    assert_true(fabs(w[0] - exp(2.0) / sum) < 1e-6 && fabs(w[2] - exp(1.0) / sum) < 1e-6);
    assert_true(fabs(w[0] + w[1] + w[2] - 1.0) < 1e-6);
}

/* attention() with scratch of exactly the documented size (on the heap: ASan sees an
 * overrun), on `threads` threads. */
static void run_attention(float *out, const float *q, const float *k, const float *v,
                          size_t kv_head_stride, int pos, int n, int nh, int nkv, int d,
                          int threads) {
    struct thread_pool *pool;
    assert_int_equal(thread_pool_init(&pool, threads), 0);
    float *scratch =
        malloc((size_t)threads * attention_scratch_floats(pos + n, nh, nkv, d) * sizeof(float));
    assert_non_null(scratch);
    int32_t ident[64]; /* a contiguous cache: block b is the b-th run of OPS_ATTN_BLOCK rows */
    for (int b = 0; b < 64; ++b)
        ident[b] = b;
    assert_true(pos + n <= 64 * OPS_ATTN_BLOCK);
    const struct ops_kv kv = {(float *)k,     (float *)v, ident, (size_t)OPS_ATTN_BLOCK * (size_t)d,
                              kv_head_stride, OPS_F32};
    attention(out, q, &kv, scratch, pos, n, nh, nkv, d, pool);
    free(scratch);
    thread_pool_free(pool);
}

/* moe_sum_rows adds a row's held slots by the halving tree over expert indices, not in
 * choice order: experts {5, 1, 2} of [0, 8) are ((s1 + s2) + s5). With s5 = 1, s1 = 1e8,
 * s2 = -1e8 the tree gives 1 where choice order gives 0. A TP node [4, 8) holds only
 * expert 5; a row holding none is zeros. */
static void test_moe_sum_rows(void **state) {
    (void)state;
    const int experts[6] = {5, 1, 2, 0, 3, 1}; /* row 0, row 1 (K = 3) */
    const float values[6] = {1.0f, 1e8f, -1e8f, 2.0f, 3.0f, 4.0f};
    float slots[6 * 2], out[2 * 2];
    for (int s = 0; s < 6; ++s)
        slots[2 * s] = slots[2 * s + 1] = values[s];
    moe_sum_rows(out, slots, experts, 2, 3, 0, 8, 2);
    assert_true(out[0] == 1.0f && out[1] == 1.0f);
    assert_true(out[2] == (2.0f + 4.0f) + 3.0f); /* {0, 1} in [0, 2), then 3 */
    for (int s = 0; s < 6; ++s)
        slots[2 * s] = slots[2 * s + 1] = values[s];
    moe_sum_rows(out, slots, experts, 2, 3, 4, 8, 2);
    assert_true(out[0] == 1.0f && out[1] == 1.0f);
    assert_true(out[2] == 0.0f && out[3] == 0.0f && !signbit(out[2]));
}

/* Causal GQA over a cache with 2 earlier positions and 3 new queries, against double math:
 * groups of 2 and 16 heads (run together), 1 and 18 (one task per head). */
static void test_attention(void **state) {
    (void)state;
    enum { D = 8, MAX_SEQ = 8, POS = 2, N = 3, MAX_NH = 36 };
    static const int heads[][2] = {{4, 2}, {32, 2}, {4, 4}, {36, 2}}; /* nh, nkv */
    float q[N * MAX_NH * D], k[4 * MAX_SEQ * D], v[4 * MAX_SEQ * D], out[N * MAX_NH * D];
    fill(q, sizeof q / sizeof *q);
    fill(k, sizeof k / sizeof *k);
    fill(v, sizeof v / sizeof *v);
    for (size_t c = 0; c < sizeof heads / sizeof heads[0]; ++c) {
        const int NH = heads[c][0], NKV = heads[c][1], group = NH / NKV;
        for (int threads = 1; threads <= 3; ++threads) {
            run_attention(out, q, k, v, MAX_SEQ * D, POS, N, NH, NKV, D, threads);
            for (int i = 0; i < N; ++i)
                for (int h = 0; h < NH; ++h) {
                    const float *qi = q + (i * NH + h) * D;
                    const float *kh = k + (h / group) * MAX_SEQ * D,
                                *vh = v + (h / group) * MAX_SEQ * D;
                    int ctx = POS + i + 1;
                    double s[MAX_SEQ], max = -1e30, z = 0.0;
                    for (int j = 0; j < ctx; ++j) {
                        s[j] = 0.0;
                        for (int d = 0; d < D; ++d)
                            s[j] += (double)qi[d] * kh[j * D + d];
                        s[j] /= sqrt((double)D);
                        if (s[j] > max) max = s[j];
                    }
                    for (int j = 0; j < ctx; ++j)
                        z += exp(s[j] - max);
                    for (int d = 0; d < D; ++d) {
                        double o = 0.0;
                        for (int j = 0; j < ctx; ++j)
                            o += exp(s[j] - max) / z * vh[j * D + d];
                        assert_true(fabs(out[(i * NH + h) * D + d] - o) < 1e-5);
                    }
                }
        }
    }
}

/* The per-thread scratch: one head's scores without grouping, the group's scores and block
 * trees with it. */
static void test_attention_scratch_floats(void **state) {
    (void)state;
    assert_int_equal(attention_scratch_floats(100, 36, 2, 64), 100); /* one head per task */
    /* tiles of query tokens: 8 query vectors per task (8 MHA tokens, 2 tokens of 4 heads) */
    assert_true(attention_scratch_floats(100, 8, 8, 64) >= 8 * (100 + 65));
    assert_true(attention_scratch_floats(100, 8, 2, 64) >= 8 * (100 + 65));
    assert_true(attention_scratch_floats(101, 8, 2, 64) > attention_scratch_floats(100, 8, 2, 64));
}

/* The aligned tree of ops.h over blocks [0, nb) of ob [nb][w], written plainly (recursively:
 * the largest power of two below nb on the left): the sum lands in ob[0]. */
static void plain_tree(float *ob, int nb, int w) {
    if (nb <= 1) return;
    int left = 1;
    while (2 * left < nb)
        left *= 2;
    plain_tree(ob, left, w);
    plain_tree(ob + (size_t)left * (size_t)w, nb - left, w);
    for (int d = 0; d < w; ++d)
        ob[d] += ob[(size_t)left * (size_t)w + (size_t)d];
}

/* A paged cache gives the contiguous cache's bits: the same keys and values stored by
 * kv_store into blocks scattered (in reverse, with gaps) over a bigger pool of
 * [block][kv_head][OPS_ATTN_BLOCK][D], then attended through the block table, for MHA and
 * grouped heads, on 1 and 3 threads, with prefix and query runs crossing blocks. */
static void test_attention_paged(void **state) {
    (void)state;
    enum { D = 16, CTX = 75, POOL = 16, NKV = 2, MAX_NH = 8 };
    const int blocks = (CTX + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
    static float k[NKV * CTX * D], v[NKV * CTX * D], q[CTX * MAX_NH * D];
    static float rows_k[CTX * NKV * D], rows_v[CTX * NKV * D];
    static float pk[POOL * NKV * OPS_ATTN_BLOCK * D], pv[POOL * NKV * OPS_ATTN_BLOCK * D];
    static float want[CTX * MAX_NH * D], got[CTX * MAX_NH * D];
    fill(k, sizeof k / sizeof *k);
    fill(v, sizeof v / sizeof *v);
    fill(q, sizeof q / sizeof *q);
    /* The projected rows [pos][kv_head][D] that kv_store takes. */
    for (int j = 0; j < CTX; ++j)
        for (int g = 0; g < NKV; ++g) {
            memcpy(rows_k + ((size_t)j * NKV + g) * D, k + ((size_t)g * CTX + j) * D, D * 4);
            memcpy(rows_v + ((size_t)j * NKV + g) * D, v + ((size_t)g * CTX + j) * D, D * 4);
        }
    int32_t table[16];
    for (int b = 0; b < blocks; ++b)
        table[b] = POOL - 1 - 2 * b;
    const struct ops_kv paged = {
        pk, pv, table, (size_t)NKV * OPS_ATTN_BLOCK * D, (size_t)OPS_ATTN_BLOCK * D, OPS_F32};
    /* Stored in three calls that cross block edges (positions [0, 20), [20, 47), [47, 75)). */
    kv_store(&paged, rows_k, rows_v, NKV * D, 0, 20, NKV, D);
    kv_store(&paged, rows_k + 20 * NKV * D, rows_v + 20 * NKV * D, NKV * D, 20, 27, NKV, D);
    kv_store(&paged, rows_k + 47 * NKV * D, rows_v + 47 * NKV * D, NKV * D, 47, 28, NKV, D);
    for (int j = 0; j < CTX; ++j)
        for (int g = 0; g < NKV; ++g) {
            const size_t at = ops_kv_offset(&paged, g, j, D);
            assert_memory_equal(pk + at, k + ((size_t)g * CTX + j) * D, D * 4);
            assert_memory_equal(pv + at, v + ((size_t)g * CTX + j) * D, D * 4);
        }
    static const int heads[] = {2, 8}; /* nh: one task per head, then groups of 4 */
    static const int runs[][2] = {{0, 75}, {60, 15}, {74, 1}, {16, 1}}; /* pos, n */
    for (size_t h = 0; h < sizeof heads / sizeof *heads; ++h)
        for (size_t r = 0; r < sizeof runs / sizeof *runs; ++r)
            for (int threads = 1; threads <= 3; threads += 2) {
                const int nh = heads[h], pos = runs[r][0], n = runs[r][1];
                struct thread_pool *pool;
                assert_int_equal(thread_pool_init(&pool, threads), 0);
                float *scratch =
                    malloc((size_t)threads * attention_scratch_floats(pos + n, nh, NKV, D) * 4);
                assert_non_null(scratch);
                attention(got, q, &paged, scratch, pos, n, nh, NKV, D, pool);
                free(scratch);
                thread_pool_free(pool);
                run_attention(want, q, k, v, (size_t)CTX * D, pos, n, nh, NKV, D, threads);
                if (memcmp(got, want, (size_t)n * nh * D * 4))
                    fail_msg("paged attention differs: nh %d, pos %d, n %d, %d threads", nh, pos, n,
                             threads);
            }
}

/* A bf16 or f16 cache: kv_store rounds each element to nearest even, and attention over it
 * gives the bits of attention over an f32 cache holding the rounded values (it widens
 * exactly); grouped and per-head tasks, one and three threads, a query run crossing blocks. */
static void test_attention_16bit(void **state) {
    (void)state;
    enum { D = 16, CTX = 50, NKV = 2, NH = 8, POOL = 8 };
    static float k[NKV * CTX * D], v[NKV * CTX * D], q[CTX * NH * D], rk[NKV * CTX * D],
        rv[NKV * CTX * D];
    static float rows_k[CTX * NKV * D], rows_v[CTX * NKV * D], want[CTX * NH * D],
        got[CTX * NH * D];
    static uint16_t pk[POOL * NKV * OPS_ATTN_BLOCK * D], pv[POOL * NKV * OPS_ATTN_BLOCK * D];
    fill(k, sizeof k / sizeof *k);
    fill(v, sizeof v / sizeof *v);
    fill(q, sizeof q / sizeof *q);
    for (int j = 0; j < CTX; ++j)
        for (int g = 0; g < NKV; ++g) {
            memcpy(rows_k + ((size_t)j * NKV + g) * D, k + ((size_t)g * CTX + j) * D, D * 4);
            memcpy(rows_v + ((size_t)j * NKV + g) * D, v + ((size_t)g * CTX + j) * D, D * 4);
        }
    const int32_t table[4] = {5, 1, 7, 2};
    for (int bf = 0; bf < 2; ++bf) {
        const enum ops_dtype dt = bf ? OPS_BF16 : OPS_F16;
        for (size_t i = 0; i < sizeof k / sizeof *k; ++i) {
            rk[i] = bf ? bf16_to_f32(f32_to_bf16(k[i])) : f16_to_f32(f32_to_f16(k[i]));
            rv[i] = bf ? bf16_to_f32(f32_to_bf16(v[i])) : f16_to_f32(f32_to_f16(v[i]));
        }
        const struct ops_kv paged = {
            pk, pv, table, (size_t)NKV * OPS_ATTN_BLOCK * D, (size_t)OPS_ATTN_BLOCK * D, dt};
        kv_store(&paged, rows_k, rows_v, NKV * D, 0, 30, NKV, D);
        kv_store(&paged, rows_k + 30 * NKV * D, rows_v + 30 * NKV * D, NKV * D, 30, 20, NKV, D);
        for (int j = 0; j < CTX; ++j)
            for (int g = 0; g < NKV; ++g)
                for (int d = 0; d < D; ++d) {
                    const size_t at = ops_kv_offset(&paged, g, j, D) + (size_t)d;
                    const uint16_t wk = bf ? f32_to_bf16(k[((size_t)g * CTX + j) * D + d])
                                           : f32_to_f16(k[((size_t)g * CTX + j) * D + d]);
                    assert_int_equal(pk[at], wk);
                }
        for (int nh = NKV; nh <= NH; nh *= 4)
            for (int threads = 1; threads <= 3; threads += 2) {
                struct thread_pool *pool;
                assert_int_equal(thread_pool_init(&pool, threads), 0);
                float *scratch =
                    malloc((size_t)threads * attention_scratch_floats(CTX, nh, NKV, D) * 4);
                assert_non_null(scratch);
                attention(got, q, &paged, scratch, 10, 40, nh, NKV, D, pool);
                free(scratch);
                thread_pool_free(pool);
                run_attention(want, q, rk, rv, (size_t)CTX * D, 10, 40, nh, NKV, D, threads);
                if (memcmp(got, want, (size_t)40 * nh * D * 4))
                    fail_msg("%s cache: attention differs from f32 over the rounded values "
                             "(nh %d, %d threads)",
                             bf ? "bf16" : "f16", nh, threads);
            }
    }
}

/* attention's documented fp32 order, written plainly: the kernel must give these exact bits
 * (its key interleaving only overlaps independent chains, its binary counter is this tree).
 * Context lengths cover 4-, 8- and 16-key groups, leftovers and 1 to 6 blocks of
 * OPS_ATTN_BLOCK; head_dim 24 (3 transposed columns of 8; AVX-512: one 16 x 16 transpose and
 * an 8-column tail), 128 (Qwen3's: whole 16-wide transposes and 128-wide weighted sums) and 130
 * (the 64- or 128-wide weighted sums, an 8-wide one and a scalar tail); GQA groups of 4, 2 and 1
 * (the AVX-512 scores share one transpose across a group's heads); every matmul path this CPU
 * has (attention's AVX2 and AVX-512 loops follow it). */
static void check_exact_order(int D, int NKV) {
    enum { NH = 4, MAX_SEQ = 90, POS = 6, N = 84 };
    enum { NB = (MAX_SEQ + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK };
    float *q = malloc(sizeof(float) * N * NH * (size_t)D);
    float *k = malloc(sizeof(float) * NKV * MAX_SEQ * (size_t)D);
    float *v = malloc(sizeof(float) * NKV * MAX_SEQ * (size_t)D);
    float *out = malloc(sizeof(float) * N * NH * (size_t)D);
    float *ob = malloc(sizeof(float) * NB * (size_t)(D + 1)),
          *o = malloc(sizeof(float) * (size_t)D);
    float s[MAX_SEQ];
    fill(q, (size_t)N * NH * (size_t)D);
    fill(k, (size_t)NKV * MAX_SEQ * (size_t)D);
    fill(v, (size_t)NKV * MAX_SEQ * (size_t)D);
    run_attention(out, q, k, v, (size_t)MAX_SEQ * (size_t)D, POS, N, NH, NKV, D, 2);
    float scale = 1.0f / sqrtf((float)D);
    for (int i = 0; i < N; ++i)
        for (int h = 0; h < NH; ++h) {
            const float *qi = q + (i * NH + h) * D;
            const float *kh = k + (h / (NH / NKV)) * MAX_SEQ * D,
                        *vh = v + (h / (NH / NKV)) * MAX_SEQ * D;
            int ctx = POS + i + 1, nb = (ctx + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
            float max = -INFINITY;
            for (int j = 0; j < ctx; ++j) {
                float dot = 0.0f;
                for (int d = 0; d < D; ++d)
                    dot = fmaf(qi[d], kh[j * D + d], dot);
                s[j] = dot * scale;
                max = s[j] > max ? s[j] : max;
            }
            for (int b = 0; b < nb; ++b) { /* per block: o then l, ascending j */
                float *o_b = ob + b * (D + 1);
                for (int d = 0; d <= D; ++d)
                    o_b[d] = 0.0f;
                for (int j = b * OPS_ATTN_BLOCK; j < ctx && j < (b + 1) * OPS_ATTN_BLOCK; ++j) {
                    float p = ops_expf(s[j] - max);
                    o_b[D] += p;
                    for (int d = 0; d < D; ++d)
                        o_b[d] = fmaf(p, vh[j * D + d], o_b[d]);
                }
            }
            plain_tree(ob, nb, D + 1);
            float inv = 1.0f / ob[D];
            for (int d = 0; d < D; ++d)
                o[d] = ob[d] * inv;
            if (memcmp(out + (i * NH + h) * D, o, sizeof(float) * (size_t)D))
                fail_msg("attention %s path, head_dim %d, %d kv heads: query %d head %d differs "
                         "from the documented order",
                         ops_path_name(ops_matmul_path()), D, NKV, i, h);
        }
    free(q), free(k), free(v), free(out), free(ob), free(o);
}

static void test_attention_exact_order(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_PORTABLE, OPS_PATH_AVX2, OPS_PATH_AVX512};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; ++p) {
        if (!ops_force_path(paths[p])) continue;
        for (int nkv = 1; nkv <= 4; nkv *= 2) { /* GQA groups of 4 and 2 heads, one per head */
            check_exact_order(24, nkv);
            check_exact_order(128, nkv);
            check_exact_order(130, nkv);
        }
        printf("attention: %s path gives the documented order's bits (head_dim 24, 128, 130; "
               "groups of 4, 2 and 1)\n",
               ops_path_name(paths[p]));
    }
    ops_force_path(OPS_PATH_AUTO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_matmul_matches_double),
        cmocka_unit_test(test_matmul_bit_identical),
        cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_matmul_paths_bit_identical),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_mrope_sections),
        cmocka_unit_test(test_softmax_swiglu),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_sum_rows),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_16bit),
        cmocka_unit_test(test_attention_scratch_floats),
        cmocka_unit_test(test_attention_exact_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
