/* The CUDA backend: the reference decoder's forward pass (reference/model.c) with the
 * kernels/ twins, weights and KV cache on one device, behind the stage backend table
 * (backend.h). Plain C: only the kernels' C headers and kernels/cuda_device.h.
 *
 * What lives where:
 *   - weights: uploaded once at open by walking the role's manifest
 *     (runtime/model/stage_tensors.h) as reference/model_load.c does: bf16 / f32 matrices
 *     as stored, f16 matrices widened to f32, norms and biases as f32, fused experts used
 *     in place (out-major) or transposed once on the host (in-major);
 *   - KV cache: a paged pool of blocks, [block][layer][kv_head][KV_BLOCK][head_dim] on the
 *     device, f32, bf16 or f16 as --kv-dtype says (the kernels round and widen as the
 *     reference ops do), the layout of reference/kv_cache.h, sized by the options' budget (under
 *     KVP a rank's positions only, plus a spare block: backend_cuda_kv.c); which blocks each
 *     slot holds, lengths and reservations are reference/kv_blocks.h's bookkeeping on the
 *     host, the CPU backend's; each slot's block table is mirrored on the device at a fixed
 *     place, its new entries uploaded before the forward that reads them. A forward first
 *     grows each item's slot to the positions it will hold (as reference_forward does), so
 *     a request that reserved its blocks (kv_reserve) never finds the pool full;
 *   - activation scratch: device buffers sized like the reference's, grown on demand to
 *     the largest call seen, with pinned host staging buffers of the same row count;
 *   - per call: everything is queued on the backend's one stream: the caller's rows are
 *     copied into pinned staging, sent with one asynchronous copy, the layers run, the
 *     result comes back with one asynchronous copy, and the call synchronises the stream
 *     once at its end. RoPE tables are built on the host by the reference's rope_tables
 *     (bitwise the CPU's) into pinned memory and sent the same way. MoE layers run on the
 *     device end to end (backend_cuda_moe.c: routing, grouping by expert, grouped expert
 *     matmuls whose row counts are device data, the reference's expert-tree sum), so they
 *     add no synchronisation;
 *   - greedy decoding: `argmax` runs the head and cuda_argmax on the device and copies back
 *     one id per row instead of V logits (under TP: one (value, id) pair per row and rank,
 *     merged on the host, the logits never assembled: backend_cuda_tp.c);
 *   - decode graphs: a decode step of b one-token items is captured into a CUDA graph and
 *     launched as one (kernels/cuda_device.h); the graph of b items is kept and updated in
 *     place at each step (new positions are new kernel arguments, the KV rows' offsets are
 *     data sent with the rows, a slot's block table is read where it always is),
 *     re-instantiated only when its topology changes. The first step of each b runs
 *     eagerly. MoE layers are captured like the rest (their launch shapes depend only on b).
 *     Off with STRATA_CUDA_GRAPHS=0. On an H200 every golden ran through CUDA's own graphs
 *     (2207 launches, none re-instantiated after a failed update), bit-identical to eager.
 *
 * The row-parallel projections (o_proj, down, expert down) run as cuda_matmul_split with
 * OPS_SPLIT_LEAVES leaves, as reference/model.c does on one rank, so every projection has
 * the reference's reduction order (only CUDA's expf / erff / tanhf differ by ulps).
 *
 * Tensor and KV parallelism (--tp / --kvp, backend_cuda_tp.c): a rank holds its shard
 * (c->nh, c->nkv, c->ffn, vocabulary rows; OPS_SPLIT_LEAVES / T leaves) and, under KVP, its
 * positions of every sequence; the layer loop adds one TP reduce after o_proj and one after
 * down, the embedding and head are vocab-parallel, attention under KVP is the reference's two
 * steps around the group's all-gathers, all on NCCL with the CPU backend's order, so every
 * rank's logits are one rank's bits. Waits go through backend_cuda_sync (nccl_group_wait,
 * bounded, under a split, and never inside a captured step). Decode graphs are on under a
 * split as without one: the step's collectives are captured with its kernels (verified in
 * emulation only: the device run had one GPU).
 *
 * Determinism: every kernel computes each output element in one fixed order that depends
 * on neither the batch nor the neighbouring rows (kernels/README.md), all launches go to
 * one stream in the reference's order, and the MoE sum is the reference's expert tree
 * (backend_cuda_moe.c); so splits, batching, graphs and KV handovers give identical bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/add_rmsnorm.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/cuda_device.h"
#include "kernels/kv_store.h"
#include "kernels/matmul.h"
#include "kernels/ops_vision.h"
#include "kernels/ops_weight_row.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "reference/ops.h"
#include "reference/forward.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/backend_cuda_internal.h"

/* ---------------------------------------------------------------- scratch */

static void free_scratch(struct cuda_context *c) {
    float **dev[] = {&c->hidden, &c->norm,     &c->proj,   &c->q,        &c->k,        &c->v,
                     &c->attn,   &c->ffn_gate, &c->ffn_up, &c->rope_cos, &c->rope_sin, &c->router,
                     &c->moe_x,  &c->moe_w,    &c->scores, &c->deepstack};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) {
        cuda_free(*dev[i]);
        *dev[i] = NULL;
    }
    int32_t **ids[] = {&c->moe_row, &c->tokens, &c->ids, &c->moe_slot, &c->moe_offsets};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; ++i) {
        cuda_free(*ids[i]);
        *ids[i] = NULL;
    }
    cuda_free(c->moe_expert);
    cuda_free(c->row_dst);
    cuda_host_free(c->h_row_dst);
    c->moe_expert = NULL;
    c->row_dst = c->h_row_dst = NULL;
    void **pinned[] = {(void **)&c->h_hidden, (void **)&c->h_tokens, (void **)&c->h_cos,
                       (void **)&c->h_sin,    (void **)&c->h_moe_w,  (void **)&c->h_moe_row};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; ++i) {
        cuda_host_free(*pinned[i]);
        *pinned[i] = NULL;
    }
    c->cap_rows = 0;
}

struct alloc_req {
    void **p;
    size_t bytes;
};

/* Device and host scratch for `rows` rows (grown, never shrunk). Called only between
 * calls (the stream is idle), never while a graph is being captured. */
static int ensure_scratch(struct cuda_context *c, int rows) {
    if (rows <= c->cap_rows) return 0;
    free_scratch(c);
    const struct model_config *m = c->cfg;
    size_t r = (size_t)rows, H = (size_t)m->hidden_size, D = (size_t)m->head_dim;
    size_t qd = (size_t)c->nh * D, kvd = (size_t)c->nkv * D;
    size_t E = m->num_experts > 0 ? (size_t)m->num_experts : 1;
    size_t K = m->num_experts_per_tok > 0 ? (size_t)m->num_experts_per_tok : 1;
    /* FFN rows: r of the dense MLP, or r * K grouped expert rows (reference/forward.c forward_moe).
     */
    size_t ffn = (size_t)c->ffn, moe_rows = m->num_experts > 0 ? K : 0;
    if (moe_rows * (size_t)m->moe_intermediate_size > ffn)
        ffn = moe_rows * (size_t)m->moe_intermediate_size;
    struct alloc_req dev[] = {
        {(void **)&c->hidden, r * H * 4},
        {(void **)&c->norm, r * H * 4},
        {(void **)&c->proj, r * H * 4},
        {(void **)&c->q, r * qd * 4},
        {(void **)&c->k, r * kvd * 4},
        {(void **)&c->v, r * kvd * 4},
        {(void **)&c->attn, r * qd * 4},
        {(void **)&c->ffn_gate, r * ffn * 4},
        {(void **)&c->ffn_up, r * ffn * 4},
        {(void **)&c->rope_cos, r * D / 2 * 4},
        {(void **)&c->rope_sin, r * D / 2 * 4},
        {(void **)&c->router, r * E * 4},
        {(void **)&c->moe_x, r * K * H * 4},
        {(void **)&c->moe_w, r * K * 4},
        {(void **)&c->moe_row, r * K * 4},
        {(void **)&c->moe_slot, r * K * 4},
        {(void **)&c->moe_expert, r * K * 4},
        {(void **)&c->moe_offsets, (E + 1) * 4},
        {(void **)&c->tokens, r * 4},
        {(void **)&c->ids, r * 4},
        {(void **)&c->row_dst, r * 8},
        {(void **)&c->deepstack, r * H * 4},
        {(void **)&c->scores, c->score_floats * 4},
    };
    struct alloc_req pinned[] = {
        {(void **)&c->h_hidden, r * H * 4},  {(void **)&c->h_tokens, r * 4},
        {(void **)&c->h_cos, r * D / 2 * 4}, {(void **)&c->h_sin, r * D / 2 * 4},
        {(void **)&c->h_moe_w, r * K * 4},   {(void **)&c->h_moe_row, r * K * 4},
        {(void **)&c->h_row_dst, r * 8},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0] && !rc; ++i)
        rc = cuda_malloc(dev[i].p, dev[i].bytes);
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0] && !rc; ++i)
        rc = cuda_host_alloc(pinned[i].p, pinned[i].bytes);
    if (!rc) rc = backend_cuda_grid_scratch(c, rows);
    if (rc) {
        free_scratch(c);
        return rc;
    }
    c->cap_rows = rows;
    return 0;
}

/* Device logits [rows, V] and their pinned staging (grown, never shrunk). */
static int ensure_logits(struct cuda_context *c, int rows) {
    if (rows <= c->cap_logit_rows) return 0;
    size_t bytes = (size_t)rows * (size_t)c->cfg->vocab_size * sizeof(float);
    cuda_free(c->logits);
    cuda_host_free(c->h_logits);
    c->logits = c->h_logits = NULL;
    c->cap_logit_rows = 0;
    int rc = cuda_malloc((void **)&c->logits, bytes);
    if (!rc) rc = cuda_host_alloc((void **)&c->h_logits, bytes);
    if (!rc) rc = backend_cuda_grid_logit_scratch(c, rows);
    if (!rc) c->cap_logit_rows = rows;
    return rc;
}

/* ---------------------------------------------------------------- forward */

/* x [n, dim] += bias [dim] on every row (the reference's add_bias), when there is one. */
static int add_bias(struct cuda_context *c, float *x, const float *bias, int n, int dim) {
    return bias ? cuda_add_bias(x, bias, n, dim, c->stream) : 0;
}

/* Each row's KV offset in elements from its layer's base (kv_view's k; the layer is added to
 * the base pointer): kv head 0 of the row's position where its slot's table puts it,
 * host_rows [N], for cuda_kv_store_rows. Under KVP a position is stored at its local index
 * when this rank holds it, and rows another rank holds go to the spare block (written,
 * never read), so the store stays one launch of N rows (reference/model.c store_kv skips
 * them). After backend_cuda_kv_prepare: the tables cover every position held. */
static void kv_row_offsets(const struct cuda_context *c, int64_t *host_rows,
                           const struct forward_item *items, int n_items) {
    int row = 0;
    for (int it = 0; it < n_items; ++it)
        for (int i = 0; i < items[it].n_tokens; ++i)
            host_rows[row++] =
                backend_cuda_kv_row_offset(c, items[it].slot, items[it].pos + i - c->kvp_lo);
}

/* The keys and values of all rows appended to the cache in one launch (cuda_kv_store_rows,
 * reference/model.c store_kv; offsets from kv_row_offsets, sent with the rows). */
static int op_kv_store(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                       int n_items, int rows) {
    const struct cuda_context *c = ctx;
    const struct ops_kv view = kv_view(c, items[0].slot, L->index); /* the layer's base */
    (void)n_items;
    return cuda_kv_store_rows(view.k, view.v, view.dtype, c->k, c->v, c->row_dst, view.head_stride,
                              c->nkv * c->cfg->head_dim, rows, c->nkv, c->cfg->head_dim, c->stream);
}

/* One item's queries in chunks so the score rows fit the scratch; query i of a chunk
 * starting at i0 sits at pos + i0 + i, exactly as in one call. */
static int op_attention(void *ctx, const struct layer_weights *L, const struct forward_item *item,
                        float *out, const float *q) {
    const struct cuda_context *c = ctx;
    const int D = c->cfg->head_dim, nh = c->nh;
    const size_t qd = (size_t)nh * (size_t)D;
    const struct ops_kv view = kv_view(c, item->slot, L->index);
    /* Queries per launch: each (query, head) row needs at most the item's last row's
     * floats; one query always fits (score_floats covers max_seq, cuda_open). */
    const size_t per_query = cuda_attention_row_floats(item->pos, item->n_tokens, D);
    const int chunk = (int)(c->score_floats / ((size_t)nh * per_query)); /* >= 1 */
    int rc = 0;
    for (int i0 = 0; i0 < item->n_tokens && !rc; i0 += chunk) {
        const int n = item->n_tokens - i0 < chunk ? item->n_tokens - i0 : chunk;
        const size_t off = (size_t)i0 * qd;
        rc = cuda_attention(out + off, q + off, &view, c->scores, item->pos + i0, n, nh, c->nkv, D,
                            c->stream);
    }
    return rc;
}

/* DeepStack (spec §5.4): after layer k, add feature k on visual rows; each run of
 * consecutive visual rows is one add over their contiguous rows. The features come from
 * the caller's (pageable) memory with a synchronous copy, so the stream is synchronised
 * first: the previous add may still be reading c->deepstack. Only Qwen3-VL prefill rows
 * carry features (never a graph-captured decode step). */
static int add_deepstack(struct cuda_context *c, const struct layer_weights *L,
                         const struct forward_item *items, int n_items) {
    int H = c->cfg->hidden_size, row = 0, rc = 0;
    for (int it = 0; it < n_items && !rc; ++it) {
        const struct forward_item *item = &items[it];
        if (item->deepstack && L->index < item->num_deepstack) {
            const float *feat =
                item->deepstack + (size_t)L->index * (size_t)item->n_tokens * (size_t)H;
            if (!(rc = backend_cuda_sync(c)))
                rc = cuda_memcpy_to_device(c->deepstack, feat,
                                           (size_t)item->n_tokens * (size_t)H * sizeof(float));
            for (int i = 0; i < item->n_tokens && !rc;) {
                if (item->visual_mask && !item->visual_mask[i]) {
                    ++i;
                    continue;
                }
                int j = i + 1;
                while (j < item->n_tokens && (!item->visual_mask || item->visual_mask[j]))
                    ++j;
                rc = cuda_vec_add(c->hidden + (size_t)(row + i) * (size_t)H,
                                  c->deepstack + (size_t)i * (size_t)H, (j - i) * H, c->stream);
                i = j;
            }
        }
        row += item->n_tokens;
    }
    return rc;
}

/* The owned layers over c->hidden [N, H] in place (reference/forward.h), between the
 * uploads of the step's tables and rows and the download of the rows. */
/* ---- the device's table of reference/forward.h ops: the kernels on the stream ---- */

static int op_rmsnorm(void *ctx, float *out, const float *x, const float *w, float eps, int rows,
                      int dim) {
    return cuda_rmsnorm(out, x, w, eps, rows, dim, ((struct cuda_context *)ctx)->stream);
}

static int op_matmul_multi(void *ctx, float *const *outs, const struct ops_weight *const *ws,
                           int count, const float *x, int rows) {
    return cuda_matmul_multi(outs, ws, count, x, rows, ((struct cuda_context *)ctx)->stream);
}

static int op_matmul_split(void *ctx, float *out, const float *x, const struct ops_weight *w,
                           int rows) {
    const struct cuda_context *c = ctx;
    return cuda_matmul_split(out, x, w, rows, c->leaves, c->stream);
}

static int op_add_bias(void *ctx, float *x, const float *bias, int rows, int dim) {
    return add_bias(ctx, x, bias, rows, dim);
}

static int op_qk_norm_rope(void *ctx, float *q, float *k, const float *q_norm, const float *k_norm,
                           float eps, const float *cos_t, const float *sin_t, int rows, int heads,
                           int kv_heads, int head_dim) {
    return cuda_qk_norm_rope(q, k, q_norm, k_norm, eps, cos_t, sin_t, rows, heads, kv_heads,
                             head_dim, ((struct cuda_context *)ctx)->stream);
}

static int op_tp_reduce(void *ctx, float *x, size_t n) {
    return backend_cuda_tp_reduce(ctx, x, n);
}

static int op_vec_add(void *ctx, float *x, const float *y, int n) {
    return cuda_vec_add(x, y, n, ((struct cuda_context *)ctx)->stream);
}

static int op_add_rmsnorm(void *ctx, float *out, float *h, const float *y, const float *w,
                          float eps, int rows, int dim) {
    return cuda_add_rmsnorm(out, h, y, w, eps, rows, dim, ((struct cuda_context *)ctx)->stream);
}

static int op_swiglu(void *ctx, float *out, const float *gate, const float *up, int n) {
    return cuda_swiglu(out, gate, up, n, ((struct cuda_context *)ctx)->stream);
}

static int op_deepstack(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                        int n_items) {
    return add_deepstack(ctx, L, items, n_items);
}

static const struct forward_ops cuda_ops = {
    .rmsnorm = op_rmsnorm,
    .matmul_multi = op_matmul_multi,
    .matmul_split = op_matmul_split,
    .add_bias = op_add_bias,
    .qk_norm_rope = op_qk_norm_rope,
    .kv_store = op_kv_store,
    .attention = op_attention,
    .attention_partial_max = backend_cuda_op_attention_partial_max,
    .attention_partial = backend_cuda_op_attention_partial,
    .kvp_allgather = backend_cuda_op_kvp_allgather,
    .attention_group_max = backend_cuda_op_attention_group_max,
    .attention_merge = backend_cuda_op_attention_merge,
    .tp_reduce = op_tp_reduce,
    .vec_add = op_vec_add,
    .add_rmsnorm = op_add_rmsnorm,
    .swiglu = op_swiglu,
    .moe_route = backend_cuda_op_moe_route,
    .moe_group = backend_cuda_op_moe_group,
    .gather_rows = backend_cuda_op_gather_rows,
    .matmul_grouped = backend_cuda_op_matmul_grouped,
    .moe_expert_sum = backend_cuda_op_moe_expert_sum,
    .deepstack = op_deepstack};

/* reference/model.c check_items, against the host bookkeeping of the device cache. */
static int check_items(const struct stage_backend *be, const struct forward_item *items,
                       int n_items, int *rows) {
    const struct cuda_context *c = ctx(be);
    int context;
    return forward_items_check("cuda forward", items, n_items, c->kv.len, c->kv.in_use,
                               be->num_slots, be->max_seq, c->cfg->num_layers, rows, &context);
}

/* Queues one forward on the stream: the staged rows and RoPE tables in, the layers, the
 * rows back into staging. Nothing here synchronises (a graph can hold it; MoE layers too). */
static int enqueue_forward(struct cuda_context *c, const struct forward_item *items, int n_items,
                           int N) {
    int H = c->cfg->hidden_size, rc;
    size_t table = (size_t)N * (size_t)(c->cfg->head_dim / 2) * sizeof(float);
    size_t rows = (size_t)N * (size_t)H * sizeof(float);
    if ((rc = cuda_memcpy_async(c->row_dst, c->h_row_dst, (size_t)N * sizeof(int64_t),
                                CUDA_COPY_TO_DEVICE, c->stream)) ||
        (rc = cuda_memcpy_async(c->rope_cos, c->h_cos, table, CUDA_COPY_TO_DEVICE, c->stream)) ||
        (rc = cuda_memcpy_async(c->rope_sin, c->h_sin, table, CUDA_COPY_TO_DEVICE, c->stream)) ||
        (rc = cuda_memcpy_async(c->hidden, c->h_hidden, rows, CUDA_COPY_TO_DEVICE, c->stream)))
        return rc;
    const struct forward_dims dims = {.hidden = H,
                                      .head_dim = c->cfg->head_dim,
                                      .heads = c->nh,
                                      .kv_heads = c->nkv,
                                      .ffn = c->ffn,
                                      .eps = c->cfg->rms_norm_eps,
                                      .top_k = c->cfg->num_experts_per_tok,
                                      .moe_ffn = c->cfg->moe_intermediate_size,
                                      .moe_chunk = backend_cuda_moe_chunk(c),
                                      .kvp = c->kvp,
                                      .kvp_held = c->kvp_held,
                                      .kvp_tile = backend_cuda_kvp_tile(c)};
    struct forward_buffers bufs = FORWARD_BUFFERS(c, c->hidden);
    backend_cuda_kvp_buffers(c, &bufs);
    for (int l = 0; l < c->n_layers && !rc; ++l)
        rc = forward_layer(&cuda_ops, c, &dims, &bufs, &c->layers[l], items, n_items, N);
    if (!rc) rc = cuda_memcpy_async(c->h_hidden, c->hidden, rows, CUDA_COPY_TO_HOST, c->stream);
    return rc;
}

/* The decode batch size whose graph runs this call: n_items when every item is one token
 * without DeepStack features and graphs are on, else 0 (run eagerly). */
static int graph_batch(const struct stage_backend *be, const struct forward_item *items,
                       int n_items) {
    const struct cuda_context *c = ctx(be);
    if (!c->use_graphs || n_items < 1 || n_items > be->num_slots) return 0;
    for (int it = 0; it < n_items; ++it)
        if (items[it].n_tokens != 1 || items[it].deepstack) return 0;
    return n_items;
}

/* Captures this step into graph b (updating the one kept from the last step of b items
 * when its topology is unchanged) and launches it. */
static int run_graph(struct cuda_context *c, int b, const struct forward_item *items, int n_items,
                     int N) {
    int instantiated = 0, rc;
    if ((rc = cuda_graph_capture_begin(c->stream))) return rc;
    if ((rc = enqueue_forward(c, items, n_items, N))) {
        cuda_graph_capture_abort(c->stream);
        return rc;
    }
    if ((rc = cuda_graph_capture_end(c->stream, &c->graph_exec[b], &instantiated))) return rc;
    c->graph_instantiations += instantiated;
    c->graph_launches++;
    return cuda_graph_launch(c->graph_exec[b], c->stream);
}

static int cuda_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                        int n_items) {
    struct cuda_context *c = ctx(be);
    const struct model_config *m = c->cfg;
    int N = 0, rc, H = m->hidden_size;
    if ((rc = check_items(be, items, n_items, &N))) return rc;
    if (N == 0) return 0;
    if (!hidden) return strata_set_error(STRATA_EINVAL, "cuda forward: hidden is NULL");
    if ((rc = cuda_set_device(c->device)) || (rc = ensure_scratch(c, N))) return rc;
    /* The blocks the items' new positions fall in, before any layer writes them, and their
     * tables on the device (outside a graph: a decode graph reads them where they are). */
    if ((rc = backend_cuda_kv_prepare(c, items, n_items))) return rc;
    /* RoPE tables on the host by the reference op (bitwise the CPU backend's). */
    rope_tables(c->h_cos, c->h_sin, c->inv_freq, items, n_items,
                m->has_mrope ? m->mrope_section : NULL, m->head_dim / 2);
    if (c->n_layers > 0) kv_row_offsets(c, c->h_row_dst, items, n_items);
    memcpy(c->h_hidden, hidden, (size_t)N * H * sizeof(float));
    int b = graph_batch(be, items, n_items);
    if (b && c->graph_warm[b]) {
        rc = run_graph(c, b, items, n_items, N);
    } else {
        rc = enqueue_forward(c, items, n_items, N);
        if (!rc && b) c->graph_warm[b] = 1;
    }
    if (!rc) rc = backend_cuda_sync(c);
    if (rc) return rc;
    memcpy(hidden, c->h_hidden, (size_t)N * H * sizeof(float));
    for (int it = 0; it < n_items; ++it)
        c->kv.len[items[it].slot] += items[it].n_tokens;
    return 0;
}

/* ---------------------------------------------------------------- embed, logits, argmax */

static int cuda_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n) {
    struct cuda_context *c = ctx(be);
    int V = c->cfg->vocab_size, H = c->cfg->hidden_size, rc;
    if (!c->embed.data)
        return strata_set_error(STRATA_EINVAL, "cuda embed: this stage does not own embed_tokens");
    if (n < 0 || (n > 0 && (!hidden || !tokens)))
        return strata_set_error(STRATA_EINVAL, "cuda embed: bad arguments (%d tokens)", n);
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= V)
            return strata_set_error(STRATA_ERANGE,
                                    "cuda embed: token id %d at index %d is outside [0, %d)",
                                    (int)tokens[i], i, V);
    if ((rc = cuda_set_device(c->device))) return rc;
    for (int i0 = 0; i0 < n && !rc; i0 += MAX_GRID_ROWS) {
        int k = n - i0 < MAX_GRID_ROWS ? n - i0 : MAX_GRID_ROWS;
        size_t rows = (size_t)k * (size_t)H * sizeof(float);
        if ((rc = ensure_scratch(c, k))) break;
        if (c->tp > 1) {
            rc = backend_cuda_tp_embed(c, tokens + i0, k);
        } else {
            memcpy(c->h_tokens, tokens + i0, (size_t)k * sizeof(int32_t));
            if (!(rc = cuda_memcpy_async(c->tokens, c->h_tokens, (size_t)k * sizeof(int32_t),
                                         CUDA_COPY_TO_DEVICE, c->stream)))
                rc = cuda_ops_weight_rows(c->hidden, &c->embed, c->tokens, k, c->stream);
        }
        if (rc ||
            (rc = cuda_memcpy_async(c->h_hidden, c->hidden, rows, CUDA_COPY_TO_HOST, c->stream)) ||
            (rc = backend_cuda_sync(c)))
            break;
        memcpy(hidden + (size_t)i0 * H, c->h_hidden, rows);
    }
    return rc;
}

/* Queues the head over hidden [n, H] into c->logits: [n, V] when `whole`, else (under TP)
 * this rank's [n, V/T] vocabulary columns only. */
static int enqueue_head(struct cuda_context *c, const float *hidden, int n, int whole) {
    int H = c->cfg->hidden_size, rc;
    size_t rows = (size_t)n * (size_t)H * sizeof(float);
    memcpy(c->h_hidden, hidden, rows);
    if ((rc = cuda_memcpy_async(c->hidden, c->h_hidden, rows, CUDA_COPY_TO_DEVICE, c->stream)) ||
        (rc = cuda_rmsnorm(c->norm, c->hidden, c->final_norm, c->cfg->rms_norm_eps, n, H,
                           c->stream)))
        return rc;
    if (c->tp > 1 && whole) return backend_cuda_tp_head(c, n);
    return cuda_matmul(c->logits, c->norm, &c->lm_head, n, c->stream);
}

/* The common checks of logits and argmax; 1 when there is nothing to do. */
static int head_call(struct cuda_context *c, const void *out, const float *hidden, int n,
                     const char *what) {
    int rc;
    if (!c->lm_head.data)
        return strata_set_error(STRATA_EINVAL, "cuda %s: this stage does not own the head", what);
    if (n < 0) return strata_set_error(STRATA_EINVAL, "cuda %s: %d rows", what, n);
    if (n == 0) return 1;
    if (!out || !hidden) return strata_set_error(STRATA_EINVAL, "cuda %s: NULL buffer", what);
    if ((rc = cuda_set_device(c->device)) || (rc = ensure_scratch(c, n)) ||
        (rc = ensure_logits(c, n)))
        return rc;
    return 0;
}

static int cuda_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    struct cuda_context *c = ctx(be);
    size_t bytes = (size_t)n * (size_t)c->cfg->vocab_size * sizeof(float);
    int rc = head_call(c, logits, hidden, n, "logits");
    if (rc) return rc < 0 ? rc : 0;
    if ((rc = enqueue_head(c, hidden, n, 1)) ||
        (rc = cuda_memcpy_async(c->h_logits, c->logits, bytes, CUDA_COPY_TO_HOST, c->stream)) ||
        (rc = backend_cuda_sync(c)))
        return rc;
    memcpy(logits, c->h_logits, bytes);
    return 0;
}

/* ids [n] = argmax of each row of the logits, on the device: one int per row comes back
 * instead of V floats. cuda_argmax is the reference's argmax exactly (kernels/argmax.h),
 * so the ids are those of sampler_sample at temperature 0 on this backend's logits. Under
 * TP the rows are never assembled: each rank's shard is reduced to (value, id) pairs that
 * are all-gathered and merged (backend_cuda_tp_argmax), the same ids. */
static int cuda_argmax_ids(struct stage_backend *be, int32_t *ids, const float *hidden, int n) {
    struct cuda_context *c = ctx(be);
    int rc = head_call(c, ids, hidden, n, "argmax");
    if (rc) return rc < 0 ? rc : 0;
    if (c->tp > 1) {
        if ((rc = enqueue_head(c, hidden, n, 0))) return rc;
        return backend_cuda_tp_argmax(c, ids, c->logits, n);
    }
    if ((rc = enqueue_head(c, hidden, n, 1)) ||
        (rc = cuda_argmax_rows(c->ids, c->logits, n, c->cfg->vocab_size, c->stream)) ||
        (rc = cuda_memcpy_async(c->h_tokens, c->ids, (size_t)n * sizeof(int32_t), CUDA_COPY_TO_HOST,
                                c->stream)) ||
        (rc = backend_cuda_sync(c)))
        return rc;
    memcpy(ids, c->h_tokens, (size_t)n * sizeof(int32_t));
    return 0;
}

/* ---------------------------------------------------------------- describe, free, open */

static void cuda_describe(const struct stage_backend *be, struct stage_backend_info *out) {
    const struct cuda_context *c = ctx(be);
    out->kind = "cuda";
    out->device_index = c->device;
    if (cuda_device_describe(c->device, out->device_name, sizeof out->device_name))
        snprintf(out->device_name, sizeof out->device_name, "%s", "?");
    out->graphs = c->use_graphs;
    out->graph_launches = c->graph_launches;
    out->graph_instantiations = c->graph_instantiations;
    out->weight_tensors = c->num_tensors;
    out->weight_bytes = c->weight_bytes;
    out->device_weight_bytes = c->device_weight_bytes;
    out->device_kv_bytes = backend_cuda_kv_bytes(be);
    if (c->grid) {
        out->tp = c->tp;
        out->tp_rank = c->tp_rank;
        out->kvp = c->kvp;
        out->kvp_rank = c->kvp_rank;
        out->nccl = 1;
    }
}

static void cuda_free_backend(struct stage_backend *be) {
    struct cuda_context *c = ctx(be);
    if (!c) return;
    /* Freeing after a failed call keeps that call's message (a failed group's wait would
     * replace it with "failed earlier"). */
    char saved[512];
    snprintf(saved, sizeof saved, "%s", strata_last_error());
    cuda_set_device(c->device);
    if (c->stream && backend_cuda_sync(c)) strata_set_error(STRATA_EDEVICE, "%s", saved);
    backend_cuda_grid_close(c);
    backend_cuda_moe_close(c);
    free_scratch(c);
    cuda_free(c->logits);
    cuda_host_free(c->h_logits);
    backend_cuda_kv_close(c);
    for (int i = 0; i < c->n_owned; ++i)
        cuda_free(c->owned[i]);
    free(c->owned);
    if (c->layers)
        for (int l = 0; l < c->n_layers; ++l) {
            free(c->layers[l].expert_gate);
            free(c->layers[l].expert_up);
            free(c->layers[l].expert_down);
        }
    if (c->graph_exec)
        for (int b = 0; b <= be->num_slots; ++b)
            cuda_graph_exec_destroy(c->graph_exec[b]);
    free(c->graph_exec);
    free(c->graph_warm);
    cuda_stream_destroy(c->stream);
    free(c->layers);
    free(c->inv_freq);
    free(c);
    be->context = NULL;
}

static const struct stage_backend_i cuda_iface = {
    .embed = cuda_embed,
    .forward = cuda_forward,
    .logits = cuda_logits,
    .argmax = cuda_argmax_ids,
    .kv_acquire = backend_cuda_kv_acquire,
    .kv_reserve = backend_cuda_kv_reserve,
    .kv_release = backend_cuda_kv_release,
    .kv_truncate = backend_cuda_kv_truncate,
    .kv_bytes = backend_cuda_kv_bytes,
    .kv_usage = backend_cuda_kv_usage,
    .kv_lookup = backend_cuda_kv_lookup,
    .kv_attach = backend_cuda_kv_attach,
    .kv_register = backend_cuda_kv_register,
    .kv_forget = backend_cuda_kv_forget,
    .kv_pack = backend_cuda_kv_pack,
    .kv_restore = backend_cuda_kv_restore,
    .describe = cuda_describe,
    .free = cuda_free_backend,
};

/* Graphs unless STRATA_CUDA_GRAPHS=0. MoE layers route on the device (backend_cuda_moe.c),
 * so graphs hold them. Under TP / KVP too: a decode step's collectives (the TP reduces,
 * KVP's two all-gathers per tile, whose sizes depend only on the batch) are queued on the
 * backend's stream with no host wait inside the step, and NCCL (>= 2.9) captures them into
 * the graph; the waits are backend_cuda_sync's, after the launch. */
static int graphs_wanted(const struct cuda_context *c) {
    (void)c;
    const char *env = getenv("STRATA_CUDA_GRAPHS");
    return !(env && strcmp(env, "0") == 0);
}

static int open_context(struct cuda_context *c, const struct stage_backend_options *opt) {
    const struct model_config *cfg = opt->cfg;
    int rc, half = cfg->head_dim / 2;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 || cfg->num_kv_heads <= 0 ||
        cfg->num_heads % cfg->num_kv_heads)
        return strata_set_error(STRATA_EINVAL,
                                "cuda backend: unsupported heads (nh %d, nkv %d, head_dim %d)",
                                cfg->num_heads, cfg->num_kv_heads, cfg->head_dim);
    if (cfg->num_experts > 0 &&
        (cfg->num_experts_per_tok < 1 || cfg->num_experts_per_tok > cfg->num_experts ||
         cfg->num_experts_per_tok > MOE_MAX_TOP_K))
        return strata_set_error(STRATA_EINVAL, "cuda backend: top-k %d with %d experts",
                                cfg->num_experts_per_tok, cfg->num_experts);
    if ((rc = cuda_set_device(c->device)) || (rc = cuda_stream_create(&c->stream)) ||
        (rc = backend_cuda_grid_open(c, opt)))
        return rc;
    c->n_layers = opt->role.layer_end - opt->role.layer_start;
    c->layers = calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *c->layers);
    c->inv_freq = malloc((size_t)(half ? half : 1) * sizeof *c->inv_freq);
    c->graph_exec = calloc((size_t)opt->num_slots + 1, sizeof *c->graph_exec);
    c->graph_warm = calloc((size_t)opt->num_slots + 1, 1);
    if (!c->layers || !c->inv_freq || !c->graph_exec || !c->graph_warm)
        return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    rope_inv_freq(c->inv_freq, (float)cfg->rope_theta, cfg->head_dim);
    if ((rc = backend_cuda_load_weights(c, opt->weights, &opt->progress))) return rc;
    c->use_graphs = graphs_wanted(c);
    if ((rc = backend_cuda_moe_open(c))) return rc;
    c->score_floats = cuda_attention_scratch_floats(opt->max_seq - 1, 1, c->nh, cfg->head_dim);
    if (c->score_floats < ATTN_SCRATCH_FLOATS) c->score_floats = ATTN_SCRATCH_FLOATS;
    /* Scratch for a typical decode batch now (grown on demand for larger calls), then the KV
     * pool, so that a budget given as a share of the free memory is of what remains. */
    if ((rc = ensure_scratch(c, opt->num_slots))) return rc;
    return backend_cuda_kv_open(c, opt);
}

static int backend_cuda_open(struct stage_backend **out, const struct stage_backend_options *opt) {
    const char *device = opt->device ? opt->device : "cuda";
    char reason[256];
    *out = NULL;
    if (!cuda_device_available(reason, sizeof reason))
        return strata_set_error(STRATA_EDEVICE, "device '%s' is not available: %s", device, reason);
    struct cli_device dev;
    int rc = cli_parse_device(device, &dev);
    if (rc < 0) return rc;
    int index = dev.index;
    if (cuda_set_device(index)) {
        snprintf(reason, sizeof reason, "%s", strata_last_error());
        return strata_set_error(STRATA_EDEVICE, "device '%s' is not available: %s", device, reason);
    }
    struct stage_backend *be = calloc(1, sizeof *be);
    struct cuda_context *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return strata_set_error(STRATA_ENOMEM, "out of memory for the CUDA backend");
    }
    *be = (struct stage_backend){.iface = &cuda_iface,
                                 .context = c,
                                 .device_kind = "cuda",
                                 .cfg = opt->cfg,
                                 .role = opt->role,
                                 .max_seq = opt->max_seq,
                                 .num_slots = opt->num_slots};
    c->device = index;
    c->cfg = opt->cfg;
    c->role = opt->role;
    rc = open_context(c, opt);
    if (rc < 0) {
        stage_backend_free(be);
        return rc;
    }
    *out = be;
    return 0;
}

/* Registered when this target is linked (alwayslink): see backend.h. */
static const struct stage_backend_kind backend_cuda_kind = {"cuda", 0, backend_cuda_open};

__attribute__((constructor)) static void backend_cuda_register(void) {
    stage_backend_register(&backend_cuda_kind);
}
