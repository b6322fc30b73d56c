/* The reference ops the harness knows (bo_ops) and the shapes they are tested on
 * (bo_cases). Shapes include a single row / element, sizes that are not a multiple of any
 * block or vector width, and model-sized rows. Integer outputs (moe_route's expert ids)
 * must be equal. Not in the table yet: rope_cos_sin (an int section table input; its CUDA
 * twin is checked by tests/kernels/rope_cos_sin_test.c). */
#include <stdlib.h>

#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/backend_ops/backend_ops.h"

#define BUF(name_, role_, count_, gen_) ((struct bo_buf){name_, role_, BO_F32, count_, gen_})

static size_t sz(int a, int b) {
    return (size_t)a * (size_t)b;
}

/* ---------------------------------------------------------------- rmsnorm */

static int rmsnorm_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("out", BO_OUT, sz(s->n, s->dim), BO_GEN_ACT);
    b[1] = BUF("x", BO_IN, sz(s->n, s->dim), BO_GEN_ACT);
    b[2] = BUF("weight", BO_IN, (size_t)s->dim, BO_GEN_WEIGHT);
    return 3;
}

static int rmsnorm_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->s->eps, c->s->n, c->s->dim);
    return 0;
}

/* add_rmsnorm: h [n, dim] += y, out = rmsnorm(h). */
static int add_rmsnorm_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("out", BO_OUT, sz(s->n, s->dim), BO_GEN_ACT);
    b[1] = BUF("h", BO_INOUT, sz(s->n, s->dim), BO_GEN_ACT);
    b[2] = BUF("y", BO_IN, sz(s->n, s->dim), BO_GEN_ACT);
    b[3] = BUF("weight", BO_IN, (size_t)s->dim, BO_GEN_WEIGHT);
    return 4;
}

static int add_rmsnorm_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    add_rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->s->eps, c->s->n, c->s->dim);
    return 0;
}

/* ---------------------------------------------------------------- elementwise */

static int swiglu_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("out", BO_OUT, (size_t)s->n, BO_GEN_ACT);
    b[1] = BUF("gate", BO_IN, (size_t)s->n, BO_GEN_ACT);
    b[2] = BUF("up", BO_IN, (size_t)s->n, BO_GEN_ACT);
    return 3;
}

static int swiglu_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    swiglu(c->buf[0], c->buf[1], c->buf[2], c->s->n);
    return 0;
}

static int softmax_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("x", BO_INOUT, (size_t)s->n, BO_GEN_ACT);
    return 1;
}

static int softmax_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    softmax(c->buf[0], c->s->n);
    return 0;
}

static int vec_add_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("x", BO_INOUT, (size_t)s->n, BO_GEN_ACT);
    b[1] = BUF("y", BO_IN, (size_t)s->n, BO_GEN_ACT);
    return 2;
}

static int vec_add_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    vec_add(c->buf[0], c->buf[1], c->s->n);
    return 0;
}

/* ---------------------------------------------------------------- rope, matmul, attention */

static int rope_apply_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("x", BO_INOUT, sz(s->heads, s->dim), BO_GEN_ACT);
    b[1] = BUF("cos", BO_IN, (size_t)(s->dim / 2), BO_GEN_UNIT);
    b[2] = BUF("sin", BO_IN, (size_t)(s->dim / 2), BO_GEN_UNIT);
    return 3;
}

static int rope_apply_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    rope_apply(c->buf[0], c->buf[1], c->buf[2], c->s->heads, c->s->dim);
    return 0;
}

/* qk_norm_rope: n rows of `heads` q heads and `kv_heads` k heads of dim. */
static int qk_norm_rope_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("q", BO_INOUT, sz(s->n, s->heads * s->dim), BO_GEN_ACT);
    b[1] = BUF("k", BO_INOUT, sz(s->n, s->kv_heads * s->dim), BO_GEN_ACT);
    b[2] = BUF("q_norm", BO_IN, (size_t)s->dim, BO_GEN_WEIGHT);
    b[3] = BUF("k_norm", BO_IN, (size_t)s->dim, BO_GEN_WEIGHT);
    b[4] = BUF("cos", BO_IN, sz(s->n, s->dim / 2), BO_GEN_UNIT);
    b[5] = BUF("sin", BO_IN, sz(s->n, s->dim / 2), BO_GEN_UNIT);
    return 6;
}

static int qk_norm_rope_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    qk_norm_rope(c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->s->eps, c->buf[4], c->buf[5],
                 c->s->n, c->s->heads, c->s->kv_heads, c->s->dim);
    return 0;
}

static int matmul_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("out", BO_OUT, sz(s->n, s->rows), BO_GEN_ACT);
    b[1] = BUF("x", BO_IN, sz(s->n, s->dim), BO_GEN_ACT);
    b[2] = BUF("w", BO_IN, sz(s->rows, s->dim), BO_GEN_UNIT);
    if (s->wtype == OPS_BF16) b[2].elem = BO_BF16;
    return 3;
}

static int matmul_ref(const struct bo_call *c, struct thread_pool *pool) {
    struct ops_weight w = {c->buf[2], c->s->wtype, c->s->rows, c->s->dim};
    matmul(c->buf[0], c->buf[1], &w, c->s->n, pool);
    return 0;
}

/* matmul_split: matmul's layout, leaves = pos. */
static int matmul_split_ref(const struct bo_call *c, struct thread_pool *pool) {
    struct ops_weight w = {c->buf[2], c->s->wtype, c->s->rows, c->s->dim};
    matmul_split(c->buf[0], c->buf[1], &w, c->s->n, c->s->pos, pool);
    return 0;
}

int bo_kv_held_blocks(const struct bo_shape *s) {
    return (s->pos + s->n + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK;
}

/* Twice the blocks held and one more: the unused ones are filled too (never read). */
int bo_kv_pool_blocks(const struct bo_shape *s) {
    return 2 * bo_kv_held_blocks(s) + 1;
}

/* The first `held` ids of a seeded shuffle of the pool (a fixed LCG: the same table for the
 * reference and every backend). */
void bo_kv_table(const struct bo_shape *s, int32_t *table) {
    const int held = bo_kv_held_blocks(s), pool = bo_kv_pool_blocks(s);
    int32_t *ids = malloc((size_t)pool * sizeof *ids);
    uint32_t state = 2654435761u * (uint32_t)(s->pos + 1) + (uint32_t)s->n;
    if (!ids) abort(); /* a few KiB */
    for (int i = 0; i < pool; ++i)
        ids[i] = i;
    for (int i = pool - 1; i > 0; --i) {
        state = state * 1664525u + 1013904223u;
        const int j = (int)((state >> 8) % (uint32_t)(i + 1));
        const int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    for (int b = 0; b < held; ++b)
        table[b] = ids[b];
    free(ids);
}

struct ops_kv bo_kv_view(const struct bo_shape *s, void *k, void *v, const void *table) {
    const size_t head = (size_t)OPS_ATTN_BLOCK * (size_t)s->dim;
    return (struct ops_kv){.k = k,
                           .v = v,
                           .blocks = table,
                           .block_stride = (size_t)s->kv_heads * head,
                           .head_stride = head,
                           .dtype = s->wtype};
}

/* q, the paged pools of keys and values (stored as wtype: f32, bf16 or f16), and the block
 * table (bo_kv_table). */
static int attention_layout(const struct bo_shape *s, struct bo_buf *b) {
    size_t q = sz(s->n, s->heads * s->dim);
    size_t cache = sz(bo_kv_pool_blocks(s), s->kv_heads * OPS_ATTN_BLOCK * s->dim);
    b[0] = BUF("out", BO_OUT, q, BO_GEN_ACT);
    b[1] = BUF("q", BO_IN, q, BO_GEN_ACT);
    b[2] = BUF("k_cache", BO_IN, cache, BO_GEN_ACT);
    b[3] = BUF("v_cache", BO_IN, cache, BO_GEN_UNIT);
    if (s->wtype != OPS_F32) b[2].elem = b[3].elem = s->wtype == OPS_BF16 ? BO_BF16 : BO_F16;
    b[4] = (struct bo_buf){"blocks", BO_IN, BO_I32, (size_t)bo_kv_held_blocks(s), BO_GEN_KV_TABLE};
    return 5;
}

static int attention_ref(const struct bo_call *c, struct thread_pool *pool) {
    const struct bo_shape *s = c->s;
    size_t ctx = (size_t)(s->pos + s->n);
    const size_t per_thread = attention_scratch_floats((int)ctx, s->heads, s->kv_heads, s->dim);
    float *scratch = malloc((size_t)thread_pool_size(pool) * per_thread * sizeof *scratch);
    if (!scratch) return strata_set_error(STRATA_ENOMEM, "attention scratch");
    const struct ops_kv kv = bo_kv_view(s, c->buf[2], c->buf[3], c->buf[4]);
    attention(c->buf[0], c->buf[1], &kv, scratch, s->pos, s->n, s->heads, s->kv_heads, s->dim,
              pool);
    free(scratch);
    return 0;
}

/* attention_kvp: the KV-parallel steps (kernels/attention_kvp.h) over `rows` ranks of
 * bo_kvp_tokens() positions each, run one after another by a backend, judged against one
 * rank's attention(): the KVP group must give its result (bitwise but for expf). */
int bo_kvp_tokens(const struct bo_shape *s) {
    int ctx = s->pos + s->n, want = (ctx + s->rows - 1) / s->rows, tokens = OPS_ATTN_BLOCK;
    while (tokens < want)
        tokens *= 2;
    return tokens;
}

/* ---------------------------------------------------------------- moe_route, weight rows */

/* n experts, rows = top_k, pos = renormalize. */
static int moe_route_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = (struct bo_buf){"experts", BO_OUT, BO_I32, (size_t)s->rows, BO_GEN_ACT};
    b[1] = BUF("weights", BO_OUT, (size_t)s->rows, BO_GEN_ACT);
    b[2] = BUF("router_logits", BO_IN, (size_t)s->n, BO_GEN_ACT);
    return 3;
}

static int moe_route_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    moe_route(c->buf[0], c->buf[1], c->buf[2], c->s->pos, c->s->n, c->s->rows);
    return 0;
}

/* moe_route_rows of `heads` tokens. */
static int moe_route_rows_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = (struct bo_buf){"experts", BO_OUT, BO_I32, sz(s->heads, s->rows), BO_GEN_ACT};
    b[1] = BUF("weights", BO_OUT, sz(s->heads, s->rows), BO_GEN_ACT);
    b[2] = BUF("router_logits", BO_IN, sz(s->heads, s->n), BO_GEN_ACT);
    return 3;
}

static int moe_route_rows_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    moe_route_rows(c->buf[0], c->buf[1], c->buf[2], c->s->pos, c->s->n, c->s->rows, c->s->heads);
    return 0;
}

/* w [rows, dim] (wtype), row = pos. */
static int weight_row_layout(const struct bo_shape *s, struct bo_buf *b) {
    b[0] = BUF("out", BO_OUT, (size_t)s->dim, BO_GEN_ACT);
    b[1] = BUF("w", BO_IN, sz(s->rows, s->dim), BO_GEN_UNIT);
    if (s->wtype == OPS_BF16) b[1].elem = BO_BF16;
    return 2;
}

static int weight_row_ref(const struct bo_call *c, struct thread_pool *pool) {
    (void)pool;
    struct ops_weight w = {c->buf[1], c->s->wtype, c->s->rows, c->s->dim};
    ops_weight_row(c->buf[0], &w, c->s->pos);
    return 0;
}

/* ---------------------------------------------------------------- tables */

/* fp32 ops: 1e-7, llama.cpp's default bound. */
const struct bo_op bo_ops[] = {
    {"rmsnorm", 1e-7, rmsnorm_layout, rmsnorm_ref},
    {"add_rmsnorm", 1e-7, add_rmsnorm_layout, add_rmsnorm_ref},
    {"swiglu", 1e-7, swiglu_layout, swiglu_ref},
    {"softmax", 1e-7, softmax_layout, softmax_ref},
    {"vec_add", 1e-7, vec_add_layout, vec_add_ref},
    {"rope_apply", 1e-7, rope_apply_layout, rope_apply_ref},
    {"qk_norm_rope", 1e-7, qk_norm_rope_layout, qk_norm_rope_ref},
    {"matmul", 1e-7, matmul_layout, matmul_ref},
    {"matmul_split", 1e-7, matmul_layout, matmul_split_ref},
    {"attention", 1e-7, attention_layout, attention_ref},
    {"attention_kvp", 1e-7, attention_layout, attention_ref},
    {"moe_route", 1e-7, moe_route_layout, moe_route_ref},
    {"moe_route_rows", 1e-7, moe_route_rows_layout, moe_route_rows_ref},
    {"ops_weight_row", 1e-7, weight_row_layout, weight_row_ref},
};
const size_t bo_n_ops = sizeof bo_ops / sizeof bo_ops[0];

#define RMS(n_, dim_, scale_)                                                                      \
    {                                                                                              \
        "rmsnorm", {                                                                               \
            .n = n_, .dim = dim_, .eps = 1e-6f, .scale = scale_                                    \
        }                                                                                          \
    }
#define ADD_RMS(n_, dim_, scale_)                                                                  \
    {                                                                                              \
        "add_rmsnorm", {                                                                           \
            .n = n_, .dim = dim_, .eps = 1e-6f, .scale = scale_                                    \
        }                                                                                          \
    }
#define ELT(op_, n_, scale_)                                                                       \
    {                                                                                              \
        op_, {                                                                                     \
            .n = n_, .scale = scale_                                                               \
        }                                                                                          \
    }
#define ROPE(heads_, dim_)                                                                         \
    {                                                                                              \
        "rope_apply", {                                                                            \
            .heads = heads_, .dim = dim_                                                           \
        }                                                                                          \
    }
#define QK(n_, heads_, kv_, dim_, scale_)                                                          \
    {                                                                                              \
        "qk_norm_rope", {                                                                          \
            .n = n_, .heads = heads_, .kv_heads = kv_, .dim = dim_, .eps = 1e-6f, .scale = scale_  \
        }                                                                                          \
    }
#define MATMUL(n_, dim_, rows_, wt_)                                                               \
    {                                                                                              \
        "matmul", {                                                                                \
            .n = n_, .dim = dim_, .rows = rows_, .wtype = wt_                                      \
        }                                                                                          \
    }
#define MATMUL_SPLIT(n_, dim_, rows_, wt_, leaves_)                                                \
    {                                                                                              \
        "matmul_split", {                                                                          \
            .n = n_, .dim = dim_, .rows = rows_, .wtype = wt_, .pos = leaves_                      \
        }                                                                                          \
    }
#define ATTN(n_, pos_, h_, kv_, d_)                                                                \
    {                                                                                              \
        "attention", {                                                                             \
            .n = n_, .pos = pos_, .heads = h_, .kv_heads = kv_, .dim = d_                          \
        }                                                                                          \
    }
#define ATTN_KVP(n_, pos_, h_, kv_, d_, ranks_)                                                    \
    {                                                                                              \
        "attention_kvp", {                                                                         \
            .n = n_, .pos = pos_, .heads = h_, .kv_heads = kv_, .dim = d_, .rows = ranks_          \
        }                                                                                          \
    }
/* The same over a cache of 16-bit elements (kv_: OPS_BF16 or OPS_F16). */
#define ATTN_DT(n_, pos_, h_, kv_, d_, dt_)                                                        \
    {                                                                                              \
        "attention", {                                                                             \
            .n = n_, .pos = pos_, .heads = h_, .kv_heads = kv_, .dim = d_, .wtype = dt_            \
        }                                                                                          \
    }
#define ATTN_KVP_DT(n_, pos_, h_, kv_, d_, ranks_, dt_)                                            \
    {                                                                                              \
        "attention_kvp", {                                                                         \
            .n = n_, .pos = pos_, .heads = h_, .kv_heads = kv_, .dim = d_, .rows = ranks_,         \
            .wtype = dt_                                                                           \
        }                                                                                          \
    }

#define ROUTE(e_, k_, renorm_, scale_)                                                             \
    {                                                                                              \
        "moe_route", {                                                                             \
            .n = e_, .rows = k_, .pos = renorm_, .scale = scale_                                   \
        }                                                                                          \
    }
#define ROUTE_ROWS(e_, k_, renorm_, tokens_, scale_)                                               \
    {                                                                                              \
        "moe_route_rows", {                                                                        \
            .n = e_, .rows = k_, .pos = renorm_, .heads = tokens_, .scale = scale_                 \
        }                                                                                          \
    }
#define WROW(rows_, dim_, row_, wt_)                                                               \
    {                                                                                              \
        "ops_weight_row", {                                                                        \
            .rows = rows_, .dim = dim_, .pos = row_, .wtype = wt_                                  \
        }                                                                                          \
    }

const struct bo_case bo_cases[] = {
    RMS(1, 1, 1.0f),
    RMS(1, 16, 1.0f),
    RMS(7, 100, 1.0f),
    RMS(2, 257, 1.0f),
    RMS(32, 1024, 3.0f),
    RMS(5, 2560, 0.01f),
    RMS(128, 4096, 1.0f),
    RMS(3, 5000, 100.0f),
    ADD_RMS(1, 1, 1.0f),
    ADD_RMS(7, 100, 1.0f),
    ADD_RMS(1, 4096, 1.0f),
    ADD_RMS(5, 2560, 0.01f),
    ADD_RMS(3, 5000, 100.0f),

    ELT("swiglu", 1, 1.0f),
    ELT("swiglu", 1000, 4.0f),
    ELT("swiglu", 4097, 1.0f),
    ELT("swiglu", 65537, 8.0f),

    ELT("softmax", 1, 1.0f),
    ELT("softmax", 7, 1.0f),
    ELT("softmax", 1000, 10.0f),
    ELT("softmax", 1025, 1.0f),
    ELT("softmax", 151936, 20.0f),

    ELT("vec_add", 1, 1.0f),
    ELT("vec_add", 1023, 1.0f),
    ELT("vec_add", 100003, 50.0f),

    ROPE(1, 2),
    ROPE(3, 6),
    ROPE(8, 128),
    ROPE(5, 66),

    /* a decode row of the 8B shape's heads, a prefill of 0.6B's, widths off the 4-float
     * path (66, 6), more heads than one row's threads */
    QK(1, 32, 8, 128, 1.0f),
    QK(17, 16, 8, 128, 3.0f),
    QK(3, 4, 2, 66, 1.0f),
    QK(2, 3, 1, 6, 0.01f),
    QK(5, 40, 8, 64, 100.0f),

    MATMUL(1, 16, 3, OPS_F32),
    MATMUL(5, 67, 33, OPS_F32),
    MATMUL(5, 67, 33, OPS_BF16),
    MATMUL(4, 1024, 257, OPS_BF16),
    MATMUL(1, 2560, 64, OPS_BF16),

    /* leaves of 16-multiples, of 125 columns (a tail each), shorter than 16 */
    MATMUL_SPLIT(1, 1024, 64, OPS_BF16, 8),
    MATMUL_SPLIT(5, 1000, 33, OPS_F32, 8),
    MATMUL_SPLIT(4, 3072, 257, OPS_BF16, 4),
    MATMUL_SPLIT(9, 100, 50, OPS_F32, 2),
    MATMUL_SPLIT(3, 40, 7, OPS_BF16, 8),
    MATMUL_SPLIT(2, 2048, 300, OPS_BF16, 1),

    ATTN(1, 0, 1, 1, 8),
    ATTN(3, 5, 4, 2, 64),
    ATTN(7, 0, 6, 2, 32),
    ATTN(1, 40, 8, 1, 128),
    ATTN(17, 0, 4, 4, 128),
    ATTN(2, 300, 16, 8, 64),
    ATTN(1, 4999, 8, 2, 128), /* decode at a long context: 20 split-K chunks */
    ATTN(40, 600, 4, 2, 64),  /* a prefill across chunk boundaries */

    /* KVP ranks of 16 x 2^p positions; the last rank short, early queries seeing no key on
     * the later ranks */
    ATTN_KVP(1, 40, 8, 1, 128, 2),   /* decode: ranks [0, 32), [32, 41) */
    ATTN_KVP(3, 29, 4, 2, 64, 2),    /* two full ranks of 16 */
    ATTN_KVP(20, 20, 4, 2, 64, 2),   /* queries 20..31 see no key on rank 1 */
    ATTN_KVP(60, 4, 4, 2, 32, 4),    /* a prefill over four ranks of 16 */
    ATTN_KVP(1, 4999, 8, 2, 128, 2), /* ranks of 4096: split-K against one partial */
    ATTN_KVP(40, 960, 4, 2, 64, 8),  /* eight ranks of 128, the last one short */

    /* a 16-bit cache, widened as loaded: aligned rows (8-byte loads) and head_dim 6 (not) */
    ATTN_DT(3, 5, 4, 2, 64, OPS_F16),
    ATTN_DT(2, 300, 16, 8, 64, OPS_BF16),
    ATTN_DT(1, 4999, 8, 2, 128, OPS_F16),
    ATTN_DT(5, 20, 4, 2, 6, OPS_F16),
    ATTN_DT(40, 600, 4, 2, 64, OPS_BF16),
    ATTN_KVP_DT(1, 40, 8, 1, 128, 2, OPS_F16),
    ATTN_KVP_DT(60, 4, 4, 2, 32, 4, OPS_BF16),
    ATTN_KVP_DT(40, 960, 4, 2, 64, 8, OPS_F16),

    MATMUL(9, 100, 50, OPS_F32),
    MATMUL(6, 2048, 300, OPS_BF16),

    ROUTE(1, 1, 0, 1.0f),
    ROUTE(8, 2, 1, 3.0f),
    ROUTE(128, 8, 1, 4.0f),
    ROUTE(60, 4, 0, 2.0f),
    ROUTE_ROWS(8, 2, 1, 1, 3.0f),
    ROUTE_ROWS(6, 3, 0, 7, 2.0f),
    ROUTE_ROWS(128, 8, 1, 65, 4.0f),

    WROW(1, 1, 0, OPS_F32),
    WROW(7, 33, 6, OPS_BF16),
    WROW(100, 1000, 42, OPS_BF16),
    WROW(10, 257, 3, OPS_F32),
};
const size_t bo_n_cases = sizeof bo_cases / sizeof bo_cases[0];
