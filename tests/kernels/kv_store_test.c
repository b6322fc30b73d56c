/* cuda_kv_store and cuda_kv_store_rows (kernels/kv_store.h) against reference/ops.h
 * kv_store: the keys and values of a forward item (of a whole batch of rows, each to its own
 * request and position) land in the paged cache exactly where the reference copies them,
 * bit for bit, rows wider than the kv heads (the projection's row stride) included, and
 * nothing else in the pool changes. Every request's blocks lie shuffled in a pool larger
 * than it needs (struct ops_kv's block table), so the paging is what is checked. Each case
 * runs for every stored dtype (f32, bf16, f16), and a rounding case per dtype feeds every
 * f16 value, the ties between neighbours and random bit patterns (NaN, infinities,
 * subnormals), so the device's narrowing is dtype.h's bit for bit. Prints
 * "skipped: <reason>" without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/kv_store.h"
#include "reference/ops.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

#define SENTINEL 0xa5 /* every byte of the pools outside the rows written */

/* A pool of `pool` blocks [block][nkv][OPS_ATTN_BLOCK][D] of `dtype` elements and `tables`
 * requests' block tables of `blocks` entries each: every request a distinct shuffled part of
 * the pool. */
struct paged {
    int pool, blocks, tables, nkv, D;
    enum ops_dtype dtype;
    size_t bytes;         /* of the pool */
    int32_t *table;       /* [tables][blocks] */
    unsigned char *k, *v; /* host pools, SENTINEL-filled */
};

static int paged_init(struct paged *p, int tables, int positions, int nkv, int D,
                      enum ops_dtype dtype) {
    memset(p, 0, sizeof *p);
    p->blocks = (positions + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
    p->pool = 2 * tables * p->blocks + 1;
    p->tables = tables;
    p->nkv = nkv;
    p->D = D;
    p->dtype = dtype;
    p->bytes =
        (size_t)p->pool * (size_t)nkv * OPS_ATTN_BLOCK * (size_t)D * ops_kv_elem_bytes(dtype);
    int32_t *ids = malloc((size_t)p->pool * sizeof *ids);
    p->table = malloc((size_t)tables * (size_t)p->blocks * sizeof *p->table);
    p->k = malloc(p->bytes);
    p->v = malloc(p->bytes);
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
    memset(p->k, SENTINEL, p->bytes);
    memset(p->v, SENTINEL, p->bytes);
    return 0;
}

static void paged_free(struct paged *p) {
    free(p->table), free(p->k), free(p->v);
}

/* Request r's view of the pools k, v with the tables at `tables` (host or device). */
static struct ops_kv view_of(const struct paged *p, void *k, void *v, const int32_t *tables,
                             int r) {
    const size_t head = (size_t)OPS_ATTN_BLOCK * (size_t)p->D;
    return (struct ops_kv){.k = k,
                           .v = v,
                           .blocks = tables + (size_t)r * (size_t)p->blocks,
                           .block_stride = (size_t)p->nkv * head,
                           .head_stride = head,
                           .dtype = p->dtype};
}

/* The device's copy of the pools and tables: d_k, d_v the pools, d_t the tables. */
struct device_pool {
    void *k, *v;
    int32_t *t;
};

static int device_upload(struct device_pool *d, const struct paged *p) {
    const size_t tbytes = (size_t)p->tables * (size_t)p->blocks * sizeof(int32_t);
    memset(d, 0, sizeof *d);
    int rc = cuda_malloc(&d->k, p->bytes);
    if (!rc) rc = cuda_malloc(&d->v, p->bytes);
    if (!rc) rc = cuda_malloc((void **)&d->t, tbytes);
    if (!rc) rc = cuda_memcpy_to_device(d->k, p->k, p->bytes);
    if (!rc) rc = cuda_memcpy_to_device(d->v, p->v, p->bytes);
    if (!rc) rc = cuda_memcpy_to_device(d->t, p->table, tbytes);
    return rc;
}

static void device_free(struct device_pool *d) {
    cuda_free(d->k), cuda_free(d->v), cuda_free(d->t);
}

/* 1 when the device pools equal the host's (the reference's) bit for bit. */
static int pools_equal(const struct paged *p, const struct device_pool *d, int *rc) {
    unsigned char *k = malloc(p->bytes), *v = malloc(p->bytes);
    if (!k || !v) *rc = STRATA_ENOMEM;
    if (!*rc) *rc = cuda_memcpy_to_host(k, d->k, p->bytes);
    if (!*rc) *rc = cuda_memcpy_to_host(v, d->v, p->bytes);
    const int same = !*rc && !memcmp(k, p->k, p->bytes) && !memcmp(v, p->v, p->bytes);
    free(k), free(v);
    return same;
}

static const char *dtype_name(enum ops_dtype dtype) {
    return dtype == OPS_F32 ? "f32 " : dtype == OPS_BF16 ? "bf16" : "f16 ";
}

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* Input i of the rounding cases: every f16 value and the f32 values just below, at and above
 * the halfway point to the next (ties to even), bf16's ties and their neighbours, f16
 * subnormal ties, and random bit patterns (NaNs of every payload, infinities, f32
 * subnormals, overflow past f16's 65504). */
static float rounding_input(size_t i, uint32_t *state) {
    const uint32_t h = (uint32_t)(i / 8) & 0xffffu;
    *state = *state * 1664525u + 1013904223u;
    switch (i % 8) {
    case 0: return from_bits(*state ^ (*state << 13));
    case 1: return f16_to_f32((uint16_t)h);
    case 2: return from_bits(to_bits(f16_to_f32((uint16_t)h)) + 0x1000u);
    case 3: return from_bits(to_bits(f16_to_f32((uint16_t)h)) + 0xfffu);
    case 4: return from_bits(to_bits(f16_to_f32((uint16_t)h)) + 0x1001u);
    case 5: return from_bits(h << 16 | 0x8000u);
    case 6: return from_bits(h << 16 | (h & 1 ? 0x7fffu : 0x8001u));
    default: /* odd multiples of 2^-25: the ties of f16's subnormals (and small normals) */
        return (h & 1 ? -1.0f : 1.0f) * (float)(2 * (h >> 1) + 1) * 0x1p-25f;
    }
}

/* 0 when one (pos, n, nkv, D, row stride) case matches reference kv_store bit for bit;
 * `rounding`: the inputs are rounding_input's instead of plain ramps. */
static int check_case(int pos, int n, int nkv, int D, int stride, enum ops_dtype dtype,
                      int rounding) {
    struct paged p = {0};
    struct device_pool d = {0};
    size_t rows = (size_t)n * stride;
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *d_k = NULL, *d_v = NULL;
    int rc = k && v ? paged_init(&p, 1, pos + n, nkv, D, dtype) : STRATA_ENOMEM;
    uint32_t state = 777u;
    for (size_t i = 0; !rc && i < rows; ++i) {
        k[i] = rounding ? rounding_input(i, &state) : (float)i * 0.5f + 1.0f;
        v[i] = rounding ? rounding_input(rows - 1 - i, &state) : -(float)i * 0.25f - 2.0f;
    }
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
    printf("%s %s pos %d, %d tokens, %d kv heads, head_dim %d, row stride %d%s%s%s\n",
           same ? "ok  " : "FAIL", dtype_name(dtype), pos, n, nkv, D, stride,
           rounding ? ", rounding cases" : "", rc ? ": " : "", rc ? strata_last_error() : "");
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
static int check_rows(int slots, int max_seq, int nkv, int D, int stride, enum ops_dtype dtype) {
    enum { ROWS = 5 };
    struct paged p = {0};
    struct device_pool d = {0};
    size_t rows = (size_t)ROWS * stride;
    int64_t dst[ROWS];
    float *k = malloc(rows * 4), *v = malloc(rows * 4), *d_k = NULL, *d_v = NULL;
    int64_t *d_dst = NULL;
    int rc = k && v ? paged_init(&p, slots, max_seq, nkv, D, dtype) : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < rows; ++i)
        k[i] = (float)i + 0.5f + (float)i * 1e-4f, v[i] = -(float)i / 3.0f;
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
        rc = cuda_kv_store_rows(d.k, d.v, dtype, d_k, d_v, d_dst, (size_t)OPS_ATTN_BLOCK * D,
                                stride, ROWS, nkv, D, NULL);
    if (!rc) rc = cuda_synchronize();
    const int same = !rc && pools_equal(&p, &d, &rc);
    printf("%s %s rows: %d rows over %d slots, %d kv heads, head_dim %d, row stride %d%s%s\n",
           same ? "ok  " : "FAIL", dtype_name(dtype), ROWS, slots, nkv, D, stride, rc ? ": " : "",
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
    static const enum ops_dtype dtypes[] = {OPS_F32, OPS_BF16, OPS_F16};
    for (int t = 0; t < 3; ++t) {
        const enum ops_dtype dt = dtypes[t];
        failures += check_case(0, 17, 2, 128, 256, dt, 0); /* prefill, row = the kv heads */
        failures += check_case(40, 1, 8, 64, 512, dt, 0);  /* decode */
        failures += check_case(10, 5, 3, 6, 40, dt, 0);    /* a stride wider than the heads */
        failures += check_case(13, 40, 2, 8, 16, dt, 0);   /* mid-block, across four blocks */
        failures += check_case(0, 3000, 1, 128, 128, dt, 0);
        /* 65536 x 8 rounding inputs: every f16 value, its ties and neighbours, bf16's. */
        failures += check_case(3, 2048, 2, 128, 256, dt, 1);
        failures += check_rows(3, 32, 2, 128, 256, dt);
        failures += check_rows(4, 16, 3, 6, 40, dt);
        failures += check_rows(2, 100, 2, 8, 16, dt);
    }
    float *d = NULL;
    if (!cuda_malloc((void **)&d, 64)) {
        const struct ops_kv kv = {.k = d, .v = d, .blocks = (const int32_t *)d};
        const struct ops_kv no_table = {.k = d, .v = d};
        const struct ops_kv q8 = {.k = d, .v = d, .blocks = (const int32_t *)d, .dtype = OPS_Q8};
        int64_t *rows = (int64_t *)d;
        int refused =
            cuda_kv_store(&kv, d, d, 2, 0, 1, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_kv_store(&no_table, d, d, 4, 0, 1, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_kv_store(&kv, d, d, 4, -1, 1, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_kv_store(&q8, d, d, 4, 0, 1, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_kv_store_rows(d, d, OPS_Q8, d, d, rows, 4, 4, 1, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_kv_store(NULL, NULL, NULL, 4, 0, 0, 1, 4, NULL) == 0;
        printf("%s a short row stride, a view without a table, a negative position, a dtype "
               "other than f32 / bf16 / f16 refused; n 0 a no-op\n",
               refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
