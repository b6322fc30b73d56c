/* Tensor and KV parallelism on the CUDA backend (design in backend_cuda.c and
 * README.md "Tensor and KV parallelism inside a stage"): the CPU backend's scheme
 * (reference/model.c) on device buffers, its collectives over NCCL sub-groups of the
 * stage's group (nccl_group.h, which keeps tp_reduce's order).
 *
 *   - the shard: runtime/model/tp_shard.h's slice per rank (heads, KV heads, MLP columns,
 *     vocabulary rows), uploaded by backend_cuda_weights.c; the row-parallel projections run
 *     cuda_matmul_split with OPS_SPLIT_LEAVES / T leaves, so a rank's partial is one subtree
 *     of one rank's dot product and nccl_group_reduce adds the subtrees by the tree's top;
 *   - the embedding: this rank's rows gathered, scattered into zeroed rows
 *     (cuda_moe_combine with weight 1: 0 + y·1 = y) and all-reduced: exact;
 *   - the head (`logits`): this rank's [n, V/T] logits all-gathered into [T][n][V/T] and
 *     reordered to [n, V] by T strided device copies (each logit one whole dot product:
 *     exact);
 *   - greedy ids (`argmax`) without assembling the logits, as reference/model_head.c does:
 *     each rank reduces its [n, V/T] logits to one (value, id) pair per row on the device
 *     (cuda_argmax_part_rows, the twin of argmax_part), the pairs are all-gathered (2 floats
 *     per row and rank instead of V/T) and argmax_merge picks each row's id on the host in
 *     rank (= id) order: exactly argmax() of the whole row, ties and NaN included;
 *   - KVP (Medha): a rank caches positions [kvp_lo, kvp_lo + kvp_held) in its own paged
 *     pool (a slot's blocks cover only its positions, and it reserves only its share of a
 *     request's; the rows of other ranks' positions go to a spare block: backend_cuda_kv.c);
 *     attention is the reference's two steps around two all-gathers per row tile (scores
 *     and maxima, the group's max, the partials over this rank's aligned blocks, the merge),
 *     with kernels/attention_kvp.h's twins;
 *   - every wait is nccl_group_wait, bounded by the group's timeout;
 *   - MoE under TP: whole experts per rank (--moe expert; --moe split is refused), one node
 *     of the MoE sum's expert tree (backend_cuda_moe.c), completed by the layer's reduce.
 * Decode graphs stay on under a split (graphs_wanted): every collective of a decode step is
 * queued on c->stream (nccl_group_open's stream) and nothing here waits on the host inside
 * a step, so NCCL captures them into the step's graph; the KVP tile and every collective's
 * size depend only on the row count (a decode batch's b), positions are kernel arguments,
 * so the graph of b items is updated in place from step to step. Emulated only (the NCCL
 * emulation holds collectives to the capture rules: tests/backend_ops/emulated_capture.h);
 * on GPUs the captured NCCL kernels and their updates (cudaGraphExecUpdate) have not run. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/argmax.h"
#include "kernels/attention_kvp.h"
#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/ops_weight_row.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend_cuda_internal.h"
#include "runtime/stage/nccl_group.h"
#include "wire/collective.h"

/* KVP scores kept between the two steps stay under this many floats per row tile (the
 * reference's KVP_SCORE_FLOATS: the tile then depends only on nh and the tokens per rank,
 * the same on every rank of the KVP group, so all make the same collective calls). */
#define KVP_SCORE_FLOATS ((size_t)1 << 20)
/* Ids travel as floats in the argmax pairs' all-gather: exact below 2^24 (model_head.c's). */
#define ARGMAX_MAX_VOCAB (1 << 24)

struct cuda_grid {
    struct nccl_group *tp, *kvp;
    int kvp_tokens;
    float *parts;                 /* TP > 2: [tp][cap_rows * H] gathered partials of a reduce */
    float *logit_all;             /* TP: [tp][cap_logit_rows][V/T] gathered logits */
    float *pairs;                 /* TP: [tp][cap_logit_rows][2] gathered argmax candidates */
    float *h_pairs;               /* the same, pinned host staging */
    float *kvp_scores;            /* KVP: [tile][nh][held] */
    float *kvp_max, *kvp_max_all; /* [tile][nh], [kvp][tile][nh] */
    float *kvp_mine, *kvp_parts;  /* [tile][nh][D+2], [kvp][tile][nh][D+2] */
};

static int grid_tile_rows(const struct cuda_context *c) {
    const size_t per_row = (size_t)c->nh * (size_t)c->grid->kvp_tokens;
    const size_t rows = KVP_SCORE_FLOATS / (per_row ? per_row : 1);
    return rows < 1 ? 1 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* This rank's TP part of the model (the shard's dimensions). */
static int init_tp(struct cuda_context *c, const struct stage_tp_config *g) {
    const struct model_config *m = c->cfg;
    for (int l = c->role.layer_start; l < c->role.layer_end && g->moe == TP_MOE_SPLIT; ++l)
        if (model_config_layer_is_moe(m, l))
            return strata_set_error(STRATA_EINVAL,
                                    "cuda backend: MoE layer %d under --tp %d --moe split: the "
                                    "CUDA backend splits MoE layers by whole experts only (--moe "
                                    "expert, the default)",
                                    l, g->tp);
    int rc = tp_shard_init(&c->shard, m, g->tp, g->tp_rank, g->moe);
    if (rc) return rc;
    if (OPS_SPLIT_LEAVES % g->tp)
        return strata_set_error(STRATA_EINVAL, "cuda backend: TP %d does not divide %d leaves",
                                g->tp, OPS_SPLIT_LEAVES);
    const struct tp_shard *sh = &c->shard;
    c->tp = g->tp;
    c->tp_rank = g->tp_rank;
    c->nh = sh->q_heads.end - sh->q_heads.start;
    c->nkv = sh->kv_heads.end - sh->kv_heads.start;
    c->ffn = sh->ffn.end - sh->ffn.start;
    c->vocab_start = sh->vocab.start;
    c->vocab_n = sh->vocab.end - sh->vocab.start;
    c->experts_lo = sh->experts.start;
    c->experts_hi = sh->experts.end;
    c->leaves = OPS_SPLIT_LEAVES / g->tp;
    return STRATA_OK;
}

/* This rank's KV positions (reference/model.c init_kvp's checks). */
static int init_kvp(struct cuda_context *c, const struct stage_tp_config *g, int max_seq) {
    if (!kvp_tokens_aligned(g->kvp_tokens))
        return strata_set_error(STRATA_EINVAL,
                                "cuda backend: %d KV tokens per KVP rank is not %d x a power of "
                                "two (each rank's keys must be one subtree of attention's block "
                                "tree)",
                                g->kvp_tokens, GRID_KV_BLOCK);
    struct grid_config grid = {.pp = 1, .tp = 1, .kvp = g->kvp, .kvp_tokens = g->kvp_tokens};
    struct tp_range r = kvp_token_range(&grid, g->kvp_rank, max_seq);
    if ((int64_t)g->kvp_tokens * g->kvp < max_seq || r.end <= r.start)
        return strata_set_error(STRATA_ERANGE,
                                "cuda backend: KVP %d x %d tokens cannot hold max_seq %d with "
                                "every rank holding some",
                                g->kvp, g->kvp_tokens, max_seq);
    c->kvp = g->kvp;
    c->kvp_rank = g->kvp_rank;
    c->kvp_lo = r.start;
    c->kvp_held = r.end - r.start;
    c->grid->kvp_tokens = g->kvp_tokens;
    return STRATA_OK;
}

int backend_cuda_grid_open(struct cuda_context *c, const struct stage_backend_options *opt) {
    const struct model_config *m = c->cfg;
    const struct stage_tp_config *g = opt->tp;
    c->tp = c->kvp = 1;
    c->tp_rank = c->kvp_rank = 0;
    c->nh = m->num_heads;
    c->nkv = m->num_kv_heads;
    c->ffn = m->intermediate_size;
    c->leaves = OPS_SPLIT_LEAVES;
    c->vocab_start = 0;
    c->vocab_n = m->vocab_size;
    c->experts_lo = 0;
    c->experts_hi = m->num_experts;
    c->kvp_lo = 0;
    c->kvp_held = opt->max_seq;
    if (!stage_tp_is_split(g)) return STRATA_OK;
    const int T = g->tp > 1 ? g->tp : 1, K = g->kvp > 1 ? g->kvp : 1;
    if (!g->coll || coll_size(g->coll) != T * K ||
        coll_rank(g->coll) != g->kvp_rank * T + g->tp_rank)
        return strata_set_error(STRATA_EINVAL,
                                "cuda backend: TP rank %d of %d x KVP rank %d of %d, but the group "
                                "says rank %d of %d",
                                g->tp_rank, T, g->kvp_rank, K, g->coll ? coll_rank(g->coll) : -1,
                                g->coll ? coll_size(g->coll) : 0);
    if (!(c->grid = calloc(1, sizeof *c->grid)))
        return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    int rc = STRATA_OK;
    if (T > 1) rc = init_tp(c, g);
    if (!rc && K > 1) rc = init_kvp(c, g, opt->max_seq);
    if (rc) return rc;
    /* Every rank of the stage's group opens both sub-groups, in this order (a group of one
     * still takes part in the id exchange). */
    char tp_label[48], kvp_label[48];
    snprintf(tp_label, sizeof tp_label, "cuda.k%d.tp%d", g->kvp_rank, T);
    snprintf(kvp_label, sizeof kvp_label, "cuda.t%d.kvp%d", g->tp_rank, K);
    struct nccl_group_options to = {g->coll, g->kvp_rank * T, 1, T, tp_label, c->stream, 0};
    struct nccl_group_options ko = {g->coll, g->tp_rank, T, K, kvp_label, c->stream, 0};
    if ((rc = nccl_group_open(&c->grid->tp, &to))) return rc;
    return nccl_group_open(&c->grid->kvp, &ko);
}

static void free_kvp_scratch(struct cuda_grid *g) {
    float **p[] = {&g->kvp_scores, &g->kvp_max, &g->kvp_max_all, &g->kvp_mine, &g->kvp_parts};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) {
        cuda_free(*p[i]);
        *p[i] = NULL;
    }
}

void backend_cuda_grid_close(struct cuda_context *c) {
    struct cuda_grid *g = c->grid;
    if (!g) return;
    nccl_group_close(g->tp);
    nccl_group_close(g->kvp);
    cuda_free(g->parts);
    cuda_free(g->logit_all);
    cuda_free(g->pairs);
    cuda_host_free(g->h_pairs);
    free_kvp_scratch(g);
    free(g);
    c->grid = NULL;
}

int backend_cuda_grid_scratch(struct cuda_context *c, int rows) {
    struct cuda_grid *g = c->grid;
    if (!g) return STRATA_OK;
    int rc = STRATA_OK;
    cuda_free(g->parts);
    g->parts = NULL;
    if (c->tp > 2)
        rc = cuda_malloc((void **)&g->parts,
                         (size_t)c->tp * (size_t)rows * (size_t)c->cfg->hidden_size * 4);
    free_kvp_scratch(g);
    if (rc || c->kvp <= 1) return rc;
    const int tile = rows < grid_tile_rows(c) ? rows : grid_tile_rows(c);
    const size_t rows_nh = (size_t)tile * (size_t)c->nh, K = (size_t)c->kvp;
    const size_t part = rows_nh * (size_t)(c->cfg->head_dim + 2);
    if ((rc = cuda_malloc((void **)&g->kvp_scores, rows_nh * (size_t)c->kvp_held * 4)) ||
        (rc = cuda_malloc((void **)&g->kvp_max, rows_nh * 4)) ||
        (rc = cuda_malloc((void **)&g->kvp_max_all, K * rows_nh * 4)) ||
        (rc = cuda_malloc((void **)&g->kvp_mine, part * 4)))
        return rc;
    return cuda_malloc((void **)&g->kvp_parts, K * part * 4);
}

int backend_cuda_grid_logit_scratch(struct cuda_context *c, int rows) {
    struct cuda_grid *g = c->grid;
    if (!g || c->tp <= 1) return STRATA_OK;
    cuda_free(g->logit_all);
    cuda_free(g->pairs);
    cuda_host_free(g->h_pairs);
    g->logit_all = g->pairs = g->h_pairs = NULL;
    const size_t T = (size_t)c->tp, pair_bytes = T * (size_t)rows * 2 * sizeof(float);
    int rc = cuda_malloc((void **)&g->logit_all, T * (size_t)rows * (size_t)c->vocab_n * 4);
    if (!rc) rc = cuda_malloc((void **)&g->pairs, pair_bytes);
    if (!rc) rc = cuda_host_alloc((void **)&g->h_pairs, pair_bytes);
    return rc;
}

int backend_cuda_sync(struct cuda_context *c) {
    if (!c->grid || !c->grid->tp || !c->grid->kvp) /* no split, or not opened yet */
        return cuda_stream_synchronize(c->stream);
    /* Either wait covers the whole stream; a group of one returns at once. */
    int rc = nccl_group_wait(c->grid->tp);
    return rc ? rc : nccl_group_wait(c->grid->kvp);
}

int backend_cuda_tp_reduce(struct cuda_context *c, float *x, size_t n) {
    if (c->tp <= 1) return STRATA_OK;
    return nccl_group_reduce(c->grid->tp, x, c->grid->parts, n);
}

int backend_cuda_tp_embed(struct cuda_context *c, const int32_t *tokens, int k) {
    const int H = c->cfg->hidden_size;
    int m = 0, rc;
    void *s = c->stream;
    for (int i = 0; i < k; ++i) {
        const int local = tokens[i] - c->vocab_start;
        if (local < 0 || local >= c->vocab_n) continue; /* another rank's row: zeros here */
        c->h_tokens[m] = local;
        c->h_moe_row[m] = i;
        c->h_moe_w[m++] = 1.0f;
    }
    const size_t ids = (size_t)m * sizeof(int32_t);
    if ((rc = cuda_memset_async(c->hidden, 0, (size_t)k * (size_t)H * sizeof(float), s))) return rc;
    if (m && ((rc = cuda_memcpy_async(c->tokens, c->h_tokens, ids, CUDA_COPY_TO_DEVICE, s)) ||
              (rc = cuda_memcpy_async(c->moe_row, c->h_moe_row, ids, CUDA_COPY_TO_DEVICE, s)) ||
              (rc = cuda_memcpy_async(c->moe_w, c->h_moe_w, (size_t)m * sizeof(float),
                                      CUDA_COPY_TO_DEVICE, s)) ||
              (rc = cuda_ops_weight_rows(c->proj, &c->embed, c->tokens, m, s)) ||
              (rc = cuda_moe_combine(c->hidden, c->proj, c->moe_row, c->moe_w, m, H, s))))
        return rc;
    return backend_cuda_tp_reduce(c, c->hidden, (size_t)k * (size_t)H);
}

int backend_cuda_tp_head(struct cuda_context *c, int n) {
    const size_t Vt = (size_t)c->vocab_n, V = (size_t)c->cfg->vocab_size, rows = (size_t)n;
    struct nccl_group *tp = c->grid->tp;
    float *all = c->grid->logit_all, *mine = all + (size_t)nccl_group_rank(tp) * rows * Vt;
    int rc;
    if ((rc = cuda_matmul(mine, c->norm, &c->lm_head, n, c->stream)) ||
        (rc = nccl_group_allgather(tp, all, mine, rows * Vt)))
        return rc;
    for (int t = 0; t < c->tp && !rc; ++t) /* rank t's [n][Vt] -> columns [t·Vt, (t+1)·Vt) */
        rc = cuda_memcpy_2d_async(c->logits + (size_t)t * Vt, V * sizeof(float),
                                  all + (size_t)t * rows * Vt, Vt * sizeof(float),
                                  Vt * sizeof(float), rows, CUDA_COPY_ON_DEVICE, c->stream);
    return rc;
}

int backend_cuda_tp_argmax(struct cuda_context *c, int32_t *ids, const float *local, int n) {
    const int T = c->tp;
    const size_t rows = (size_t)n, bytes = (size_t)T * rows * 2 * sizeof(float);
    struct cuda_grid *g = c->grid;
    float *mine = g->pairs + (size_t)nccl_group_rank(g->tp) * rows * 2;
    int rc;
    if (c->cfg->vocab_size >= ARGMAX_MAX_VOCAB)
        return strata_set_error(STRATA_EINVAL, "cuda argmax: a vocabulary of %d ids under TP",
                                c->cfg->vocab_size);
    if ((rc = cuda_argmax_part_rows(mine, local, n, c->vocab_n, c->vocab_start, c->stream)) ||
        (rc = nccl_group_allgather(g->tp, g->pairs, mine, rows * 2)) ||
        (rc = cuda_memcpy_async(g->h_pairs, g->pairs, bytes, CUDA_COPY_TO_HOST, c->stream)) ||
        (rc = backend_cuda_sync(c)))
        return rc;
    for (size_t i = 0; i < rows; ++i) {
        struct argmax_candidate cand[GRID_MAX_DEGREE];
        for (int t = 0; t < T; ++t) { /* rank t's pair of row i; ranks hold the ids in order */
            const float *p = g->h_pairs + ((size_t)t * rows + i) * 2;
            cand[t] = (struct argmax_candidate){p[0], (int)p[1]};
        }
        ids[i] = argmax_merge(cand, T);
    }
    return STRATA_OK;
}

int backend_cuda_kvp_tile(const struct cuda_context *c) {
    return c->kvp > 1 ? grid_tile_rows(c) : 0;
}

void backend_cuda_kvp_buffers(const struct cuda_context *c, struct forward_buffers *b) {
    const struct cuda_grid *g = c->grid;
    if (c->kvp <= 1 || !g) return;
    b->kvp_scores = g->kvp_scores;
    b->kvp_max = g->kvp_max;
    b->kvp_max_all = g->kvp_max_all;
    b->kvp_mine = g->kvp_mine;
    b->kvp_parts = g->kvp_parts;
}

int backend_cuda_op_attention_partial_max(void *ctx, const struct layer_weights *L,
                                          const struct forward_item *item, int first, int n,
                                          float *max, float *scores, const float *q) {
    const struct cuda_context *c = ctx;
    const struct ops_kv view = kv_view(c, item->slot, L->index);
    return cuda_attention_partial_max(max, scores, q, &view, item->pos + first, n, c->kvp_lo,
                                      c->kvp_held, c->nh, c->nkv, c->cfg->head_dim, c->stream);
}

int backend_cuda_op_attention_partial(void *ctx, const struct layer_weights *L,
                                      const struct forward_item *item, int first, int n,
                                      float *part, const float *scores, const float *max) {
    const struct cuda_context *c = ctx;
    const struct ops_kv view = kv_view(c, item->slot, L->index);
    return cuda_attention_partial(part, scores, max, &view, item->pos + first, n, c->kvp_lo,
                                  c->kvp_held, c->nh, c->nkv, c->cfg->head_dim, c->stream);
}

int backend_cuda_op_kvp_allgather(void *ctx, float *all, const float *mine, size_t n) {
    const struct cuda_context *c = ctx;
    return nccl_group_allgather(c->grid->kvp, all, mine, n);
}

int backend_cuda_op_attention_group_max(void *ctx, float *max, const float *all, size_t n) {
    const struct cuda_context *c = ctx;
    return cuda_attention_group_max(max, all, c->kvp, n, c->stream);
}

int backend_cuda_op_attention_merge(void *ctx, float *out, const float *parts, int rows) {
    const struct cuda_context *c = ctx;
    return cuda_attention_merge(out, parts, c->kvp, rows, c->nh, c->cfg->head_dim, c->stream);
}
