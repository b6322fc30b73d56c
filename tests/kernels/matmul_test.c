/* cuda_matmul's determinism contract (kernels/matmul.h), beyond the NMSE sweep of
 * tests/backend_ops: each output element is bitwise the reference matmul's (the same
 * dot-product order, no fma contraction), and does not depend on how many rows share the
 * call (rows computed one at a time equal rows computed in one batch of 9). bf16 and f32
 * weights, K with and without a K % 16 tail, one leaf (cuda_matmul) and several
 * (cuda_matmul_split), through both of the bf16 loads' paths. Prints "skipped: <reason>" without a
 * device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

enum { N = 9 };

static float value(unsigned i) {
    i = i * 2654435761u + 12345u;
    return (float)((i >> 8) % 2001u) / 1000.0f - 1.0f;
}

/* 0 when every check of one (K, rows, dtype, leaves) holds; leaves 1 is cuda_matmul, more is
 * cuda_matmul_split against the reference's matmul_split. */
static int check_shape(int K, int rows, enum ops_dtype dtype, int leaves,
                       struct thread_pool *pool) {
    size_t esz = dtype == OPS_BF16 ? 2 : 4;
    float *x = malloc(sizeof(float) * N * K), *want = malloc(sizeof(float) * N * rows);
    float *batch = malloc(sizeof(float) * N * rows), *single = malloc(sizeof(float) * N * rows);
    void *w = malloc(esz * (size_t)rows * K);
    float *d_x = NULL, *d_out = NULL;
    void *d_w = NULL;
    int rc = (!x || !want || !batch || !single || !w) ? STRATA_ENOMEM : 0;
    for (int i = 0; !rc && i < N * K; ++i)
        x[i] = value((unsigned)i);
    for (int i = 0; !rc && i < rows * K; ++i) {
        float v = value((unsigned)i + 7777u);
        if (dtype == OPS_BF16)
            ((uint16_t *)w)[i] = f32_to_bf16(v);
        else
            ((float *)w)[i] = v;
    }
    struct ops_weight host_w = {w, dtype, rows, K};
    if (!rc && leaves == 1) matmul(want, x, &host_w, N, pool);
    if (!rc && leaves > 1) matmul_split(want, x, &host_w, N, leaves, pool);
    if (!rc) rc = cuda_malloc((void **)&d_x, sizeof(float) * N * K);
    if (!rc) rc = cuda_malloc((void **)&d_out, sizeof(float) * N * rows);
    if (!rc) rc = cuda_malloc(&d_w, esz * (size_t)rows * K);
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof(float) * N * K);
    if (!rc) rc = cuda_memcpy_to_device(d_w, w, esz * (size_t)rows * K);
    struct ops_weight dev_w = {d_w, dtype, rows, K};
    if (!rc) rc = cuda_matmul_split(d_out, d_x, &dev_w, N, leaves, NULL);
    if (!rc) rc = cuda_memcpy_to_host(batch, d_out, sizeof(float) * N * rows);
    for (int t = 0; !rc && t < N; ++t) {
        rc = leaves == 1 ? cuda_matmul(d_out, d_x + (size_t)t * K, &dev_w, 1, NULL)
                         : cuda_matmul_split(d_out, d_x + (size_t)t * K, &dev_w, 1, leaves, NULL);
        if (!rc) rc = cuda_memcpy_to_host(single + (size_t)t * rows, d_out, sizeof(float) * rows);
    }
    int failures = 0;
    if (rc) {
        printf("FAIL K=%d rows=%d %s leaves %d: %s\n", K, rows, dtype == OPS_BF16 ? "bf16" : "f32",
               leaves, strata_last_error());
        failures = 1;
    } else {
        int same_ref = !memcmp(batch, want, sizeof(float) * N * rows);
        int same_batch = !memcmp(batch, single, sizeof(float) * N * rows);
        printf("%s K=%d rows=%d %s leaves %d: bitwise the reference %s, batch-invariant %s\n",
               same_ref && same_batch ? "ok  " : "FAIL", K, rows,
               dtype == OPS_BF16 ? "bf16" : "f32", leaves, same_ref ? "yes" : "NO",
               same_batch ? "yes" : "NO");
        failures = !same_ref + !same_batch;
    }
    cuda_free(d_x);
    cuda_free(d_out);
    cuda_free(d_w);
    free(x);
    free(want);
    free(batch);
    free(single);
    free(w);
    return failures;
}

/* 0 when cuda_matmul_multi over matrices of K columns and rows[0..count) gives each output
 * bitwise the reference's matmul of that matrix (one launch; the matrices' blocks side by
 * side, a partial block at each matrix's end). */
static int check_multi(int K, const int *rows, int count, enum ops_dtype dtype,
                       struct thread_pool *pool) {
    const size_t esz = dtype == OPS_BF16 ? 2 : 4;
    float *x = malloc(sizeof(float) * N * K), *d_x = NULL;
    float *want[OPS_MULTI_MAX] = {0}, *got[OPS_MULTI_MAX] = {0}, *d_out[OPS_MULTI_MAX] = {0};
    void *w[OPS_MULTI_MAX] = {0}, *d_w[OPS_MULTI_MAX] = {0};
    struct ops_weight dev_w[OPS_MULTI_MAX];
    const struct ops_weight *ws[OPS_MULTI_MAX];
    int rc = x ? cuda_malloc((void **)&d_x, sizeof(float) * N * K) : STRATA_ENOMEM;
    for (int i = 0; !rc && i < N * K; ++i)
        x[i] = value((unsigned)i + 99u);
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof(float) * N * K);
    for (int m = 0; !rc && m < count; ++m) {
        const size_t n_out = (size_t)N * rows[m], n_w = (size_t)rows[m] * K;
        want[m] = malloc(sizeof(float) * n_out);
        got[m] = malloc(sizeof(float) * n_out);
        w[m] = malloc(esz * n_w);
        rc = want[m] && got[m] && w[m] ? 0 : STRATA_ENOMEM;
        for (size_t i = 0; !rc && i < n_w; ++i) {
            float v = value((unsigned)(i + 1000u * (size_t)m) + 31u);
            if (dtype == OPS_BF16)
                ((uint16_t *)w[m])[i] = f32_to_bf16(v);
            else
                ((float *)w[m])[i] = v;
        }
        struct ops_weight host_w = {w[m], dtype, rows[m], K};
        if (!rc) matmul(want[m], x, &host_w, N, pool);
        if (!rc) rc = cuda_malloc((void **)&d_out[m], sizeof(float) * n_out);
        if (!rc) rc = cuda_malloc(&d_w[m], esz * n_w);
        if (!rc) rc = cuda_memcpy_to_device(d_w[m], w[m], esz * n_w);
        dev_w[m] = (struct ops_weight){d_w[m], dtype, rows[m], K};
        ws[m] = &dev_w[m];
    }
    if (!rc) rc = cuda_matmul_multi(d_out, ws, count, d_x, N, NULL);
    int failures = 0, single_failures = 0;
    for (int m = 0; !rc && m < count; ++m) {
        rc = cuda_memcpy_to_host(got[m], d_out[m], sizeof(float) * N * rows[m]);
        failures += !rc && memcmp(got[m], want[m], sizeof(float) * N * rows[m]) != 0;
    }
    /* Token by token (a batch-1 decode step's calls: the one-token kernel), into the same
     * outputs, cleared first. */
    for (int m = 0; !rc && m < count; ++m)
        rc = cuda_memset(d_out[m], 0, sizeof(float) * N * rows[m]);
    for (int t = 0; !rc && t < N; ++t) {
        float *outs[OPS_MULTI_MAX];
        for (int m = 0; m < count; ++m)
            outs[m] = d_out[m] + (size_t)t * (size_t)rows[m];
        rc = cuda_matmul_multi(outs, ws, count, d_x + (size_t)t * K, 1, NULL);
    }
    for (int m = 0; !rc && m < count; ++m) {
        rc = cuda_memcpy_to_host(got[m], d_out[m], sizeof(float) * N * rows[m]);
        single_failures += !rc && memcmp(got[m], want[m], sizeof(float) * N * rows[m]) != 0;
    }
    failures += single_failures + (rc != 0);
    printf("%s multi K=%d %d matrices (%d rows first) %s: bitwise the reference %s, one token a "
           "call %s%s\n",
           failures ? "FAIL" : "ok  ", K, count, rows[0], dtype == OPS_BF16 ? "bf16" : "f32",
           failures - single_failures ? "NO" : "yes", single_failures ? "NO" : "yes",
           rc ? strata_last_error() : "");
    for (int m = 0; m < count; ++m) {
        cuda_free(d_out[m]);
        cuda_free(d_w[m]);
        free(want[m]);
        free(got[m]);
        free(w[m]);
    }
    cuda_free(d_x);
    free(x);
    return failures;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    struct thread_pool *pool = NULL;
    if (thread_pool_init(&pool, 2)) {
        printf("FAIL: %s\n", strata_last_error());
        return 1;
    }
    int failures = 0;
    /* {K, rows, leaves}. bf16 rows take the 16-byte loads (kernels/matmul.cu: rounds of 4
     * chunks of 128 columns, then single chunks) where K is a multiple of 8 x leaves: 1000 is
     * one round, 3 chunks, 6 blocks and a tail of 8; 1032 / 2 leaves is 2-byte loads (leaf 1
     * starts at column 516); 4096 / 8 is one round per leaf; 2576 / 2 is two rounds, 2 chunks
     * and a tail of 8 per leaf; 2048 / 8 is two single chunks per leaf. Blocks: 4 half-warps
     * (16 x leaves threads for 8 leaves) below 4096 rows x leaves, 16 from there: 4100 rows
     * and 515 x 8 leaves end in a partial block of 16. */
    const int shapes[][3] = {{16, 3, 1},    {67, 33, 1},   {1024, 257, 1},  {2560, 64, 1},
                             {5, 17, 1},    {1000, 19, 1}, {1032, 18, 2},   {4096, 40, 8},
                             {2576, 21, 2}, {2048, 9, 8},  {1024, 4100, 1}, {1024, 515, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        failures += check_shape(shapes[i][0], shapes[i][1], OPS_BF16, shapes[i][2], pool);
        failures += check_shape(shapes[i][0], shapes[i][1], OPS_F32, shapes[i][2], pool);
    }
    /* q / k / v-like (small: blocks of 4 half-warps) and gate / up-like past 4096 rows in all
     * (blocks of 16), each matrix ending in a partial block */
    const int qkv[] = {40, 9, 9}, gu[] = {4100, 33}, four[] = {5, 70, 1, 17};
    for (int d = 0; d < 2; ++d) {
        const enum ops_dtype dt = d ? OPS_F32 : OPS_BF16;
        failures += check_multi(1000, qkv, 3, dt, pool);
        failures += check_multi(1024, gu, 2, dt, pool);
        failures += check_multi(67, four, 4, dt, pool);
    }
    failures += cuda_matmul(NULL, NULL, NULL, 1, NULL) != STRATA_EINVAL;
    {
        /* refused: no matrices, more than OPS_MULTI_MAX, a K unlike the first's */
        float *outs[OPS_MULTI_MAX + 1] = {0};
        struct ops_weight a = {(void *)8, OPS_BF16, 4, 32}, b = {(void *)8, OPS_BF16, 4, 48};
        const struct ops_weight *ws[OPS_MULTI_MAX + 1] = {&a, &b, &a, &a, &a};
        for (int i = 0; i <= OPS_MULTI_MAX; ++i)
            outs[i] = (float *)16;
        failures += cuda_matmul_multi(outs, ws, 0, (float *)32, 1, NULL) != STRATA_EINVAL;
        ws[1] = &a;
        failures +=
            cuda_matmul_multi(outs, ws, OPS_MULTI_MAX + 1, (float *)32, 1, NULL) != STRATA_EINVAL;
        ws[1] = &b;
        failures += cuda_matmul_multi(outs, ws, 2, (float *)32, 1, NULL) != STRATA_EINVAL;
    }
    thread_pool_free(pool);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
