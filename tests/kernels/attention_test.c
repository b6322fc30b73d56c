/* cuda_attention (split-K over chunks of CUDA_ATTN_CHUNK positions) against the reference
 * attention of reference/ops.h, at context lengths around the block (16) and chunk (256)
 * boundaries and at long contexts:
 *   - q = 0 makes every score 0 and every exp exactly 1 on both sides, so the output is the
 *     block tree of the values over the tree of ones: bitwise equality there checks that
 *     the chunks and their merge follow the reference's tree exactly;
 *   - random q: NMSE < 1e-7 (the only difference is CUDA's expf, within 2 ulp of glibc's);
 *   - a prefill of n queries equals each query run alone, bit for bit (nothing depends on
 *     n or the chunk grid);
 *   - the cache is paged (struct ops_kv): every problem's blocks lie shuffled in a larger
 *     pool, and the same request in ascending blocks gives the same bits;
 *   - each of these for a cache of f32, bf16 and f16 elements (struct ops_kv's dtype), and
 *     every 16-bit pattern widened exactly: each value read alone (one key: out = v) and
 *     each key's score (cuda_attention_partial_max with one-hot queries) equal to the
 *     reference's, bit for bit (NaN: NaN);
 *   - bad arguments are refused before any launch.
 * Without a usable device (or a build without the CUDA toolkit) it prints "skipped:". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_kvp.h"
#include "kernels/cuda_device.h"
#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

enum { NH = 4, NKV = 2, D = 128 };

static float frand(unsigned *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* A request's keys and values paged as a stage keeps them (reference/kv_cache.h's layout of
 * one layer, [block][NKV][OPS_ATTN_BLOCK][D]) in a pool larger than it needs, its blocks in
 * a shuffled order (with `identity`, ascending from 0: the contiguous case). */
struct problem {
    int pos, n, blocks, pool;
    enum ops_dtype dtype; /* what k and v store */
    float *q;             /* host: q [n, NH*D] */
    void *k, *v;          /* the pools [pool][NKV][16][D] of dtype elements */
    int32_t *table;       /* [blocks] */
};

static const char *dtype_name(enum ops_dtype dtype) {
    return dtype == OPS_F32 ? "f32" : dtype == OPS_BF16 ? "bf16" : "f16";
}

/* Element i of a pool: x as the cache stores it. */
static void put(void *pool, enum ops_dtype dtype, size_t i, float x) {
    if (dtype == OPS_F32)
        ((float *)pool)[i] = x;
    else
        ((uint16_t *)pool)[i] = dtype == OPS_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
}

static int make(struct problem *p, int pos, int n, int zero_q, unsigned seed, int identity,
                enum ops_dtype dtype) {
    p->pos = pos;
    p->n = n;
    p->dtype = dtype;
    p->blocks = (pos + n + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
    p->pool = p->blocks + 3;
    const size_t qn = (size_t)n * NH * D, block = (size_t)NKV * OPS_ATTN_BLOCK * D;
    const size_t kvn = (size_t)p->pool * block;
    p->q = malloc(qn * sizeof(float));
    p->k = malloc(kvn * ops_kv_elem_bytes(dtype));
    p->v = malloc(kvn * ops_kv_elem_bytes(dtype));
    p->table = malloc((size_t)p->pool * sizeof(int32_t));
    if (!p->q || !p->k || !p->v || !p->table) return -1;
    for (size_t i = 0; i < qn; ++i)
        p->q[i] = zero_q ? 0.0f : frand(&seed);
    /* The contents, position by position, do not depend on the table: drawn block by
     * block of the request in logical order, each stored where the table says. */
    unsigned shuffle = seed ^ 0x5bd1e995u;
    for (int b = 0; b < p->pool; ++b)
        p->table[b] = b;
    for (int b = p->pool - 1; b > 0 && !identity; --b) {
        shuffle = shuffle * 1664525u + 1013904223u;
        const int j = (int)((shuffle >> 8) % (unsigned)(b + 1));
        const int32_t t = p->table[b];
        p->table[b] = p->table[j], p->table[j] = t;
    }
    for (size_t i = 0; i < kvn; ++i) { /* the unused blocks too (never read) */
        put(p->k, dtype, i, 1e30f);
        put(p->v, dtype, i, 1e30f);
    }
    for (int b = 0; b < p->blocks; ++b)
        for (size_t i = 0; i < block; ++i) {
            put(p->k, dtype, (size_t)p->table[b] * block + i, frand(&seed));
            put(p->v, dtype, (size_t)p->table[b] * block + i, frand(&seed));
        }
    return 0;
}

static void release(struct problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->table);
}

static struct ops_kv view_of(void *k, void *v, const int32_t *table, enum ops_dtype dtype) {
    const size_t head = (size_t)OPS_ATTN_BLOCK * D;
    return (struct ops_kv){.k = k,
                           .v = v,
                           .blocks = table,
                           .block_stride = NKV * head,
                           .head_stride = head,
                           .dtype = dtype};
}

/* out [n, NH*D] by the reference (scratch per pool thread). */
static int run_reference(float *out, const struct problem *p, struct thread_pool *pool) {
    float *scratch = malloc((size_t)thread_pool_size(pool) *
                            attention_scratch_floats(p->pos + p->n, NH, NKV, D) * sizeof(float));
    if (!scratch) return -1;
    const struct ops_kv kv = view_of(p->k, p->v, p->table, p->dtype);
    attention(out, p->q, &kv, scratch, p->pos, p->n, NH, NKV, D, pool);
    free(scratch);
    return 0;
}

/* Queries [i0, i0 + n) of the problem on the device, as one call at pos + i0. */
static int run_device(float *out, const struct problem *p, int i0, int n) {
    size_t kvn = (size_t)p->pool * NKV * OPS_ATTN_BLOCK * D * ops_kv_elem_bytes(p->dtype);
    size_t qn = (size_t)n * NH * D;
    size_t scratch_n = cuda_attention_scratch_floats(p->pos + i0, n, NH, D);
    float *d_q = NULL, *d_out = NULL, *d_scratch = NULL;
    void *d_k = NULL, *d_v = NULL;
    int32_t *d_table = NULL;
    int rc = cuda_malloc((void **)&d_q, qn * sizeof(float));
    if (!rc) rc = cuda_malloc(&d_k, kvn);
    if (!rc) rc = cuda_malloc(&d_v, kvn);
    if (!rc) rc = cuda_malloc((void **)&d_out, qn * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_scratch, scratch_n * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_table, (size_t)p->blocks * sizeof(int32_t));
    if (!rc) rc = cuda_memcpy_to_device(d_q, p->q + (size_t)i0 * NH * D, qn * sizeof(float));
    if (!rc) rc = cuda_memcpy_to_device(d_k, p->k, kvn);
    if (!rc) rc = cuda_memcpy_to_device(d_v, p->v, kvn);
    if (!rc) rc = cuda_memcpy_to_device(d_table, p->table, (size_t)p->blocks * sizeof(int32_t));
    const struct ops_kv kv = view_of(d_k, d_v, d_table, p->dtype);
    if (!rc) rc = cuda_attention(d_out, d_q, &kv, d_scratch, p->pos + i0, n, NH, NKV, D, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(out, d_out, qn * sizeof(float));
    cuda_free(d_q);
    cuda_free(d_k);
    cuda_free(d_v);
    cuda_free(d_out);
    cuda_free(d_scratch);
    cuda_free(d_table);
    return rc;
}

/* One problem: reference vs device over all n queries; bitwise when q = 0, else NMSE. */
static int check_problem(int pos, int n, int zero_q, struct thread_pool *pool,
                         enum ops_dtype dtype) {
    struct problem p = {0};
    size_t qn = (size_t)n * NH * D;
    float *want = malloc(qn * sizeof(float)), *got = malloc(qn * sizeof(float));
    char what[160];
    snprintf(what, sizeof what, "%s pos %d n %d %s", dtype_name(dtype), pos, n,
             zero_q ? "q=0 bitwise" : "nmse < 1e-7");
    int rc = !want || !got || make(&p, pos, n, zero_q, 1234u + (unsigned)pos, 0, dtype) ? -1 : 0;
    if (!rc) rc = run_reference(want, &p, pool);
    if (!rc) rc = run_device(got, &p, 0, n);
    int ok = !rc;
    if (ok && zero_q) {
        ok = !memcmp(want, got, qn * sizeof(float));
    } else if (ok) {
        double err = 0, ref = 0;
        for (size_t i = 0; i < qn; ++i) {
            err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
            ref += (double)want[i] * want[i];
        }
        printf("  %s: nmse=%.3e\n", what, ref > 0 ? err / ref : err);
        ok = ref > 0 ? err / ref < 1e-7 : err == 0;
    }
    release(&p);
    free(want);
    free(got);
    return kernel_test_check(ok, what);
}

/* A prefill of n queries equals each query alone, bit for bit. */
static int check_batch_invariance(int pos, int n) {
    struct problem p = {0};
    size_t row = (size_t)NH * D;
    float *all = malloc((size_t)n * row * sizeof(float)), *one = malloc(row * sizeof(float));
    int rc = !all || !one || make(&p, pos, n, 0, 99u, 0, OPS_F32) ? -1 : 0;
    if (!rc) rc = run_device(all, &p, 0, n);
    int same = !rc;
    for (int i = 0; i < n && same; ++i) {
        rc = run_device(one, &p, i, 1);
        same = !rc && !memcmp(one, all + (size_t)i * row, row * sizeof(float));
    }
    release(&p);
    free(all);
    free(one);
    char what[96];
    snprintf(what, sizeof what, "pos %d: %d queries in one call == each alone", pos, n);
    return kernel_test_check(same, what);
}

/* The same request in shuffled blocks and in ascending ones gives the same bits. */
static int check_placement(int pos, int n, enum ops_dtype dtype) {
    struct problem shuffled = {0}, ascending = {0};
    size_t qn = (size_t)n * NH * D;
    float *a = malloc(qn * sizeof(float)), *b = malloc(qn * sizeof(float));
    int rc = !a || !b || make(&shuffled, pos, n, 0, 7u, 0, dtype) ||
             make(&ascending, pos, n, 0, 7u, 1, dtype);
    if (!rc) rc = run_device(a, &shuffled, 0, n);
    if (!rc) rc = run_device(b, &ascending, 0, n);
    const int same = !rc && !memcmp(a, b, qn * sizeof(float));
    release(&shuffled);
    release(&ascending);
    free(a);
    free(b);
    char what[96];
    snprintf(what, sizeof what, "%s pos %d n %d: shuffled blocks == ascending blocks, bitwise",
             dtype_name(dtype), pos, n);
    return kernel_test_check(same, what);
}

/* Equal bits, or both NaN (a device's NaN payload is its own). */
static int same_or_nan(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (memcmp(&a[i], &b[i], sizeof a[i]) && !(a[i] != a[i] && b[i] != b[i])) return 0;
    return 1;
}

/* Every 16-bit pattern of `dtype` as a value read alone: one position (ctx 1), q = 0, so its
 * one weight is exactly 1 and out = 0 + 1 * v, then * (1 / 1): the widened value (-0 gives
 * +0 on both sides) through cuda_attention against the reference's, bit for bit. VN kv
 * heads (= query heads) of VD elements: 2^16 / (VN * VD) calls. */
static int check_widen_values(enum ops_dtype dtype, struct thread_pool *pool) {
    enum { VN = 64, VD = 256, PER = VN * VD };
    const size_t block = (size_t)VN * OPS_ATTN_BLOCK * VD;
    uint16_t *k = calloc(block, 2), *v = calloc(block, 2);
    float *q = calloc(PER, sizeof(float)), *want = malloc(PER * sizeof(float));
    float *got = malloc(PER * sizeof(float));
    float *scratch = malloc(attention_scratch_floats(1, VN, VN, VD) * sizeof(float));
    const int32_t table[1] = {0};
    void *d_k = NULL, *d_v = NULL;
    float *d_q = NULL, *d_out = NULL, *d_scratch = NULL;
    int32_t *d_table = NULL;
    int rc = k && v && q && want && got && scratch ? 0 : -1, same = 1;
    if (!rc) rc = cuda_malloc(&d_k, block * 2);
    if (!rc) rc = cuda_malloc(&d_v, block * 2);
    if (!rc) rc = cuda_malloc((void **)&d_q, PER * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_out, PER * sizeof(float));
    if (!rc)
        rc = cuda_malloc((void **)&d_scratch,
                         cuda_attention_scratch_floats(0, 1, VN, VD) * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_table, sizeof table);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, block * 2); /* keys 0: every score 0 */
    if (!rc) rc = cuda_memcpy_to_device(d_q, q, PER * sizeof(float));
    if (!rc) rc = cuda_memcpy_to_device(d_table, table, sizeof table);
    for (int first = 0; first < 65536 && !rc && same; first += PER) {
        /* Position 0 of kv head g: pattern first + g * VD + d. */
        for (int g = 0; g < VN; ++g)
            for (int d = 0; d < VD; ++d)
                v[(size_t)g * OPS_ATTN_BLOCK * VD + (size_t)d] = (uint16_t)(first + g * VD + d);
        const size_t head = (size_t)OPS_ATTN_BLOCK * VD;
        const struct ops_kv host = {.k = k,
                                    .v = v,
                                    .blocks = table,
                                    .block_stride = VN * head,
                                    .head_stride = head,
                                    .dtype = dtype};
        struct ops_kv dev = host;
        dev.k = d_k, dev.v = d_v, dev.blocks = d_table;
        attention(want, q, &host, scratch, 0, 1, VN, VN, VD, pool);
        if (!rc) rc = cuda_memcpy_to_device(d_v, v, block * 2);
        if (!rc) rc = cuda_attention(d_out, d_q, &dev, d_scratch, 0, 1, VN, VN, VD, NULL);
        if (!rc) rc = cuda_synchronize();
        if (!rc) rc = cuda_memcpy_to_host(got, d_out, PER * sizeof(float));
        same = !rc && same_or_nan(want, got, PER);
    }
    cuda_free(d_k), cuda_free(d_v), cuda_free(d_q), cuda_free(d_out), cuda_free(d_scratch);
    cuda_free(d_table);
    free(k), free(v), free(q), free(want), free(got), free(scratch);
    char what[96];
    snprintf(what, sizeof what, "%s: all 65536 values widened exactly (attention of one key)",
             dtype_name(dtype));
    return kernel_test_check(!rc && same, what);
}

/* Every 16-bit pattern of `dtype` as a key: KN positions of one kv head, KD queries, query i
 * one-hot at d = i, so each score is 0 * k (+-0, NaN for inf / NaN keys) summed with 1 * k[i]
 * times the scale: cuda_attention_partial_max's scores against the reference's, bit for bit
 * (NaN: NaN). */
static int check_widen_keys(enum ops_dtype dtype, struct thread_pool *pool) {
    enum { KN = 512, KD = 128, KQ = KD, CELLS = KN * KD };
    const int blocks = KN / OPS_ATTN_BLOCK;
    uint16_t *k = malloc((size_t)CELLS * 2);
    float *q = calloc((size_t)KQ * KD, sizeof(float)), *want = malloc((size_t)KQ * KN * 4);
    float *got = malloc((size_t)KQ * KN * 4), max[KQ];
    int32_t table[KN / OPS_ATTN_BLOCK];
    void *d_k = NULL;
    float *d_q = NULL, *d_scores = NULL, *d_max = NULL;
    int32_t *d_table = NULL;
    int rc = k && q && want && got ? 0 : -1;
    for (int b = 0; b < blocks; ++b)
        table[b] = (b * 7) % blocks; /* 7 is prime to 32: a permutation */
    for (int i = 0; !rc && i < CELLS; ++i)
        k[i] = (uint16_t)i;
    for (int i = 0; !rc && i < KQ; ++i)
        q[(size_t)i * KD + (size_t)i] = 1.0f;
    const size_t head = (size_t)OPS_ATTN_BLOCK * KD;
    const struct ops_kv host = {
        .k = k, .v = k, .blocks = table, .block_stride = head, .head_stride = head, .dtype = dtype};
    if (!rc) /* queries at positions KN - 1 ..: every one sees all KN keys */
        attention_partial_max(max, want, q, &host, KN - 1, KQ, 0, KN, 1, 1, KD, pool);
    if (!rc) rc = cuda_malloc(&d_k, (size_t)CELLS * 2);
    if (!rc) rc = cuda_malloc((void **)&d_q, (size_t)KQ * KD * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_scores, (size_t)KQ * KN * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_max, (size_t)KQ * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_table, sizeof table);
    if (!rc) rc = cuda_memcpy_to_device(d_k, k, (size_t)CELLS * 2);
    if (!rc) rc = cuda_memcpy_to_device(d_q, q, (size_t)KQ * KD * sizeof(float));
    if (!rc) rc = cuda_memcpy_to_device(d_table, table, sizeof table);
    struct ops_kv dev = host;
    dev.k = dev.v = d_k, dev.blocks = d_table;
    if (!rc)
        rc = cuda_attention_partial_max(d_max, d_scores, d_q, &dev, KN - 1, KQ, 0, KN, 1, 1, KD,
                                        NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, d_scores, (size_t)KQ * KN * sizeof(float));
    const int same = !rc && same_or_nan(want, got, (size_t)KQ * KN);
    cuda_free(d_k), cuda_free(d_q), cuda_free(d_scores), cuda_free(d_max), cuda_free(d_table);
    free(k), free(q), free(want), free(got);
    char what[96];
    snprintf(what, sizeof what, "%s: all 65536 keys widened exactly (partial_max scores)",
             dtype_name(dtype));
    return kernel_test_check(same, what);
}

int main(void) {
    if (!kernel_test_device()) return 0;
    struct thread_pool *pool = NULL;
    if (thread_pool_init(&pool, 1)) {
        printf("FAIL thread pool: %s\n", strata_last_error());
        return 1;
    }
    int failures = 0;
    float *d = NULL;
    failures += kernel_test_check(cuda_malloc((void **)&d, 64 * sizeof(float)) == 0, "cuda_malloc");
    const struct ops_kv dk = {
        .k = d, .v = d, .blocks = (const int32_t *)d, .block_stride = 64, .head_stride = 16};
    const struct ops_kv no_table = {.k = d, .v = d, .blocks = NULL};
    failures += kernel_test_check(
        cuda_attention(d, d, &dk, d, 0, 1, 3, 2, 4, NULL) == STRATA_EINVAL, "nh % nkv refused");
    failures += kernel_test_check(
        cuda_attention(d, d, &dk, d, 0, 1, 2, 2, OPS_ATTN_MAX_HEAD_DIM + 1, NULL) == STRATA_EINVAL,
        "head_dim over the maximum refused");
    failures += kernel_test_check(
        cuda_attention(NULL, d, &dk, d, 0, 1, 2, 2, 4, NULL) == STRATA_EINVAL, "NULL refused");
    failures +=
        kernel_test_check(cuda_attention(d, d, &no_table, d, 0, 1, 2, 2, 4, NULL) == STRATA_EINVAL,
                          "a view without a block table refused");
    failures += kernel_test_check(cuda_attention(NULL, NULL, NULL, NULL, 0, 0, 2, 2, 4, NULL) == 0,
                                  "n 0 is a no-op");
    failures += kernel_test_check(cuda_synchronize() == 0, "no fault after refused calls");
    cuda_free(d);
    /* Context lengths around the block (16) and chunk (256) boundaries, and long ones. */
    static const int ctx[] = {1, 15, 16, 17, 255, 256, 257, 511, 513, 1000, 4097, 40000};
    for (size_t i = 0; i < sizeof ctx / sizeof ctx[0]; ++i) {
        failures += check_problem(ctx[i] - 1, 1, 1, pool, OPS_F32);
        failures += check_problem(ctx[i] - 1, 1, 0, pool, OPS_F32);
    }
    failures += check_problem(200, 100, 1, pool, OPS_F32); /* prefill across chunk boundaries */
    failures += check_problem(200, 100, 0, pool, OPS_F32);
    failures += check_batch_invariance(200, 100);
    static const enum ops_dtype dtypes[] = {OPS_F32, OPS_BF16, OPS_F16};
    for (int t = 0; t < 3; ++t) {
        failures += check_placement(0, 1, dtypes[t]);
        failures += check_placement(700, 40, dtypes[t]);
    }
    /* A 16-bit cache: the same checks at a few lengths, and every pattern widened exactly. */
    static const int ctx16[] = {1, 17, 256, 513, 4097};
    for (int t = 1; t < 3; ++t) {
        for (size_t i = 0; i < sizeof ctx16 / sizeof ctx16[0]; ++i) {
            failures += check_problem(ctx16[i] - 1, 1, 1, pool, dtypes[t]);
            failures += check_problem(ctx16[i] - 1, 1, 0, pool, dtypes[t]);
        }
        failures += check_problem(200, 100, 1, pool, dtypes[t]);
        failures += check_problem(200, 100, 0, pool, dtypes[t]);
        failures += check_widen_values(dtypes[t], pool);
        failures += check_widen_keys(dtypes[t], pool);
    }
    thread_pool_free(pool);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
