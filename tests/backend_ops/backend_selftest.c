/* Two host-memory backends that check the harness itself on machines without a GPU, through
 * the same alloc/upload/run/download/NMSE path the CUDA backend takes:
 *   host    the reference ops called through that path: every case must pass;
 *   broken  deliberately wrong ops: every case must fail, so a kernel that is slightly off
 *           (1e-3 relative), never writes its output (NaN), or leaves an in-place buffer
 *           untouched cannot pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "tests/backend_ops/backend_ops.h"

static int host_available(char *reason, size_t cap) {
    snprintf(reason, cap, "host memory, reference ops through the backend path");
    return 1;
}

static int broken_available(char *reason, size_t cap) {
    snprintf(reason, cap, "deliberately wrong ops, every case below must FAIL");
    return 1;
}

static int host_alloc(void **ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? 0 : strata_set_error(STRATA_ENOMEM, "host_alloc %zu bytes", bytes);
}

static int host_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return 0;
}

static int host_sync(void) {
    return 0;
}

static int host_rmsnorm(const struct bo_call *c, void *stream) {
    (void)stream;
    rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->s->eps, c->s->n, c->s->dim);
    return 0;
}

static int host_vec_add(const struct bo_call *c, void *stream) {
    (void)stream;
    vec_add(c->buf[0], c->buf[1], c->s->n);
    return 0;
}

static int host_swiglu(const struct bo_call *c, void *stream) {
    (void)stream;
    swiglu(c->buf[0], c->buf[1], c->buf[2], c->s->n);
    return 0;
}

/* The reference's KVP steps over the case's ranks (the CUDA adapter's sequence in
 * backend_cuda.c on host memory, each rank's view its blocks of the one table): checks the
 * attention_kvp cases and that sequence against one rank's attention(), which the reference
 * matches bit for bit. */
static int host_attention_kvp(const struct bo_call *c, void *stream) {
    (void)stream;
    const struct bo_shape *s = c->s;
    const int K = s->rows, tokens = bo_kvp_tokens(s), D = s->dim, ctx = s->pos + s->n;
    const size_t rows_nh = (size_t)s->n * (size_t)s->heads;
    const size_t part = rows_nh * (size_t)(D + 2), per_scores = rows_nh * (size_t)tokens;
    const struct ops_kv whole = bo_kv_view(s, c->buf[2], c->buf[3], c->buf[4]);
    struct thread_pool *pool = NULL;
    float *scores = malloc((size_t)K * per_scores * sizeof(float));
    float *max = malloc(rows_nh * sizeof(float));
    float *max_all = malloc((size_t)K * rows_nh * sizeof(float));
    float *parts = malloc((size_t)K * part * sizeof(float));
    int rc = scores && max && max_all && parts ? thread_pool_init(&pool, 1) : STRATA_ENOMEM;
    for (int k = 0; k < K && !rc; ++k) { /* rank k: the request's blocks from lo / 16 on */
        const int lo = k * tokens, held = ctx - lo < tokens ? ctx - lo : tokens;
        struct ops_kv kv = whole;
        kv.blocks += lo / OPS_ATTN_BLOCK;
        attention_partial_max(max_all + (size_t)k * rows_nh, scores + (size_t)k * per_scores,
                              c->buf[1], &kv, s->pos, s->n, lo, held, s->heads, s->kv_heads, D,
                              pool);
    }
    for (int k = 0; k < K && !rc; ++k) {
        const int lo = k * tokens, held = ctx - lo < tokens ? ctx - lo : tokens;
        struct ops_kv kv = whole;
        kv.blocks += lo / OPS_ATTN_BLOCK;
        memcpy(max, max_all + (size_t)k * rows_nh, rows_nh * sizeof(float));
        for (size_t t = 0; t < rows_nh; ++t)
            for (int r = 0; r < K; ++r)
                if (max_all[(size_t)r * rows_nh + t] > max[t]) max[t] = max_all[r * rows_nh + t];
        attention_partial(parts + (size_t)k * part, scores + (size_t)k * per_scores, max, &kv,
                          s->pos, s->n, lo, held, s->heads, s->kv_heads, D, pool);
    }
    if (!rc) attention_merge(c->buf[0], parts, K, s->n, s->heads, D);
    if (pool) thread_pool_free(pool);
    free(scores), free(max), free(max_all), free(parts);
    return rc ? strata_set_error(STRATA_ENOMEM, "host attention_kvp") : 0;
}

/* 1e-3 relative error everywhere: NMSE 1e-6, ten times the fp32 bound. */
static int broken_rmsnorm(const struct bo_call *c, void *stream) {
    host_rmsnorm(c, stream);
    float *out = c->buf[0];
    for (size_t i = 0; i < (size_t)c->s->n * (size_t)c->s->dim; ++i)
        out[i] *= 1.001f;
    return 0;
}

static int broken_nothing(const struct bo_call *c, void *stream) {
    (void)c, (void)stream;
    return 0;
}

static const struct bo_backend_op host_ops[] = {
    {"rmsnorm", host_rmsnorm},
    {"swiglu", host_swiglu},
    {"vec_add", host_vec_add},
    {"attention_kvp", host_attention_kvp},
};

static const struct bo_backend_op broken_ops[] = {
    {"rmsnorm", broken_rmsnorm}, /* slightly off */
    {"swiglu", broken_nothing},  /* output never written: stays NaN */
    {"vec_add", broken_nothing}, /* in-place buffer untouched */
};

const struct bo_backend bo_backend_host = {
    .name = "host",
    .available = host_available,
    .alloc = host_alloc,
    .free = free,
    .upload = host_copy,
    .download = host_copy,
    .synchronize = host_sync,
    .ops = host_ops,
    .n_ops = sizeof host_ops / sizeof host_ops[0],
};

const struct bo_backend bo_backend_broken = {
    .name = "broken",
    .available = broken_available,
    .alloc = host_alloc,
    .free = free,
    .upload = host_copy,
    .download = host_copy,
    .synchronize = host_sync,
    .ops = broken_ops,
    .n_ops = sizeof broken_ops / sizeof broken_ops[0],
};
