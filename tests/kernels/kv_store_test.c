/* cuda_kv_store and cuda_kv_store_rows (kernels/kv_store.h): the keys and values of a
 * forward item (of a whole batch of rows, each to its own slot and position) land in the
 * cache exactly where reference/model.c's store_kv copies them (a host loop of memcpy's
 * here), rows wider than the kv heads (the projection's row stride) included, and nothing
 * else in the cache changes. Prints "skipped: <reason>" without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/kv_store.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

/* 0 when one (pos, n, nkv, D, row stride) case matches the host copy bit for bit. */
static int check_case(int max_seq, int pos, int n, int nkv, int D, int stride) {
    size_t cache = (size_t)nkv * max_seq * D, rows = (size_t)n * stride;
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *want_k = malloc(cache * 4);
    float *want_v = malloc(cache * 4), *got_k = malloc(cache * 4), *got_v = malloc(cache * 4);
    float *d_k = NULL, *d_v = NULL, *d_kc = NULL, *d_vc = NULL;
    int rc = k && v && want_k && want_v && got_k && got_v ? 0 : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < rows; ++i)
        k[i] = (float)i * 0.5f + 1.0f, v[i] = -(float)i * 0.25f - 2.0f;
    for (size_t i = 0; !rc && i < cache; ++i)
        want_k[i] = want_v[i] = -777.0f; /* sentinel: must survive outside the rows */
    for (int i = 0; !rc && i < n; ++i)
        for (int g = 0; g < nkv; ++g) {
            size_t src = (size_t)i * stride + (size_t)g * D;
            size_t dst = ((size_t)g * max_seq + (size_t)(pos + i)) * D;
            memcpy(want_k + dst, k + src, (size_t)D * 4);
            memcpy(want_v + dst, v + src, (size_t)D * 4);
        }
    if (!rc) rc = cuda_malloc((void **)&d_k, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_v, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_kc, cache * 4);
    if (!rc) rc = cuda_malloc((void **)&d_vc, cache * 4);
    for (size_t i = 0; !rc && i < cache; ++i)
        got_k[i] = -777.0f;
    if (!rc) rc = cuda_memcpy_to_device(d_kc, got_k, cache * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_vc, got_k, cache * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_v, v, rows * 4);
    if (!rc)
        rc = cuda_kv_store(d_kc, d_vc, d_k, d_v, (size_t)max_seq * D, stride, pos, n, nkv, D, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got_k, d_kc, cache * 4);
    if (!rc) rc = cuda_memcpy_to_host(got_v, d_vc, cache * 4);
    int bad = !rc && (memcmp(got_k, want_k, cache * 4) || memcmp(got_v, want_v, cache * 4));
    printf("%s pos %d, %d tokens, %d kv heads, head_dim %d, row stride %d%s%s\n",
           rc || bad ? "FAIL" : "ok  ", pos, n, nkv, D, stride, rc ? ": " : "",
           rc ? strata_last_error() : "");
    cuda_free(d_k);
    cuda_free(d_v);
    cuda_free(d_kc);
    cuda_free(d_vc);
    free(k), free(v), free(want_k), free(want_v), free(got_k), free(got_v);
    return rc || bad;
}

/* cuda_kv_store_rows: n rows of a decode batch over `slots` slots, each to its own
 * (slot, position), against the same host copy; 0 when bitwise. */
static int check_rows(int slots, int max_seq, int nkv, int D, int stride) {
    enum { ROWS = 5 };
    size_t slot_floats = (size_t)nkv * max_seq * D, cache = (size_t)slots * slot_floats;
    size_t rows = (size_t)ROWS * stride;
    int64_t dst[ROWS];
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *want_k = malloc(cache * 4);
    float *want_v = malloc(cache * 4), *got_k = malloc(cache * 4), *got_v = malloc(cache * 4);
    float *d_k = NULL, *d_v = NULL, *d_kc = NULL, *d_vc = NULL;
    int64_t *d_dst = NULL;
    int rc = k && v && want_k && want_v && got_k && got_v ? 0 : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < rows; ++i)
        k[i] = (float)i + 0.5f, v[i] = -(float)i;
    for (size_t i = 0; !rc && i < cache; ++i)
        want_k[i] = want_v[i] = got_k[i] = -777.0f;
    for (int r = 0; !rc && r < ROWS; ++r) {
        int slot = (r * 2) % slots, pos = (r * 7 + 3) % max_seq;
        dst[r] = (int64_t)((size_t)slot * slot_floats + (size_t)pos * D);
        for (int g = 0; g < nkv; ++g) {
            size_t src = (size_t)r * stride + (size_t)g * D;
            size_t at = (size_t)dst[r] + (size_t)g * max_seq * D;
            memcpy(want_k + at, k + src, (size_t)D * 4);
            memcpy(want_v + at, v + src, (size_t)D * 4);
        }
    }
    if (!rc) rc = cuda_malloc((void **)&d_k, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_v, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_kc, cache * 4);
    if (!rc) rc = cuda_malloc((void **)&d_vc, cache * 4);
    if (!rc) rc = cuda_malloc((void **)&d_dst, sizeof dst);
    if (!rc) rc = cuda_memcpy_to_device(d_kc, got_k, cache * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_vc, got_k, cache * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_v, v, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_dst, dst, sizeof dst);
    if (!rc)
        rc = cuda_kv_store_rows(d_kc, d_vc, d_k, d_v, d_dst, (size_t)max_seq * D, stride, ROWS, nkv,
                                D, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got_k, d_kc, cache * 4);
    if (!rc) rc = cuda_memcpy_to_host(got_v, d_vc, cache * 4);
    int bad = !rc && (memcmp(got_k, want_k, cache * 4) || memcmp(got_v, want_v, cache * 4));
    printf("%s rows: %d rows over %d slots, %d kv heads, head_dim %d, row stride %d%s%s\n",
           rc || bad ? "FAIL" : "ok  ", ROWS, slots, nkv, D, stride, rc ? ": " : "",
           rc ? strata_last_error() : "");
    cuda_free(d_k), cuda_free(d_v), cuda_free(d_kc), cuda_free(d_vc), cuda_free(d_dst);
    free(k), free(v), free(want_k), free(want_v), free(got_k), free(got_v);
    return rc || bad;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = 0;
    failures += check_case(64, 0, 17, 2, 128, 256); /* prefill, row = the kv heads */
    failures += check_case(64, 40, 1, 8, 64, 512);  /* decode */
    failures += check_case(64, 10, 5, 3, 6, 40);    /* a stride wider than the heads */
    failures += check_case(4096, 0, 3000, 1, 128, 128);
    failures += check_rows(3, 32, 2, 128, 256);
    failures += check_rows(4, 16, 3, 6, 40);
    float *d = NULL;
    if (!cuda_malloc((void **)&d, 64)) {
        int refused = cuda_kv_store(d, d, d, d, 4, 4, 0, 2, 1, 4, NULL) == STRATA_EINVAL &&
                      cuda_kv_store(d, d, d, d, 64, 2, 0, 1, 1, 4, NULL) == STRATA_EINVAL;
        printf("%s past the head stride / a short row stride refused\n", refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
