/* Unit tests of the q8 weights (reference/ops_q8.h): the quantiser's round trip, matmul
 * against double-precision references (exactly what the kernel computes, and the
 * dequantised weights times the f32 activations), and the determinism properties: every
 * matmul path the CPU has bit-identical to portable, 1 thread = 2 threads, a token batched
 * with others = the same token alone, matmul_serial = matmul. */
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
#include "reference/ops_q8.h"
#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Values of mixed magnitude: a block's scale then varies over orders of magnitude, some
 * blocks are all zero and some hold one outlier (what real weight rows look like). */
static void fill_mixed(float *x, size_t n) {
    for (size_t b = 0; b < n; b += OPS_Q8_BLOCK) {
        int kind = (int)((frand() + 1.0f) * 4.0f);
        float mag = kind == 0 ? 0.0f : powf(10.0f, -3.0f * (frand() + 1.0f) * 0.5f);
        for (size_t i = b; i < b + OPS_Q8_BLOCK && i < n; ++i)
            x[i] = mag * frand();
        size_t len = n - b < OPS_Q8_BLOCK ? n - b : OPS_Q8_BLOCK;
        if (kind == 3) x[b + (size_t)((frand() + 1.0f) * 0.5f * (float)(len - 1))] = 8.0f * mag;
    }
}

/* A q8 weight [rows, cols] quantised from random bf16 values; the caller frees *buf. */
static struct ops_weight make_q8(void **buf, int rows, int cols, struct thread_pool *pool) {
    size_t n = (size_t)rows * (size_t)cols;
    float *f = malloc(n * sizeof(float));
    uint16_t *bf = malloc(n * sizeof(uint16_t));
    *buf = malloc(ops_q8_bytes(rows, cols));
    assert_non_null(f);
    assert_non_null(bf);
    assert_non_null(*buf);
    fill_mixed(f, n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        memcpy(&bits, &f[i], 4);
        bf[i] = (uint16_t)(bits >> 16);
    }
    struct ops_weight src = {bf, OPS_BF16, rows, cols}, q;
    ops_q8_quantize_weight(&q, *buf, &src, pool);
    free(f);
    free(bf);
    return q;
}

static void test_supported_and_bytes(void **state) {
    (void)state;
    assert_true(ops_q8_supported(32));
    assert_true(ops_q8_supported(1024));
    assert_true(ops_q8_supported(OPS_Q8_MAX_COLS));
    assert_true(ops_q8_supported(48)); /* a padded last block */
    assert_false(ops_q8_supported(0));
    assert_false(ops_q8_supported(OPS_Q8_MAX_COLS + 1));
    assert_int_equal(ops_q8_bytes(3, 64), 3 * 64 + 3 * 2 * 4);
    assert_int_equal(ops_q8_bytes(3, 48), 3 * 64 + 3 * 2 * 4);
}

/* |x - q d| <= d / 2 (up to the f32 rounding of q / d and q * d), q in [-127, 127], the
 * largest |x| of a block lands on +-127, an all-zero block has d = 0. */
static void test_round_trip(void **state) {
    (void)state;
    enum { K = 4096 };
    static float x[K], y[K];
    static int8_t q[K];
    float d[K / OPS_Q8_BLOCK];
    double worst = 0.0;
    for (int trial = 0; trial < 20; ++trial) {
        fill_mixed(x, K);
        ops_q8_quantize_row(q, d, x, K - 17); /* the last block partial */
        for (int i = K - 17; i < K; ++i) {
            assert_int_equal(q[i], 0); /* padding */
            x[i] = 0.0f;
        }
        float *packed = malloc(ops_q8_bytes(1, K)); /* int8 values, then the scales */
        assert_non_null(packed);
        memcpy(packed, q, K);
        memcpy((int8_t *)packed + K, d, sizeof d);
        struct ops_weight w = {packed, OPS_Q8, 1, K};
        ops_weight_row(y, &w, 0);
        for (int b = 0; b < K / OPS_Q8_BLOCK; ++b) {
            float amax = 0.0f;
            int hit = 0;
            for (int i = b * OPS_Q8_BLOCK; i < (b + 1) * OPS_Q8_BLOCK; ++i) {
                amax = fmaxf(amax, fabsf(x[i]));
                assert_true(q[i] >= -127 && q[i] <= 127);
                double err = fabs((double)x[i] - (double)y[i]);
                if (d[b] > 0.0f) worst = fmax(worst, err / d[b]);
                if (err > 0.5 * d[b] * (1.0 + 1e-5) + 1e-30)
                    fail_msg("block %d: |x - q d| = %g > d/2 = %g", b, err, 0.5 * d[b]);
                if (q[i] == 127 || q[i] == -127) hit = 1;
            }
            assert_true(d[b] == amax / 127.0f);
            if (amax > 0.0f) assert_true(hit);
        }
        free(packed);
    }
    printf("q8 round trip: max |x - q d| = %.6f d (bound 0.5 d)\n", worst);
    /* A block of subnormals: zeros stay 0, the largest is 127. */
    float tiny[OPS_Q8_BLOCK] = {0}, dt;
    int8_t qt[OPS_Q8_BLOCK];
    tiny[3] = 1e-40f;
    tiny[5] = -5e-41f;
    ops_q8_quantize_row(qt, &dt, tiny, OPS_Q8_BLOCK);
    assert_int_equal(qt[0], 0);
    assert_int_equal(qt[3], 127);
    assert_true(qt[5] <= -63 && qt[5] >= -64);
}

/* Two references in double: (a) exactly the kernel's operands (dequantised weights times
 * dequantised activations) must agree to f32 accumulation error; (b) the dequantised weights
 * times the f32 activations differ by the activation rounding (a loose NMSE bound). */
static void test_matmul_vs_double(void **state) {
    (void)state;
    enum { ROWS = 37, COLS = 1000, N = 5 };
    void *buf;
    struct ops_weight w = make_q8(&buf, ROWS, COLS, NULL);
    static float x[N * COLS], out[N * ROWS], wrow[COLS], xq_deq[COLS];
    static int8_t xq[COLS + OPS_Q8_BLOCK];
    float dx[COLS / OPS_Q8_BLOCK + 1];
    for (int i = 0; i < N * COLS; ++i)
        x[i] = frand();
    matmul_serial(out, x, &w, N);
    double num_a = 0, num_b = 0, den = 0;
    for (int t = 0; t < N; ++t) {
        ops_q8_quantize_row(xq, dx, x + t * COLS, COLS);
        for (int c = 0; c < COLS; ++c)
            xq_deq[c] = (float)xq[c] * dx[c / OPS_Q8_BLOCK];
        for (int r = 0; r < ROWS; ++r) {
            ops_weight_row(wrow, &w, r);
            double ra = 0, rb = 0;
            for (int c = 0; c < COLS; ++c) {
                ra += (double)wrow[c] * (double)xq_deq[c];
                rb += (double)wrow[c] * (double)x[t * COLS + c];
            }
            double got = out[t * ROWS + r];
            num_a += (got - ra) * (got - ra);
            num_b += (got - rb) * (got - rb);
            den += rb * rb;
        }
    }
    printf("q8 matmul NMSE: %.3g vs its own operands in double, %.3g vs f32 activations\n",
           num_a / den, num_b / den);
    assert_true(num_a / den < 1e-10);
    assert_true(num_b / den < 1e-4); /* measured 1.5e-5 */
    free(buf);
}

/* out [n, rows] for the given path and pool (NULL: matmul_serial). */
static void run_path(float *out, const float *x, const struct ops_weight *w, int n,
                     enum ops_path path, struct thread_pool *pool) {
    assert_int_equal(ops_force_path(path), 1);
    memset(out, 0xff, (size_t)n * (size_t)w->rows * sizeof(float));
    if (pool)
        matmul(out, x, w, n, pool);
    else
        matmul_serial(out, x, w, n);
    ops_force_path(OPS_PATH_AUTO);
}

static void test_paths_threads_batching(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_AVX2, OPS_PATH_AVX512};
    int compared[2] = {0, 0};
    struct thread_pool *pools[2];
    assert_int_equal(thread_pool_init(&pools[0], 1), 0);
    assert_int_equal(thread_pool_init(&pools[1], 2), 0);
    for (int trial = 0; trial < 40; ++trial) {
        /* Mostly small shapes; the widest makes the stack buffer hold few tokens per chunk. */
        int cols = trial == 0   ? OPS_Q8_MAX_COLS
                   : trial == 1 ? 4096
                   : trial % 2  ? 32 * (1 + trial % 12)
                                : 1 + (int)((frand() + 1.0f) * 200.0f); /* partial blocks */
        int rows = 1 + (int)((frand() + 1.0f) * 20.0f);
        int n = trial < 2 ? 17 : trial % 3 == 0 ? 1 : 2 + trial % 8;
        void *buf;
        struct ops_weight w = make_q8(&buf, rows, cols, pools[trial % 2]);
        size_t out_n = (size_t)n * (size_t)rows;
        float *x = malloc((size_t)n * (size_t)cols * sizeof(float));
        float *want = malloc(out_n * sizeof(float)), *got = malloc(out_n * sizeof(float));
        assert_non_null(x);
        assert_non_null(want);
        assert_non_null(got);
        fill_mixed(x, (size_t)n * (size_t)cols);
        run_path(want, x, &w, n, OPS_PATH_PORTABLE, pools[0]);
        /* Batching: each token alone gives its row of the batch. */
        for (int t = 0; t < n; ++t) {
            run_path(got, x + (size_t)t * (size_t)cols, &w, 1, OPS_PATH_PORTABLE, pools[1]);
            if (memcmp(got, want + (size_t)t * (size_t)rows, (size_t)rows * sizeof(float)))
                fail_msg("q8 %dx%d: token %d alone differs from its row in a batch of %d", rows,
                         cols, t, n);
        }
        run_path(got, x, &w, n, OPS_PATH_PORTABLE, NULL);
        if (memcmp(got, want, out_n * sizeof(float))) fail_msg("q8 matmul_serial differs");
        for (int p = 0; p < 2; ++p) {
            if (!ops_path_available(paths[p])) continue;
            for (int t = 0; t < 3; ++t) {
                run_path(got, x, &w, n, paths[p], t < 2 ? pools[t] : NULL);
                if (memcmp(got, want, out_n * sizeof(float)))
                    fail_msg("q8 matmul %s %dx%d n=%d (%s) differs from portable",
                             ops_path_name(paths[p]), rows, cols, n,
                             t == 0   ? "1 thread"
                             : t == 1 ? "2 threads"
                                      : "serial");
            }
            compared[p]++;
        }
        free(buf);
        free(x);
        free(want);
        free(got);
    }
    for (int p = 0; p < 2; ++p) {
        if (compared[p])
            printf("q8 matmul: %s path bit-identical to portable on %d random shapes (1 and 2 "
                   "threads, serial)\n",
                   ops_path_name(paths[p]), compared[p]);
        else
            printf("q8 matmul: this CPU has no %s path; it was not compared here\n",
                   ops_path_name(paths[p]));
    }
    thread_pool_free(pools[0]);
    thread_pool_free(pools[1]);
}

/* Quantising from f32 and from the same values in bf16 gives the same q8 matrix, and the
 * quantised weight is independent of the pool size. */
static void test_quantize_weight_sources(void **state) {
    (void)state;
    enum { ROWS = 19, COLS = 96 };
    static float f[ROWS * COLS];
    static uint16_t bf[ROWS * COLS];
    fill_mixed(f, ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; ++i) {
        uint32_t bits;
        memcpy(&bits, &f[i], 4);
        bf[i] = (uint16_t)(bits >> 16);
        f[i] = bf16_to_f32(bf[i]);
    }
    struct thread_pool *pool;
    assert_int_equal(thread_pool_init(&pool, 2), 0);
    size_t bytes = ops_q8_bytes(ROWS, COLS);
    void *a = malloc(bytes), *b = malloc(bytes);
    assert_non_null(a);
    assert_non_null(b);
    struct ops_weight wa = {bf, OPS_BF16, ROWS, COLS}, wb = {f, OPS_F32, ROWS, COLS};
    ops_q8_quantize_weight(&wa, a, &wa, pool);
    ops_q8_quantize_weight(&wb, b, &wb, NULL);
    assert_int_equal(wa.dtype, OPS_Q8);
    assert_ptr_equal(wa.data, a);
    assert_memory_equal(a, b, bytes);
    free(a);
    free(b);
    thread_pool_free(pool);
}

/* The quantiser of every path gives the portable bytes, NaN, infinities, subnormals, ties
 * (x / d exactly k + 0.5) and a partial last block included. */
static void test_quantize_paths(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_AVX2, OPS_PATH_AVX512};
    enum { K = 32 * 64 + 7 };
    static float x[K];
    static int8_t want[K + 32], got[K + 32];
    float dw[K / 32 + 1], dg[K / 32 + 1];
    fill_mixed(x, K);
    x[40] = NAN;
    x[70] = INFINITY;
    x[100] = 1e-42f;
    x[101] = -3e-42f;
    for (int i = 128; i < 160; ++i) /* d = 1: ties at k + 0.5 */
        x[i] = i == 128 ? 127.0f : (float)(i - 140) + 0.5f;
    assert_int_equal(ops_force_path(OPS_PATH_PORTABLE), 1);
    ops_q8_quantize_row(want, dw, x, K);
    ops_force_path(OPS_PATH_AUTO);
    assert_int_equal(want[129], -10); /* -10.5 -> -10 (ties to even) */
    assert_int_equal(want[130], -10); /* -9.5 -> -10 */
    assert_int_equal(want[131], -8);  /* -8.5 -> -8 */
    for (int p = 0; p < 2; ++p) {
        if (!ops_force_path(paths[p])) {
            printf("q8 quantiser: this CPU has no %s path; not compared\n",
                   ops_path_name(paths[p]));
            continue;
        }
        ops_q8_quantize_row(got, dg, x, K);
        ops_force_path(OPS_PATH_AUTO);
        assert_memory_equal(got, want, ops_q8_ld(K));
        assert_memory_equal(dg, dw, sizeof dw);
        printf("q8 quantiser: %s bytes identical to portable\n", ops_path_name(paths[p]));
    }
}

/* matmul_multi over q8 matrices (ops_q8_matmul_multi: the tokens quantised once, one pool
 * run) gives each matrix ops_q8_matmul's bits: 1 token and 5, 1 and 2 threads, 2 and 3
 * matrices of different row counts, and a K that needs a partial block. */
static void test_matmul_multi_q8(void **state) {
    (void)state;
    const int rows[3] = {37, 16, 21}, Ks[2] = {96, 70};
    for (int ki = 0; ki < 2; ++ki)
        for (int threads = 1; threads <= 2; ++threads)
            for (int n = 1; n <= 5; n += 4)
                for (int count = 2; count <= 3; ++count) {
                    const int K = Ks[ki];
                    struct thread_pool *pool;
                    assert_int_equal(thread_pool_init(&pool, threads), 0);
                    void *bufs[3];
                    struct ops_weight w[3];
                    const struct ops_weight *ws[3];
                    float *outs[3], *want[3];
                    float *x = malloc((size_t)n * (size_t)K * sizeof(float));
                    assert_non_null(x);
                    fill_mixed(x, (size_t)n * (size_t)K);
                    for (int i = 0; i < count; ++i) {
                        w[i] = make_q8(&bufs[i], rows[i], K, pool);
                        ws[i] = &w[i];
                        outs[i] = malloc((size_t)n * (size_t)rows[i] * sizeof(float));
                        want[i] = malloc((size_t)n * (size_t)rows[i] * sizeof(float));
                        assert_non_null(outs[i]);
                        assert_non_null(want[i]);
                        matmul(want[i], x, &w[i], n, pool);
                    }
                    matmul_multi(outs, ws, count, x, n, pool);
                    for (int i = 0; i < count; ++i) {
                        if (memcmp(outs[i], want[i], (size_t)n * (size_t)rows[i] * sizeof(float)))
                            fail_msg("q8 matmul_multi K %d n %d threads %d: matrix %d differs", K,
                                     n, threads, i);
                        free(outs[i]);
                        free(want[i]);
                        free(bufs[i]);
                    }
                    free(x);
                    thread_pool_free(pool);
                }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supported_and_bytes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_matmul_vs_double),
        cmocka_unit_test(test_paths_threads_batching),
        cmocka_unit_test(test_quantize_weight_sources),
        cmocka_unit_test(test_quantize_paths),
        cmocka_unit_test(test_matmul_multi_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
