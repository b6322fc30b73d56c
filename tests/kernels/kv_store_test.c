/* cuda_kv_store and cuda_kv_store_rows (kernels/kv_store.h) against reference/ops.h
 * kv_store: the keys and values of a forward item (of a whole batch of rows, each to its own
 * request and position) land in the paged cache exactly where the reference copies them,
 * bit for bit, rows wider than the kv heads (the projection's row stride) included, and
 * nothing else in the pool changes. Every request's blocks lie shuffled in a pool larger
 * than it needs (struct ops_kv's block table), so the paging is what is checked. Prints
 * "skipped: <reason>" without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/kv_store.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

#define SENTINEL (-777.0f) /* must survive outside the rows written */

/* A pool of `pool` blocks [block][nkv][OPS_ATTN_BLOCK][D] and `tables` requests' block tables
 * of `blocks` entries each: every request a distinct shuffled part of the pool. */
struct paged {
    int pool, blocks, tables, nkv, D;
    size_t floats;  /* of the pool */
    int32_t *table; /* [tables][blocks] */
    float *k, *v;   /* host pools, SENTINEL-filled */
};

static int paged_init(struct paged *p, int tables, int positions, int nkv, int D) {
    memset(p, 0, sizeof *p);
    p->blocks = (positions + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
    p->pool = 2 * tables * p->blocks + 1;
    p->tables = tables;
    p->nkv = nkv;
    p->D = D;
    p->floats = (size_t)p->pool * (size_t)nkv * OPS_ATTN_BLOCK * (size_t)D;
    int32_t *ids = malloc((size_t)p->pool * sizeof *ids);
    p->table = malloc((size_t)tables * (size_t)p->blocks * sizeof *p->table);
    p->k = malloc(p->floats * 4);
    p->v = malloc(p->floats * 4);
    if (!ids || !p->table || !p->k || !p->v) {
        free(ids);
        return STRATA_ENOMEM;
    }
    uint32_t state = 12345u + (uint32_t)positions;
    for (int i = 0; i < p->pool; ++i)
        ids[i] = i;
    for (int i = p->pool - 1; i > 0; --i) {
        state = state * 1664525u + 1013904223u;
        const int j = (int)((state >> 8) % (uint32_t)(i + 1));
        const int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    memcpy(p->table, ids, (size_t)tables * (size_t)p->blocks * sizeof *p->table);
    free(ids);
    for (size_t i = 0; i < p->floats; ++i)
        p->k[i] = p->v[i] = SENTINEL;
    return 0;
}

static void paged_free(struct paged *p) {
    free(p->table), free(p->k), free(p->v);
}

/* Request r's view of the pools k, v with the tables at `tables` (host or device). */
static struct ops_kv view_of(const struct paged *p, float *k, float *v, const int32_t *tables,
                             int r) {
    const size_t head = (size_t)OPS_ATTN_BLOCK * (size_t)p->D;
    return (struct ops_kv){.k = k,
                           .v = v,
                           .blocks = tables + (size_t)r * (size_t)p->blocks,
                           .block_stride = (size_t)p->nkv * head,
                           .head_stride = head};
}

/* The device's copy of the pools and tables: d_k, d_v the pools, d_t the tables. */
struct device_pool {
    float *k, *v;
    int32_t *t;
};

static int device_upload(struct device_pool *d, const struct paged *p) {
    const size_t tbytes = (size_t)p->tables * (size_t)p->blocks * sizeof(int32_t);
    memset(d, 0, sizeof *d);
    int rc = cuda_malloc((void **)&d->k, p->floats * 4);
    if (!rc) rc = cuda_malloc((void **)&d->v, p->floats * 4);
    if (!rc) rc = cuda_malloc((void **)&d->t, tbytes);
    if (!rc) rc = cuda_memcpy_to_device(d->k, p->k, p->floats * 4);
    if (!rc) rc = cuda_memcpy_to_device(d->v, p->v, p->floats * 4);
    if (!rc) rc = cuda_memcpy_to_device(d->t, p->table, tbytes);
    return rc;
}

static void device_free(struct device_pool *d) {
    cuda_free(d->k), cuda_free(d->v), cuda_free(d->t);
}

/* 1 when the device pools equal the host's (the reference's) bit for bit. */
static int pools_equal(const struct paged *p, const struct device_pool *d, int *rc) {
    float *k = malloc(p->floats * 4), *v = malloc(p->floats * 4);
    if (!k || !v) *rc = STRATA_ENOMEM;
    if (!*rc) *rc = cuda_memcpy_to_host(k, d->k, p->floats * 4);
    if (!*rc) *rc = cuda_memcpy_to_host(v, d->v, p->floats * 4);
    const int same = !*rc && !memcmp(k, p->k, p->floats * 4) && !memcmp(v, p->v, p->floats * 4);
    free(k), free(v);
    return same;
}

/* 0 when one (pos, n, nkv, D, row stride) case matches reference kv_store bit for bit. */
static int check_case(int pos, int n, int nkv, int D, int stride) {
    struct paged p = {0};
    struct device_pool d = {0};
    size_t rows = (size_t)n * stride;
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *d_k = NULL, *d_v = NULL;
    int rc = k && v ? paged_init(&p, 1, pos + n, nkv, D) : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < rows; ++i)
        k[i] = (float)i * 0.5f + 1.0f, v[i] = -(float)i * 0.25f - 2.0f;
    if (!rc) rc = device_upload(&d, &p); /* before the reference writes the host pools */
    if (!rc) rc = cuda_malloc((void **)&d_k, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_v, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_v, v, rows * 4);
    if (!rc) {
        const struct ops_kv host = view_of(&p, p.k, p.v, p.table, 0);
        const struct ops_kv dev = view_of(&p, d.k, d.v, d.t, 0);
        kv_store(&host, k, v, stride, pos, n, nkv, D);
        rc = cuda_kv_store(&dev, d_k, d_v, stride, pos, n, nkv, D, NULL);
    }
    if (!rc) rc = cuda_synchronize();
    const int same = !rc && pools_equal(&p, &d, &rc);
    printf("%s pos %d, %d tokens, %d kv heads, head_dim %d, row stride %d%s%s\n",
           same ? "ok  " : "FAIL", pos, n, nkv, D, stride, rc ? ": " : "",
           rc ? strata_last_error() : "");
    cuda_free(d_k), cuda_free(d_v);
    device_free(&d);
    paged_free(&p);
    free(k), free(v);
    return !same;
}

/* cuda_kv_store_rows: a decode batch of ROWS rows over `slots` requests (one pool, each
 * request its own table), each row to its own (request, position) by an offset computed on
 * the host from the table (ops_kv_offset), against reference kv_store of each row; 0 when
 * bitwise. */
static int check_rows(int slots, int max_seq, int nkv, int D, int stride) {
    enum { ROWS = 5 };
    struct paged p = {0};
    struct device_pool d = {0};
    size_t rows = (size_t)ROWS * stride;
    int64_t dst[ROWS];
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *d_k = NULL, *d_v = NULL;
    int64_t *d_dst = NULL;
    int rc = k && v ? paged_init(&p, slots, max_seq, nkv, D) : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < rows; ++i)
        k[i] = (float)i + 0.5f, v[i] = -(float)i;
    if (!rc) rc = device_upload(&d, &p);
    for (int r = 0; !rc && r < ROWS; ++r) {
        const int slot = (r * 2) % slots, pos = (r * 7 + 3) % max_seq;
        const struct ops_kv host = view_of(&p, p.k, p.v, p.table, slot);
        dst[r] = (int64_t)ops_kv_offset(&host, 0, pos, D);
        kv_store(&host, k + (size_t)r * stride, v + (size_t)r * stride, stride, pos, 1, nkv, D);
    }
    if (!rc) rc = cuda_malloc((void **)&d_k, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_v, rows * 4);
    if (!rc) rc = cuda_malloc((void **)&d_dst, sizeof dst);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_v, v, rows * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_dst, dst, sizeof dst);
    if (!rc)
        rc = cuda_kv_store_rows(d.k, d.v, d_k, d_v, d_dst, (size_t)OPS_ATTN_BLOCK * D, stride, ROWS,
                                nkv, D, NULL);
    if (!rc) rc = cuda_synchronize();
    const int same = !rc && pools_equal(&p, &d, &rc);
    printf("%s rows: %d rows over %d slots, %d kv heads, head_dim %d, row stride %d%s%s\n",
           same ? "ok  " : "FAIL", ROWS, slots, nkv, D, stride, rc ? ": " : "",
           rc ? strata_last_error() : "");
    cuda_free(d_k), cuda_free(d_v), cuda_free(d_dst);
    device_free(&d);
    paged_free(&p);
    free(k), free(v);
    return !same;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = 0;
    failures += check_case(0, 17, 2, 128, 256); /* prefill, row = the kv heads */
    failures += check_case(40, 1, 8, 64, 512);  /* decode */
    failures += check_case(10, 5, 3, 6, 40);    /* a stride wider than the heads */
    failures += check_case(13, 40, 2, 8, 16);   /* starting mid-block, across four blocks */
    failures += check_case(0, 3000, 1, 128, 128);
    failures += check_rows(3, 32, 2, 128, 256);
    failures += check_rows(4, 16, 3, 6, 40);
    failures += check_rows(2, 100, 2, 8, 16);
    float *d = NULL;
    if (!cuda_malloc((void **)&d, 64)) {
        const struct ops_kv kv = {.k = d, .v = d, .blocks = (const int32_t *)d};
        const struct ops_kv no_table = {.k = d, .v = d};
        int refused = cuda_kv_store(&kv, d, d, 2, 0, 1, 1, 4, NULL) == STRATA_EINVAL &&
                      cuda_kv_store(&no_table, d, d, 4, 0, 1, 1, 4, NULL) == STRATA_EINVAL &&
                      cuda_kv_store(&kv, d, d, 4, -1, 1, 1, 4, NULL) == STRATA_EINVAL &&
                      cuda_kv_store(NULL, NULL, NULL, 4, 0, 0, 1, 4, NULL) == 0;
        printf("%s a short row stride, a view without a table, a negative position refused; n 0 "
               "a no-op\n",
               refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
