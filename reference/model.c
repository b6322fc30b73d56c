/* The reference forward pass (contract in model.h, math in shared spec qwen3-architecture.md
 * §3-§5). One layer function serves prefill and decode, one request or a microbatch: every
 * op works row by row, so a row's result never depends on its neighbours or the thread
 * count. Shape letters: N rows in the call, H hidden, D head_dim, nh / nkv heads, F dense
 * MLP width, E experts, I expert width, V vocab. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/forward.h"
#include "reference/model_internal.h"
#include "runtime/base/status.h"

#define MOE_MAX_TOP_K OPS_MOE_MAX_TOP_K /* moe_sum_rows' per-row list */

/* The plan's refusals (runtime/model/tp_shard.h) and the ops' trees must agree. */
_Static_assert(GRID_SPLIT_LEAVES == OPS_SPLIT_LEAVES, "TP leaves: tp_shard.h vs ops.h");
_Static_assert(GRID_KV_BLOCK == OPS_ATTN_BLOCK, "KVP block: tp_shard.h vs ops.h");

static void free_scratch(struct reference_model *m) {
    float **bufs[] = {&m->norm,   &m->proj,     &m->q,      &m->k,        &m->v,
                      &m->attn,   &m->ffn_gate, &m->ffn_up, &m->rope_cos, &m->rope_sin,
                      &m->scores, &m->router,   &m->moe_w,  &m->moe_x};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    free(m->moe_expert);
    free(m->moe_row);
    free(m->moe_slot);
    free(m->moe_offsets);
    free(m->logit_part);
    free(m->kvp_parts);
    free(m->kvp_scores);
    free(m->tp_part);
    m->kvp_parts = m->kvp_mine = m->kvp_max_all = m->kvp_max = m->kvp_scores = m->tp_part = NULL;
    m->cap_kvp_rows = 0;
    m->cap_tp_part = 0;
    m->moe_expert = NULL;
    m->moe_row = m->moe_slot = m->moe_offsets = NULL;
    m->logit_part = NULL;
    m->cap_logit_part = 0;
    m->cap_rows = m->cap_ctx = 0;
    m->scratch_bytes = 0;
}

void reference_model_free(struct reference_model *m) {
    if (!m) return;
    free_scratch(m);
    for (int i = 0; i < m->n_owned; ++i)
        free(m->owned[i]);
    free(m->owned);
    weight_arena_free(&m->arena);
    if (m->layers)
        for (int l = 0; l < m->n_layers; ++l) {
            free(m->layers[l].expert_gate);
            free(m->layers[l].expert_up);
            free(m->layers[l].expert_down);
        }
    free(m->layers);
    free(m->inv_freq);
    thread_pool_free(m->pool);
    free(m);
}

/* This KVP rank's positions (the whole sequence without KVP). */
static int init_kvp(struct reference_model *m) {
    const struct reference_kvp *o = &m->opt.kvp;
    m->kvp = 1;
    m->kvp_lo = 0;
    m->kvp_held = INT_MAX;
    if (o->kvp <= 1) return STRATA_OK;
    if (!o->coll.allgather || o->rank < 0 || o->rank >= o->kvp || o->tokens < 1 || o->max_seq < 1)
        return strata_set_error(
            STRATA_EINVAL,
            "reference_model: KVP rank %d of %d, %d tokens per rank, max_seq %d "
            "(and an all-gather) needed",
            o->rank, o->kvp, o->tokens, o->max_seq);
    if (!kvp_tokens_aligned(o->tokens))
        return strata_set_error(STRATA_EINVAL,
                                "reference_model: %d KV tokens per KVP rank is not %d x a power "
                                "of two (each rank's keys must be one subtree of attention's "
                                "block tree)",
                                o->tokens, GRID_KV_BLOCK);
    struct grid_config grid = {.pp = 1, .tp = 1, .kvp = o->kvp, .kvp_tokens = o->tokens};
    struct tp_range r = kvp_token_range(&grid, o->rank, o->max_seq);
    if ((int64_t)o->tokens * o->kvp < o->max_seq || r.end <= r.start)
        return strata_set_error(STRATA_ERANGE,
                                "reference_model: KVP %d x %d tokens cannot hold max_seq %d with "
                                "every rank holding some",
                                o->kvp, o->tokens, o->max_seq);
    m->kvp = o->kvp;
    m->kvp_lo = r.start;
    m->kvp_held = r.end - r.start;
    return STRATA_OK;
}

int reference_model_kv_positions(const struct reference_model *m, int max_seq) {
    return m->kvp > 1 ? m->kvp_held : max_seq;
}

int reference_model_kv_first(const struct reference_model *m) {
    return m->kvp > 1 ? m->kvp_lo : 0;
}

int reference_model_kv_held(const struct reference_model *m, int positions) {
    const int held = positions - m->kvp_lo;
    return m->kvp <= 1 ? positions : held < 0 ? 0 : held > m->kvp_held ? m->kvp_held : held;
}

/* This rank's dimensions: the shard's under TP, the model's otherwise. */
static int init_shard(struct reference_model *m) {
    const struct model_config *c = &m->cfg;
    const struct tp_shard *sh = m->opt.tp;
    m->opt.tp = NULL; /* borrowed only while loading: the copy below is what stays */
    if (sh && sh->tp > 1) {
        if (!m->opt.coll.allreduce_sum || !m->opt.coll.allgather)
            return strata_set_error(STRATA_EINVAL,
                                    "reference_model: TP %d needs the group's collectives", sh->tp);
        m->shard = *sh;
        m->tp = sh->tp;
        m->nh = sh->q_heads.end - sh->q_heads.start;
        m->nkv = sh->kv_heads.end - sh->kv_heads.start;
        m->ffn = sh->ffn.end - sh->ffn.start;
        m->moe_ffn = sh->expert_ffn.end - sh->expert_ffn.start;
        m->vocab_start = sh->vocab.start;
        m->vocab_n = sh->vocab.end - sh->vocab.start;
        m->experts_lo = sh->experts.start;
        m->experts_hi = sh->experts.end;
        m->moe_split = m->moe_ffn < c->moe_intermediate_size;
        if (OPS_SPLIT_LEAVES % m->tp)
            return strata_set_error(STRATA_EINVAL,
                                    "reference_model: TP %d does not divide the %d leaves of a "
                                    "split dot product",
                                    m->tp, OPS_SPLIT_LEAVES);
        m->leaves = OPS_SPLIT_LEAVES / m->tp;
        return STRATA_OK;
    }
    m->tp = 1;
    m->nh = c->num_heads;
    m->nkv = c->num_kv_heads;
    m->ffn = c->intermediate_size;
    m->moe_ffn = c->moe_intermediate_size;
    m->vocab_start = 0;
    m->vocab_n = c->vocab_size;
    m->experts_lo = 0;
    m->experts_hi = c->num_experts;
    m->moe_split = 0;
    m->leaves = OPS_SPLIT_LEAVES;
    return STRATA_OK;
}

int reference_model_kv_heads(const struct reference_model *m) {
    return m->nkv;
}

int reference_model_load(struct reference_model **out, const struct model_config *cfg,
                         const struct safetensors *st, const struct reference_load_options *opt) {
    *out = NULL;
    if (opt->num_threads < 1)
        return strata_set_error(STRATA_EINVAL, "reference_model: num_threads %d < 1",
                                opt->num_threads);
    int head_only = opt->layer_start == 0 && opt->layer_end == 0;
    if (!head_only && (opt->layer_start < 0 || opt->layer_start >= opt->layer_end ||
                       opt->layer_end > cfg->num_layers))
        return strata_set_error(STRATA_ERANGE,
                                "reference_model: layer range [%d,%d) invalid for %d layers",
                                opt->layer_start, opt->layer_end, cfg->num_layers);
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 || cfg->head_dim > OPS_ATTN_MAX_HEAD_DIM ||
        cfg->num_kv_heads <= 0 || cfg->num_heads % cfg->num_kv_heads)
        /* The model's shape, not a caller's argument: EFORMAT (an input error), which also
         * lets stage_open report the checkpoint's tensors when they do not match either. */
        return strata_set_error(STRATA_EFORMAT,
                                "reference_model: unsupported heads (nh %d, nkv %d, head_dim %d; "
                                "head_dim must be even and at most %d)",
                                cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                OPS_ATTN_MAX_HEAD_DIM);
    if (cfg->num_experts > 0 &&
        (cfg->num_experts_per_tok < 1 || cfg->num_experts_per_tok > cfg->num_experts ||
         cfg->num_experts_per_tok > MOE_MAX_TOP_K))
        return strata_set_error(STRATA_EINVAL, "reference_model: top-k %d with %d experts",
                                cfg->num_experts_per_tok, cfg->num_experts);
    struct reference_model *m = calloc(1, sizeof *m);
    if (!m) return strata_set_error(STRATA_ENOMEM, "reference_model: out of memory");
    m->cfg = *cfg;
    m->opt = *opt;
    int rc;
    if ((rc = thread_pool_init(&m->pool, opt->num_threads))) goto fail;
    m->n_layers = opt->layer_end - opt->layer_start;
    m->layers = calloc((size_t)(m->n_layers ? m->n_layers : 1), sizeof *m->layers);
    int half = cfg->head_dim / 2;
    m->inv_freq = malloc((size_t)half * sizeof *m->inv_freq);
    if (!m->layers || !m->inv_freq) {
        rc = strata_set_error(STRATA_ENOMEM, "reference_model: out of memory");
        goto fail;
    }
    rope_inv_freq(m->inv_freq, (float)cfg->rope_theta, cfg->head_dim);
    if ((rc = init_shard(m)) || (rc = init_kvp(m))) goto fail;
    if ((rc = ref_load_weights(m, st))) goto fail;
    *out = m;
    return STRATA_OK;
fail:
    reference_model_free(m);
    return rc;
}

size_t reference_model_weight_bytes(const struct reference_model *m) {
    return m->weight_bytes;
}

size_t reference_model_copied_bytes(const struct reference_model *m, size_t *huge) {
    if (huge) *huge = weight_arena_huge_bytes(&m->arena);
    return m->copied_bytes;
}

size_t reference_model_extra_bytes(const struct reference_model *m) {
    return m->extra_bytes;
}

int reference_model_num_tensors(const struct reference_model *m) {
    return m->num_tensors;
}

const struct model_config *reference_model_config(const struct reference_model *m) {
    return &m->cfg;
}

size_t reference_model_scratch_bytes(const struct reference_model *m) {
    return m->scratch_bytes;
}

int reference_model_num_threads(const struct reference_model *m) {
    return thread_pool_size(m->pool);
}

void reference_model_park_threads(struct reference_model *m) {
    thread_pool_park(m->pool);
}

/* Grows the activation scratch to hold `rows` tokens attending over `ctx` positions. */
static int ensure_scratch(struct reference_model *m, int rows, int ctx) {
    if (rows <= m->cap_rows && ctx <= m->cap_ctx) return STRATA_OK;
    if (rows < m->cap_rows) rows = m->cap_rows;
    if (ctx < m->cap_ctx) ctx = m->cap_ctx;
    free_scratch(m);
    const struct model_config *c = &m->cfg;
    size_t r = (size_t)rows, H = (size_t)c->hidden_size, D = (size_t)c->head_dim;
    size_t qd = (size_t)m->nh * D, kvd = (size_t)m->nkv * D;
    size_t E = c->num_experts > 0 ? (size_t)c->num_experts : 1;
    size_t K = c->num_experts_per_tok > 0 ? (size_t)c->num_experts_per_tok : 1;
    /* FFN rows: r of the dense MLP, or r * K grouped expert rows (forward.c forward_moe). */
    size_t ffn = (size_t)m->ffn;
    if (c->num_experts > 0 && K * (size_t)m->moe_ffn > ffn) ffn = K * (size_t)m->moe_ffn;
    size_t threads = (size_t)thread_pool_size(m->pool);
    struct {
        float **p;
        size_t n;
    } want[] = {
        {&m->norm, r * H},
        {&m->proj, r * H},
        {&m->q, r * qd},
        {&m->k, r * kvd},
        {&m->v, r * kvd},
        {&m->attn, r * qd},
        {&m->ffn_gate, r * ffn},
        {&m->ffn_up, r * ffn},
        {&m->rope_cos, r * D / 2},
        {&m->rope_sin, r * D / 2},
        {&m->scores, threads * attention_scratch_floats(ctx, m->nh, m->nkv, c->head_dim)},
        {&m->router, r * E},
        {&m->moe_w, r * K},
        {&m->moe_x, c->num_experts > 0 ? r * K * H : 0},
    };
    size_t bytes = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) {
        *want[i].p = malloc((want[i].n ? want[i].n : 1) * sizeof(float));
        bytes += want[i].n * sizeof(float);
        if (!*want[i].p) goto nomem;
    }
    m->moe_expert = malloc(r * K * sizeof(int));
    m->moe_row = malloc(r * K * sizeof(int32_t));
    m->moe_slot = malloc(r * K * sizeof(int32_t));
    m->moe_offsets = malloc((E + 1) * sizeof(int32_t));
    if (!m->moe_expert || !m->moe_row || !m->moe_slot || !m->moe_offsets) goto nomem;
    m->cap_rows = rows;
    m->cap_ctx = ctx;
    m->scratch_bytes = bytes + (r * K * 3 + E + 1) * sizeof(int32_t);
    return STRATA_OK;
nomem:
    free_scratch(m);
    return strata_set_error(STRATA_ENOMEM, "reference_model: cannot allocate scratch for %d rows",
                            rows);
}

/* The embedding's all-reduce (a no-op without TP): one rank's row plus zeros, exact in any
 * order. */
static int tp_allreduce(const struct reference_model *m, float *x, size_t n) {
    if (m->tp <= 1) return STRATA_OK;
    return m->opt.coll.allreduce_sum(m->opt.coll.ctx, x, n);
}

/* Room for an all-gather of n floats from every TP rank. */
static int ensure_tp_part(struct reference_model *m, size_t n) {
    const size_t need = (size_t)m->tp * n;
    if (need <= m->cap_tp_part) return STRATA_OK;
    float *grown = realloc(m->tp_part, need * sizeof(float));
    if (!grown) return strata_set_error(STRATA_ENOMEM, "reference_forward: no memory for TP");
    m->tp_part = grown;
    m->cap_tp_part = need;
    return STRATA_OK;
}

/* Megatron's one all-reduce after a row-parallel projection (a no-op without TP). Each
 * rank's x is the subtree of its leaves of every dot product (matmul_split); the ranks'
 * subtrees are added by the top of the same tree, so the sum has one rank's bits. Two
 * ranks: p0 + p1, which is the group's rank-order all-reduce; more: an all-gather and
 * ops_tree_sum ((p0 + p1) + (p2 + p3), not the all-reduce's ((p0 + p1) + p2) + p3). */
static int tp_reduce(struct reference_model *m, float *x, size_t n) {
    if (m->tp <= 1) return STRATA_OK;
    if (m->tp == 2) return m->opt.coll.allreduce_sum(m->opt.coll.ctx, x, n);
    int rc = ensure_tp_part(m, n);
    if (!rc) rc = m->opt.coll.allgather(m->opt.coll.ctx, m->tp_part, x, n);
    if (!rc) ops_tree_sum(x, m->tp_part, m->tp, n);
    return rc;
}

int reference_embed(const struct reference_model *m, float *hidden, const int32_t *tokens, int n) {
    if (!m->opt.with_embed)
        return strata_set_error(STRATA_EINVAL,
                                "reference_embed: this model does not own embed_tokens");
    int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    if (n < 0 || (n > 0 && (!hidden || !tokens)))
        return strata_set_error(STRATA_EINVAL, "reference_embed: bad arguments (%d tokens)", n);
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= V)
            return strata_set_error(STRATA_ERANGE,
                                    "reference_embed: token id %d at index %d is outside [0, %d)",
                                    (int)tokens[i], i, V);
    for (int i = 0; i < n; ++i) {
        float *row = hidden + (size_t)i * (size_t)H;
        const int local = tokens[i] - m->vocab_start;
        if (local >= 0 && local < m->vocab_n)
            ops_weight_row(row, &m->embed, local);
        else /* another TP rank holds this row: its all-reduce term */
            memset(row, 0, (size_t)H * sizeof(float));
    }
    return tp_allreduce(m, hidden, (size_t)n * (size_t)H);
}

static void add_bias(float *x, const float *bias, int n, int dim) {
    if (!bias) return;
    for (int i = 0; i < n; ++i)
        vec_add(x + (size_t)i * (size_t)dim, bias, dim);
}

/* KV positions [pos, pos + n) of one item -> this rank's cache (all of them, or under KVP
 * those in [kvp_lo, kvp_lo + kvp_held), at local index position - kvp_lo). */
static void store_kv(struct reference_model *m, const struct layer_weights *L, struct kv_cache *kv,
                     const struct forward_item *item, int row) {
    const int D = m->cfg.head_dim, kvd = m->nkv * D;
    int first = 0, last = item->n_tokens; /* the rows whose positions this rank holds */
    if (m->kvp_lo - item->pos > first) first = m->kvp_lo - item->pos;
    if (m->kvp_lo + m->kvp_held - item->pos < last) last = m->kvp_lo + m->kvp_held - item->pos;
    if (first >= last) return;
    const struct ops_kv view = kv_cache_view(kv, item->slot, L->index);
    const size_t src = (size_t)(row + first) * (size_t)kvd;
    kv_store(&view, m->k + src, m->v + src, kvd, item->pos + first - m->kvp_lo, last - first,
             m->nkv, D);
}

/* The positions of item that this rank's cache holds once the item is stored. */
static int held_after(const struct reference_model *m, const struct forward_item *item) {
    const int end = item->pos + item->n_tokens - m->kvp_lo;
    return end < 0 ? 0 : end > m->kvp_held ? m->kvp_held : end;
}

/* KVP: the rows of one call are attended in tiles of at most kvp_tile_rows() rows, so the
 * scores kept between the two steps ([rows][nh][tokens]) stay under KVP_SCORE_FLOATS. The
 * tile depends only on nh and the tokens per rank, the same on every rank of the KVP group,
 * so every rank makes the same collective calls; a row's result does not depend on the
 * tiling. */
#define KVP_SCORE_FLOATS ((size_t)1 << 20) /* 4 MiB */

static int kvp_tile_rows(const struct reference_model *m) {
    const size_t per_row = (size_t)m->nh * (size_t)m->opt.kvp.tokens;
    const size_t rows = KVP_SCORE_FLOATS / (per_row ? per_row : 1);
    return rows < 1 ? 1 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* ---- the CPU's table of forward.h ops: reference/ops on the host ---- */

/* One reference_forward call: the model, the cache it appends to and the hidden rows. */
struct cpu_pass {
    struct reference_model *m;
    struct kv_cache *kv;
    float *hidden;
};

static int op_rmsnorm(void *ctx, float *out, const float *x, const float *w, float eps, int rows,
                      int dim) {
    rmsnorm_pooled(out, x, w, eps, rows, dim, ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_matmul_multi(void *ctx, float *const *outs, const struct ops_weight *const *ws,
                           int count, const float *x, int rows) {
    matmul_multi(outs, ws, count, x, rows, ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_matmul_split(void *ctx, float *out, const float *x, const struct ops_weight *w,
                           int rows) {
    const struct reference_model *m = ((struct cpu_pass *)ctx)->m;
    matmul_split(out, x, w, rows, m->leaves, m->pool);
    return STRATA_OK;
}

static int op_add_bias(void *ctx, float *x, const float *bias, int rows, int dim) {
    (void)ctx;
    add_bias(x, bias, rows, dim);
    return STRATA_OK;
}

static int op_add_rmsnorm(void *ctx, float *out, float *h, const float *y, const float *w,
                          float eps, int rows, int dim) {
    add_rmsnorm_pooled(out, h, y, w, eps, rows, dim, ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_qk_norm_rope(void *ctx, float *q, float *k, const float *q_norm, const float *k_norm,
                           float eps, const float *cos_t, const float *sin_t, int rows, int heads,
                           int kv_heads, int head_dim) {
    qk_norm_rope_pooled(q, k, q_norm, k_norm, eps, cos_t, sin_t, rows, heads, kv_heads, head_dim,
                        ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_kv_store(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                       int n_items, int rows) {
    struct cpu_pass *p = ctx;
    (void)rows;
    for (int it = 0, row = 0; it < n_items; row += items[it].n_tokens, ++it)
        store_kv(p->m, L, p->kv, &items[it], row);
    return STRATA_OK;
}

static int op_attention(void *ctx, const struct layer_weights *L, const struct forward_item *item,
                        float *out, const float *q) {
    const struct cpu_pass *p = ctx;
    const struct reference_model *m = p->m;
    const struct ops_kv view = kv_cache_view(p->kv, item->slot, L->index);
    attention(out, q, &view, m->scores, item->pos, item->n_tokens, m->nh, m->nkv, m->cfg.head_dim,
              m->pool);
    return STRATA_OK;
}

static int op_attention_partial_max(void *ctx, const struct layer_weights *L,
                                    const struct forward_item *item, int first, int n, float *max,
                                    float *scores, const float *q) {
    const struct cpu_pass *p = ctx;
    const struct reference_model *m = p->m;
    const struct ops_kv view = kv_cache_view(p->kv, item->slot, L->index);
    attention_partial_max(max, scores, q, &view, item->pos + first, n, m->kvp_lo, m->kvp_held,
                          m->nh, m->nkv, m->cfg.head_dim, m->pool);
    return STRATA_OK;
}

static int op_attention_partial(void *ctx, const struct layer_weights *L,
                                const struct forward_item *item, int first, int n, float *part,
                                const float *scores, const float *max) {
    const struct cpu_pass *p = ctx;
    const struct reference_model *m = p->m;
    const struct ops_kv view = kv_cache_view(p->kv, item->slot, L->index);
    attention_partial(part, scores, max, &view, item->pos + first, n, m->kvp_lo, m->kvp_held, m->nh,
                      m->nkv, m->cfg.head_dim, m->pool);
    return STRATA_OK;
}

static int op_kvp_allgather(void *ctx, float *all, const float *mine, size_t n) {
    const struct reference_collective *coll = &((struct cpu_pass *)ctx)->m->opt.kvp.coll;
    return coll->allgather(coll->ctx, all, mine, n);
}

static int op_attention_group_max(void *ctx, float *max, const float *all, size_t n) {
    attention_group_max(max, all, ((struct cpu_pass *)ctx)->m->kvp, n);
    return STRATA_OK;
}

static int op_attention_merge(void *ctx, float *out, const float *parts, int rows) {
    const struct reference_model *m = ((struct cpu_pass *)ctx)->m;
    attention_merge(out, parts, m->kvp, rows, m->nh, m->cfg.head_dim);
    return STRATA_OK;
}

static int op_tp_reduce(void *ctx, float *x, size_t n) {
    return tp_reduce(((struct cpu_pass *)ctx)->m, x, n);
}

static int op_vec_add(void *ctx, float *x, const float *y, int n) {
    vec_add_pooled(x, y, n, ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_swiglu(void *ctx, float *out, const float *gate, const float *up, int n) {
    swiglu_pooled(out, gate, up, n, ((struct cpu_pass *)ctx)->m->pool);
    return STRATA_OK;
}

static int op_moe_route(void *ctx, int *experts, float *weights, const float *router_logits,
                        int rows) {
    const struct model_config *c = &((struct cpu_pass *)ctx)->m->cfg;
    moe_route_rows(experts, weights, router_logits, c->norm_topk_prob, c->num_experts,
                   c->num_experts_per_tok, rows);
    return STRATA_OK;
}

static int op_moe_group(void *ctx, int32_t *offsets, int32_t *grouped_rows, int32_t *slot_pos,
                        const int *experts, int rows) {
    const struct reference_model *m = ((struct cpu_pass *)ctx)->m;
    moe_group(offsets, grouped_rows, slot_pos, experts, rows, m->cfg.num_experts_per_tok,
              m->cfg.num_experts, m->experts_lo, m->experts_hi);
    return STRATA_OK;
}

static int op_gather_rows(void *ctx, float *out, const float *x, const int32_t *rows, int n,
                          int dim) {
    (void)ctx;
    const struct ops_weight xs = {x, OPS_F32, INT32_MAX, dim};
    ops_weight_rows(out, &xs, rows, n);
    return STRATA_OK;
}

/* Down: matmul_split with the full tree's leaves for whole experts, or this rank's
 * leaves of each expert's columns under --moe split (their partials are subtrees). */
static int op_matmul_grouped(void *ctx, float *out, const float *x, const struct layer_weights *L,
                             enum forward_expert_matrix which, const int32_t *offsets, int cap) {
    const struct reference_model *m = ((struct cpu_pass *)ctx)->m;
    const struct ops_weight *ws = which == FORWARD_EXPERT_GATE ? L->expert_gate
                                  : which == FORWARD_EXPERT_UP ? L->expert_up
                                                               : L->expert_down;
    const int leaves = which != FORWARD_EXPERT_DOWN ? 1
                       : m->moe_split               ? m->leaves
                                                    : OPS_SPLIT_LEAVES;
    matmul_grouped(out, x, ws, offsets, m->cfg.num_experts, cap, leaves, m->pool);
    return STRATA_OK;
}

static int op_moe_expert_sum(void *ctx, float *out, float *y, const int32_t *slot_pos,
                             const int *experts, const float *weights, int rows) {
    const struct reference_model *m = ((struct cpu_pass *)ctx)->m;
    moe_expert_sum(out, y, slot_pos, experts, weights, rows, m->cfg.num_experts_per_tok,
                   m->experts_lo, m->experts_hi, m->cfg.hidden_size);
    return STRATA_OK;
}

static int op_deepstack(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                        int n_items) {
    const struct cpu_pass *p = ctx;
    const size_t H = (size_t)p->m->cfg.hidden_size;
    int row = 0;
    for (int it = 0; it < n_items; ++it) {
        const struct forward_item *item = &items[it];
        if (item->deepstack && L->index < item->num_deepstack) {
            const float *feat = item->deepstack + (size_t)L->index * (size_t)item->n_tokens * H;
            for (int i = 0; i < item->n_tokens; ++i)
                if (!item->visual_mask || item->visual_mask[i])
                    vec_add(p->hidden + (size_t)(row + i) * H, feat + (size_t)i * H, (int)H);
        }
        row += item->n_tokens;
    }
    return STRATA_OK;
}

static const struct forward_ops cpu_ops = {.rmsnorm = op_rmsnorm,
                                           .matmul_multi = op_matmul_multi,
                                           .matmul_split = op_matmul_split,
                                           .add_bias = op_add_bias,
                                           .qk_norm_rope = op_qk_norm_rope,
                                           .kv_store = op_kv_store,
                                           .attention = op_attention,
                                           .attention_partial_max = op_attention_partial_max,
                                           .attention_partial = op_attention_partial,
                                           .kvp_allgather = op_kvp_allgather,
                                           .attention_group_max = op_attention_group_max,
                                           .attention_merge = op_attention_merge,
                                           .tp_reduce = op_tp_reduce,
                                           .vec_add = op_vec_add,
                                           .add_rmsnorm = op_add_rmsnorm,
                                           .swiglu = op_swiglu,
                                           .moe_route = op_moe_route,
                                           .moe_group = op_moe_group,
                                           .gather_rows = op_gather_rows,
                                           .matmul_grouped = op_matmul_grouped,
                                           .moe_expert_sum = op_moe_expert_sum,
                                           .deepstack = op_deepstack};

static int check_items(const struct reference_model *m, const struct kv_cache *kv,
                       const struct forward_item *items, int n_items, int *rows, int *ctx) {
    const struct model_config *c = &m->cfg;
    if (m->n_layers > 0 &&
        (!kv || kv->layer_start > m->opt.layer_start || kv->layer_end < m->opt.layer_end ||
         kv->num_kv_heads != m->nkv || kv->head_dim != c->head_dim ||
         (m->kvp > 1 && kv->blocks.max_seq != m->kvp_held)))
        return strata_set_error(
            STRATA_EINVAL,
            "reference_forward: KV cache (layers [%d,%d), %d kv heads, head_dim %d) "
            "does not fit the model (layers [%d,%d), %d kv heads, head_dim %d)",
            kv ? kv->layer_start : 0, kv ? kv->layer_end : 0, kv ? kv->num_kv_heads : 0,
            kv ? kv->head_dim : 0, m->opt.layer_start, m->opt.layer_end, m->nkv, c->head_dim);
    /* Under KVP positions and lengths are global; the cache holds this rank's share. */
    const int max_seq = m->kvp > 1 ? m->opt.kvp.max_seq : kv->blocks.max_seq;
    return forward_items_check("reference_forward", items, n_items, kv->blocks.len,
                               kv->blocks.in_use, kv->blocks.num_slots, max_seq, c->num_layers,
                               rows, ctx);
}

/* KVP: room for a tile of N rows (forward.h's kvp_ buffers). */
static int ensure_kvp_part(struct reference_model *m, int N) {
    if (m->kvp <= 1) return STRATA_OK;
    if (N > kvp_tile_rows(m)) N = kvp_tile_rows(m);
    if (N <= m->cap_kvp_rows) return STRATA_OK;
    const size_t rows_nh = (size_t)N * (size_t)m->nh, K = (size_t)m->kvp;
    const size_t part = rows_nh * (size_t)(m->cfg.head_dim + 2);
    float *parts = realloc(m->kvp_parts, ((K + 1) * part + (K + 1) * rows_nh) * sizeof(float));
    if (parts) m->kvp_parts = parts;
    float *scores =
        parts ? realloc(m->kvp_scores, rows_nh * (size_t)m->kvp_held * sizeof(float)) : NULL;
    if (scores) m->kvp_scores = scores;
    if (!parts || !scores)
        return strata_set_error(STRATA_ENOMEM, "reference_forward: no memory for KVP (%d rows)", N);
    m->kvp_mine = m->kvp_parts + K * part;
    m->kvp_max_all = m->kvp_mine + part;
    m->kvp_max = m->kvp_max_all + K * rows_nh;
    m->cap_kvp_rows = N;
    return STRATA_OK;
}

int reference_forward(struct reference_model *m, struct kv_cache *kv, float *hidden,
                      const struct forward_item *items, int n_items) {
    int N = 0, ctx = 1, rc;
    if (m->n_layers == 0 && !kv) return STRATA_OK; /* embed/head-only stage: nothing to run */
    if ((rc = check_items(m, kv, items, n_items, &N, &ctx))) return rc;
    if (N == 0) return STRATA_OK;
    if (!hidden) return strata_set_error(STRATA_EINVAL, "reference_forward: hidden is NULL");
    if ((rc = ensure_scratch(m, N, ctx)) || (rc = ensure_kvp_part(m, N))) return rc;
    /* The blocks the items' new positions fall in, before any layer writes them (a request
     * that reserved them cannot fail here; one that did not learns the pool is full). */
    for (int it = 0; m->n_layers > 0 && it < n_items; ++it)
        if ((rc = kv_blocks_grow(&kv->blocks, items[it].slot, held_after(m, &items[it]))))
            return rc;
    const struct model_config *c = &m->cfg;
    int half = c->head_dim / 2;
    rope_tables(m->rope_cos, m->rope_sin, m->inv_freq, items, n_items,
                c->has_mrope ? c->mrope_section : NULL, half);
    struct cpu_pass pass = {m, kv, hidden};
    const struct forward_dims dims = {.hidden = c->hidden_size,
                                      .head_dim = c->head_dim,
                                      .heads = m->nh,
                                      .kv_heads = m->nkv,
                                      .ffn = m->ffn,
                                      .eps = c->rms_norm_eps,
                                      .top_k = c->num_experts_per_tok,
                                      .moe_ffn = m->moe_ffn,
                                      .moe_split = m->moe_split,
                                      .kvp = m->kvp,
                                      .kvp_held = m->kvp_held,
                                      .kvp_tile = kvp_tile_rows(m)};
    struct forward_buffers bufs = FORWARD_BUFFERS(m, hidden);
    bufs.kvp_scores = m->kvp_scores;
    bufs.kvp_max = m->kvp_max;
    bufs.kvp_max_all = m->kvp_max_all;
    bufs.kvp_mine = m->kvp_mine;
    bufs.kvp_parts = m->kvp_parts;
    for (int l = 0; l < m->n_layers; ++l)
        if ((rc = forward_layer(&cpu_ops, &pass, &dims, &bufs, &m->layers[l], items, n_items, N)))
            return rc;
    for (int it = 0; it < n_items; ++it)
        kv->blocks.len[items[it].slot] += items[it].n_tokens;
    return STRATA_OK;
}

/* Vocab-parallel head: local [n, Vt] = this rank's rows of lm_head, all-gathered into
 * [tp, n, Vt] and interleaved into logits [n, V] (rank t's columns at t·Vt). */
static int tp_logits(struct reference_model *m, float *logits, int n) {
    const size_t Vt = (size_t)m->vocab_n, rows = (size_t)n, T = (size_t)m->tp;
    const size_t need = (T + 1) * rows * Vt;
    if (need > m->cap_logit_part) {
        float *grown = realloc(m->logit_part, need * sizeof(float));
        if (!grown)
            return strata_set_error(STRATA_ENOMEM, "reference_logits: no memory for %d rows", n);
        m->logit_part = grown;
        m->cap_logit_part = need;
    }
    float *local = m->logit_part + T * rows * Vt, *all = m->logit_part;
    matmul(local, m->norm, &m->lm_head, n, m->pool);
    int rc = m->opt.coll.allgather(m->opt.coll.ctx, all, local, rows * Vt);
    if (rc) return rc;
    for (size_t t = 0; t < T; ++t)
        for (size_t i = 0; i < rows; ++i)
            memcpy(logits + i * (size_t)m->cfg.vocab_size + t * Vt, all + (t * rows + i) * Vt,
                   Vt * sizeof(float));
    return STRATA_OK;
}

int reference_logits(struct reference_model *m, float *logits, const float *hidden, int n) {
    if (!m->opt.with_head)
        return strata_set_error(STRATA_EINVAL,
                                "reference_logits: this model does not own the head");
    if (n < 0) return strata_set_error(STRATA_EINVAL, "reference_logits: %d rows", n);
    if (n == 0) return STRATA_OK;
    if (!logits || !hidden) return strata_set_error(STRATA_EINVAL, "reference_logits: NULL buffer");
    int rc;
    if ((rc = ensure_scratch(m, n, 1))) return rc;
    rmsnorm(m->norm, hidden, m->final_norm, m->cfg.rms_norm_eps, n, m->cfg.hidden_size);
    if (m->tp <= 1) {
        matmul(logits, m->norm, &m->lm_head, n, m->pool);
        return STRATA_OK;
    }
    return tp_logits(m, logits, n);
}
