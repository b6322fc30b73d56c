/* The CUDA backend: the reference decoder's forward pass (reference/model.c) with the
 * kernels/ twins, weights and KV cache on one device, behind the stage backend table
 * (backend.h). Plain C: only the kernels' C headers and kernels/cuda_device.h.
 *
 * What lives where:
 *   - weights: uploaded once at open by walking the role's manifest
 *     (runtime/model/stage_tensors.h) as reference/model_load.c does: bf16 / f32 matrices
 *     as stored, f16 matrices widened to f32, norms and biases as f32, fused experts used
 *     in place (out-major) or transposed once on the host (in-major);
 *   - KV cache: [slot][layer][kv_head][max_seq][head_dim] f32 on the device, the layout of
 *     reference/kv_cache.h, so a pack / restore is one strided copy per (layer, slot);
 *     lengths and in-use flags stay on the host;
 *   - activation scratch: device buffers sized like the reference's, grown on demand to
 *     the largest call seen;
 *   - per call: hidden rows host -> device, the layers, device -> host. RoPE tables are
 *     built on the host by the reference's rope_cos_sin (bitwise the CPU's) and uploaded;
 *     MoE routing downloads the router logits, routes with the reference's moe_route and
 *     uploads each expert's token list (the host needs the ids to group tokens anyway).
 *
 * Determinism: every kernel computes each output element in one fixed order that depends
 * on neither the batch nor the neighbouring rows (kernels/README.md), all launches go to
 * the default stream in the reference's order, and the MoE sum runs expert by expert in
 * ascending order; so splits, batching and KV handovers give identical bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/ops_weight_row.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_apply.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/backend_cuda_internal.h"

/* ---------------------------------------------------------------- scratch */

static void free_scratch(struct cuda_context *c) {
    float **dev[] = {&c->hidden, &c->norm,     &c->proj,   &c->q,        &c->k,        &c->v,
                     &c->attn,   &c->ffn_gate, &c->ffn_up, &c->rope_cos, &c->rope_sin, &c->router,
                     &c->moe_x,  &c->moe_y,    &c->moe_w,  &c->scores,   &c->deepstack};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) {
        cuda_free(*dev[i]);
        *dev[i] = NULL;
    }
    cuda_free(c->moe_row);
    cuda_free(c->tokens);
    c->moe_row = c->tokens = NULL;
    float **host[] = {&c->h_cos, &c->h_sin, &c->h_router, &c->h_route_w, &c->h_moe_w};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) {
        free(*host[i]);
        *host[i] = NULL;
    }
    free(c->h_route_e);
    free(c->h_moe_row);
    free(c->h_expert_count);
    c->h_route_e = NULL;
    c->h_moe_row = NULL;
    c->h_expert_count = NULL;
    c->cap_rows = 0;
}

/* Device and host scratch for `rows` rows (grown, never shrunk). */
static int ensure_scratch(struct cuda_context *c, int rows) {
    if (rows <= c->cap_rows) return 0;
    free_scratch(c);
    const struct model_config *m = c->cfg;
    size_t r = (size_t)rows, H = (size_t)m->hidden_size, D = (size_t)m->head_dim;
    size_t qd = (size_t)m->num_heads * D, kvd = (size_t)m->num_kv_heads * D;
    size_t ffn = (size_t)m->intermediate_size;
    if ((size_t)m->moe_intermediate_size > ffn) ffn = (size_t)m->moe_intermediate_size;
    size_t E = m->num_experts > 0 ? (size_t)m->num_experts : 1;
    size_t K = m->num_experts_per_tok > 0 ? (size_t)m->num_experts_per_tok : 1;
    struct {
        void **p;
        size_t bytes;
    } want[] = {
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
        {(void **)&c->moe_x, r * H * 4},
        {(void **)&c->moe_y, r * H * 4},
        {(void **)&c->moe_w, r * K * 4},
        {(void **)&c->moe_row, r * K * 4},
        {(void **)&c->tokens, r * 4},
        {(void **)&c->deepstack, r * H * 4},
        {(void **)&c->scores, c->score_floats * 4},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && !rc; ++i)
        rc = cuda_malloc(want[i].p, want[i].bytes);
    c->h_cos = malloc(r * D / 2 * sizeof(float) + 4);
    c->h_sin = malloc(r * D / 2 * sizeof(float) + 4);
    c->h_router = malloc(r * E * sizeof(float));
    c->h_route_w = malloc(r * K * sizeof(float));
    c->h_moe_w = malloc(r * K * sizeof(float));
    c->h_route_e = malloc(r * K * sizeof(int));
    c->h_moe_row = malloc(r * K * sizeof(int32_t));
    c->h_expert_count = malloc(E * sizeof(int));
    if (!rc && (!c->h_cos || !c->h_sin || !c->h_router || !c->h_route_w || !c->h_moe_w ||
                !c->h_route_e || !c->h_moe_row || !c->h_expert_count))
        rc = strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    if (rc) {
        free_scratch(c);
        return rc;
    }
    c->cap_rows = rows;
    return 0;
}

/* ---------------------------------------------------------------- forward */

/* x [n, dim] += bias [dim] row by row (the reference's add_bias). */
static int add_bias(float *x, const float *bias, int n, int dim) {
    int rc = 0;
    for (int i = 0; bias && i < n && !rc; ++i)
        rc = cuda_vec_add(x + (size_t)i * (size_t)dim, bias, dim, NULL);
    return rc;
}

/* out [N, H] = the MoE block of x [N, H] (reference/model.c moe_block): the router on the
 * device, the routing on the host with the reference's moe_route, then expert after expert
 * in ascending order: gather its tokens, SwiGLU MLP, weighted add into out. */
static int moe_block(struct cuda_context *c, const struct layer_weights *L, float *out,
                     const float *x, int N) {
    const struct model_config *m = c->cfg;
    int H = m->hidden_size, E = m->num_experts, K = m->num_experts_per_tok;
    int I = m->moe_intermediate_size, rc;
    if ((rc = cuda_matmul(c->router, x, &L->router, N, NULL))) return rc;
    if ((rc = cuda_memcpy_to_host(c->h_router, c->router, (size_t)N * E * sizeof(float))))
        return rc;
    for (int i = 0; i < N; ++i)
        moe_route(c->h_route_e + (size_t)i * K, c->h_route_w + (size_t)i * K,
                  c->h_router + (size_t)i * E, m->norm_topk_prob, E, K);
    /* Token lists of all experts, concatenated in expert order, uploaded once. */
    int total = 0;
    for (int e = 0; e < E; ++e) {
        c->h_expert_count[e] = 0;
        for (int i = 0; i < N; ++i)
            for (int t = 0; t < K; ++t)
                if (c->h_route_e[(size_t)i * K + t] == e) {
                    c->h_moe_row[total] = i;
                    c->h_moe_w[total] = c->h_route_w[(size_t)i * K + t];
                    total++;
                    c->h_expert_count[e]++;
                }
    }
    if ((rc = cuda_memcpy_to_device(c->moe_row, c->h_moe_row, (size_t)total * sizeof(int32_t))) ||
        (rc = cuda_memcpy_to_device(c->moe_w, c->h_moe_w, (size_t)total * sizeof(float))) ||
        (rc = cuda_memset(out, 0, (size_t)N * H * sizeof(float))))
        return rc;
    const struct ops_weight xs = {x, OPS_F32, N, H};
    for (int e = 0, first = 0; e < E && !rc; first += c->h_expert_count[e], ++e) {
        int count = c->h_expert_count[e];
        if (!count) continue;
        if (count > MAX_GRID_ROWS)
            return strata_set_error(STRATA_EINVAL, "cuda backend: %d tokens for one expert", count);
        if ((rc = cuda_ops_weight_rows(c->moe_x, &xs, c->moe_row + first, count, NULL)) ||
            (rc = cuda_matmul(c->ffn_gate, c->moe_x, &L->expert_gate[e], count, NULL)) ||
            (rc = cuda_matmul(c->ffn_up, c->moe_x, &L->expert_up[e], count, NULL)) ||
            (rc = cuda_swiglu(c->ffn_gate, c->ffn_gate, c->ffn_up, count * I, NULL)) ||
            (rc = cuda_matmul(c->moe_y, c->ffn_gate, &L->expert_down[e], count, NULL)))
            return rc;
        rc = cuda_moe_combine(out, c->moe_y, c->moe_row + first, c->moe_w + first, count, H, NULL);
    }
    return rc;
}

/* [max_seq][head_dim] keys of one slot, absolute layer and kv head (kv_cache_k's layout). */
static float *k_slot(const struct cuda_context *c, int slot, int layer, int kv_head) {
    return c->k_cache + (size_t)slot * c->slot_floats +
           ((size_t)(layer - c->role.layer_start) * (size_t)c->cfg->num_kv_heads +
            (size_t)kv_head) *
               c->head_floats;
}

static float *v_slot(const struct cuda_context *c, int slot, int layer, int kv_head) {
    return c->v_cache + (k_slot(c, slot, layer, kv_head) - c->k_cache);
}

/* One decoder layer over c->hidden [N, H] in place (reference/model.c layer_forward). */
static int layer_forward(struct cuda_context *c, const struct layer_weights *L, int max_seq,
                         const struct forward_item *items, int n_items, int N) {
    const struct model_config *m = c->cfg;
    int H = m->hidden_size, D = m->head_dim, nh = m->num_heads, nkv = m->num_kv_heads, rc;
    float eps = m->rms_norm_eps;
    size_t qd = (size_t)nh * (size_t)D, kvd = (size_t)nkv * (size_t)D;

    if ((rc = cuda_rmsnorm(c->norm, c->hidden, L->input_norm, eps, N, H, NULL)) ||
        (rc = cuda_matmul(c->q, c->norm, &L->q, N, NULL)) ||
        (rc = cuda_matmul(c->k, c->norm, &L->k, N, NULL)) ||
        (rc = cuda_matmul(c->v, c->norm, &L->v, N, NULL)) ||
        (rc = add_bias(c->q, L->q_bias, N, (int)qd)) ||
        (rc = add_bias(c->k, L->k_bias, N, (int)kvd)) ||
        (rc = add_bias(c->v, L->v_bias, N, (int)kvd)) ||
        (rc = cuda_rmsnorm(c->q, c->q, L->q_norm, eps, N * nh, D, NULL)) ||
        (rc = cuda_rmsnorm(c->k, c->k, L->k_norm, eps, N * nkv, D, NULL)) ||
        (rc = cuda_rope_apply_rows(c->q, c->rope_cos, c->rope_sin, N, (int)qd, nh, D, NULL)) ||
        (rc = cuda_rope_apply_rows(c->k, c->rope_cos, c->rope_sin, N, (int)kvd, nkv, D, NULL)))
        return rc;
    int row = 0;
    for (int it = 0; it < n_items; ++it) {
        const struct forward_item *item = &items[it];
        for (int g = 0; g < nkv && !rc; ++g) {
            /* n_tokens rows of D floats: from k [row.., g*D] into the cache at pos.. */
            size_t src = (size_t)row * kvd + (size_t)g * (size_t)D;
            size_t dst = (size_t)item->pos * (size_t)D;
            rc =
                cuda_memcpy_2d(k_slot(c, item->slot, L->index, g) + dst, (size_t)D * 4, c->k + src,
                               kvd * 4, (size_t)D * 4, (size_t)item->n_tokens, CUDA_COPY_ON_DEVICE);
            if (!rc)
                rc = cuda_memcpy_2d(v_slot(c, item->slot, L->index, g) + dst, (size_t)D * 4,
                                    c->v + src, kvd * 4, (size_t)D * 4, (size_t)item->n_tokens,
                                    CUDA_COPY_ON_DEVICE);
        }
        /* Queries in chunks so the score rows fit the scratch; query i of a chunk starting
         * at i0 sits at pos + i0 + i, exactly as in one call. */
        int ctx_len = item->pos + item->n_tokens;
        int chunk = (int)(c->score_floats / ((size_t)nh * (size_t)ctx_len)); /* >= 1 */
        for (int i0 = 0; i0 < item->n_tokens && !rc; i0 += chunk) {
            int n = item->n_tokens - i0 < chunk ? item->n_tokens - i0 : chunk;
            size_t off = (size_t)(row + i0) * qd;
            rc = cuda_attention(c->attn + off, c->q + off, k_slot(c, item->slot, L->index, 0),
                                v_slot(c, item->slot, L->index, 0), (size_t)max_seq * (size_t)D,
                                c->scores, item->pos + i0, n, nh, nkv, D, NULL);
        }
        if (rc) return rc;
        row += item->n_tokens;
    }
    if ((rc = cuda_matmul(c->proj, c->attn, &L->o, N, NULL)) ||
        (rc = add_bias(c->proj, L->o_bias, N, H)) ||
        (rc = cuda_vec_add(c->hidden, c->proj, N * H, NULL)) ||
        (rc = cuda_rmsnorm(c->norm, c->hidden, L->post_norm, eps, N, H, NULL)))
        return rc;
    if (L->is_moe) {
        rc = moe_block(c, L, c->proj, c->norm, N);
    } else {
        int F = m->intermediate_size;
        if (!(rc = cuda_matmul(c->ffn_gate, c->norm, &L->gate, N, NULL)) &&
            !(rc = cuda_matmul(c->ffn_up, c->norm, &L->up, N, NULL)) &&
            !(rc = cuda_swiglu(c->ffn_gate, c->ffn_gate, c->ffn_up, N * F, NULL)))
            rc = cuda_matmul(c->proj, c->ffn_gate, &L->down, N, NULL);
    }
    if (!rc) rc = cuda_vec_add(c->hidden, c->proj, N * H, NULL);

    /* DeepStack (spec §5.4): after layer k, add feature k on visual rows; each run of
     * consecutive visual rows is one add over their contiguous rows. */
    row = 0;
    for (int it = 0; it < n_items && !rc; ++it) {
        const struct forward_item *item = &items[it];
        if (item->deepstack && L->index < item->num_deepstack) {
            const float *feat =
                item->deepstack + (size_t)L->index * (size_t)item->n_tokens * (size_t)H;
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
                                  c->deepstack + (size_t)i * (size_t)H, (j - i) * H, NULL);
                i = j;
            }
        }
        row += item->n_tokens;
    }
    return rc;
}

/* reference/model.c check_items, against the host bookkeeping of the device cache. */
static int check_items(const struct stage_backend *be, const struct forward_item *items,
                       int n_items, int *rows) {
    const struct cuda_context *c = ctx(be);
    int context;
    return forward_items_check("cuda forward", items, n_items, c->len, c->in_use, be->num_slots,
                               be->max_seq, c->cfg->num_layers, rows, &context);
}

static int cuda_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                        int n_items) {
    struct cuda_context *c = ctx(be);
    const struct model_config *m = c->cfg;
    int N = 0, rc, half = m->head_dim / 2, H = m->hidden_size;
    if ((rc = check_items(be, items, n_items, &N))) return rc;
    if (N == 0) return 0;
    if (!hidden) return strata_set_error(STRATA_EINVAL, "cuda forward: hidden is NULL");
    if ((rc = cuda_set_device(c->device)) || (rc = ensure_scratch(c, N))) return rc;
    /* RoPE tables on the host by the reference op (bitwise the CPU backend's). */
    rope_tables(c->h_cos, c->h_sin, c->inv_freq, items, n_items,
                m->has_mrope ? m->mrope_section : NULL, half);
    size_t table = (size_t)N * (size_t)half * sizeof(float);
    if ((rc = cuda_memcpy_to_device(c->rope_cos, c->h_cos, table)) ||
        (rc = cuda_memcpy_to_device(c->rope_sin, c->h_sin, table)) ||
        (rc = cuda_memcpy_to_device(c->hidden, hidden, (size_t)N * H * sizeof(float))))
        return rc;
    for (int l = 0; l < c->n_layers && !rc; ++l)
        rc = layer_forward(c, &c->layers[l], be->max_seq, items, n_items, N);
    if (!rc) rc = cuda_memcpy_to_host(hidden, c->hidden, (size_t)N * H * sizeof(float));
    if (rc) return rc;
    for (int it = 0; it < n_items; ++it)
        c->len[items[it].slot] += items[it].n_tokens;
    return 0;
}

/* ---------------------------------------------------------------- embed, logits */

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
        if ((rc = ensure_scratch(c, k)) ||
            (rc = cuda_memcpy_to_device(c->tokens, tokens + i0, (size_t)k * sizeof(int32_t))) ||
            (rc = cuda_ops_weight_rows(c->hidden, &c->embed, c->tokens, k, NULL)))
            break;
        rc = cuda_memcpy_to_host(hidden + (size_t)i0 * H, c->hidden, (size_t)k * H * sizeof(float));
    }
    return rc;
}

static int cuda_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    struct cuda_context *c = ctx(be);
    int V = c->cfg->vocab_size, H = c->cfg->hidden_size, rc;
    if (!c->lm_head.data)
        return strata_set_error(STRATA_EINVAL, "cuda logits: this stage does not own the head");
    if (n < 0) return strata_set_error(STRATA_EINVAL, "cuda logits: %d rows", n);
    if (n == 0) return 0;
    if (!logits || !hidden) return strata_set_error(STRATA_EINVAL, "cuda logits: NULL buffer");
    if ((rc = cuda_set_device(c->device)) || (rc = ensure_scratch(c, n))) return rc;
    if (n > c->cap_logit_rows) {
        cuda_free(c->logits);
        c->logits = NULL;
        c->cap_logit_rows = 0;
        if ((rc = cuda_malloc((void **)&c->logits, (size_t)n * V * sizeof(float)))) return rc;
        c->cap_logit_rows = n;
    }
    if ((rc = cuda_memcpy_to_device(c->hidden, hidden, (size_t)n * H * sizeof(float))) ||
        (rc = cuda_rmsnorm(c->norm, c->hidden, c->final_norm, c->cfg->rms_norm_eps, n, H, NULL)) ||
        (rc = cuda_matmul(c->logits, c->norm, &c->lm_head, n, NULL)))
        return rc;
    return cuda_memcpy_to_host(logits, c->logits, (size_t)n * V * sizeof(float));
}

/* ---------------------------------------------------------------- KV */

static int cuda_kv_acquire(struct stage_backend *be, int *slot) {
    struct cuda_context *c = ctx(be);
    for (int s = 0; s < be->num_slots; ++s)
        if (!c->in_use[s]) {
            c->in_use[s] = 1;
            c->len[s] = 0;
            *slot = s;
            return 0;
        }
    return strata_set_error(STRATA_EBUSY, "cuda kv: all %d slots are in use", be->num_slots);
}

static void cuda_kv_release(struct stage_backend *be, int slot) {
    struct cuda_context *c = ctx(be);
    if (slot < 0 || slot >= be->num_slots) return;
    c->in_use[slot] = 0;
    c->len[slot] = 0;
}

static size_t cuda_kv_bytes(const struct stage_backend *be) {
    return 2 * ctx(be)->slot_floats * (size_t)be->num_slots * sizeof(float);
}

static int check_slots(const struct stage_backend *be, const int *slots, int n, const char *what) {
    if (n <= 0 || !slots) return strata_set_error(STRATA_EINVAL, "%s: no slots given", what);
    for (int b = 0; b < n; ++b)
        if (slots[b] < 0 || slots[b] >= be->num_slots || !ctx(be)->in_use[slots[b]])
            return strata_set_error(STRATA_EINVAL, "%s: slot %d is not an in-use slot of the cache",
                                    what, slots[b]);
    return 0;
}

/* The handoff layout (decoder_io.h): [layer][batch][head][seq][D]; the device cache keeps
 * [slot][layer][head][max_seq][D], so one (layer, batch row) is a strided copy of kv_heads
 * rows of len*D floats. */
static int cuda_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n) {
    struct cuda_context *c = ctx(be);
    int seq = 0, nkv = c->cfg->num_kv_heads, D = c->cfg->head_dim, rc;
    memset(out, 0, sizeof *out);
    if ((rc = check_slots(be, slots, n, "cuda kv pack")) || (rc = cuda_set_device(c->device)))
        return rc;
    for (int b = 0; b < n; ++b)
        if (c->len[slots[b]] > seq) seq = c->len[slots[b]];
    *out = (struct kv_handoff){.layer_start = c->role.layer_start,
                               .layer_end = c->role.layer_end,
                               .batch = n,
                               .kv_heads = nkv,
                               .seq = seq,
                               .head_dim = D};
    size_t numel = kv_handoff_numel(out);
    float *k = calloc(2 * numel * sizeof(float) + (size_t)n * sizeof(int32_t), 1);
    if (!k)
        return strata_set_error(STRATA_ENOMEM, "cuda kv pack: cannot allocate %zu floats",
                                2 * numel);
    float *v = k + numel;
    int32_t *lengths = (int32_t *)(v + numel);
    size_t row = (size_t)seq * D, cache_row = (size_t)be->max_seq * D;
    for (int l = 0; l < c->n_layers && !rc; ++l)
        for (int b = 0; b < n && !rc; ++b) {
            size_t dst = ((size_t)l * n + b) * nkv * row;
            size_t width = (size_t)c->len[slots[b]] * D * sizeof(float);
            int layer = c->role.layer_start + l;
            rc = cuda_memcpy_2d(k + dst, row * 4, k_slot(c, slots[b], layer, 0), cache_row * 4,
                                width, (size_t)nkv, CUDA_COPY_TO_HOST);
            if (!rc)
                rc = cuda_memcpy_2d(v + dst, row * 4, v_slot(c, slots[b], layer, 0), cache_row * 4,
                                    width, (size_t)nkv, CUDA_COPY_TO_HOST);
        }
    if (rc) {
        free(k);
        memset(out, 0, sizeof *out);
        return rc;
    }
    for (int b = 0; b < n; ++b)
        lengths[b] = c->len[slots[b]];
    out->k = k;
    out->v = v;
    out->lengths = lengths;
    out->owned = k;
    return 0;
}

static int cuda_kv_restore(struct stage_backend *be, const int *slots, int n,
                           const struct kv_handoff *in) {
    struct cuda_context *c = ctx(be);
    int nkv = c->cfg->num_kv_heads, D = c->cfg->head_dim, rc;
    if (in->layer_start != c->role.layer_start || in->layer_end != c->role.layer_end)
        return strata_set_error(
            STRATA_ERANGE, "kv restore: block holds layers [%d, %d) but the cache holds [%d, %d)",
            in->layer_start, in->layer_end, c->role.layer_start, c->role.layer_end);
    if (in->kv_heads != nkv || in->head_dim != D || in->seq < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: block shape [%d, %d, %d, %d, %d] does not fit a cache "
                                "of %d layers, %d kv heads, head_dim %d",
                                in->layer_end - in->layer_start, in->batch, in->kv_heads, in->seq,
                                in->head_dim, c->n_layers, nkv, D);
    if (in->batch != n)
        return strata_set_error(
            STRATA_EINVAL, "kv restore: block has %d batch rows, %d slots given", in->batch, n);
    for (int b = 0; b < n; ++b)
        if (in->lengths[b] < 0 || in->lengths[b] > in->seq || in->lengths[b] > be->max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)in->lengths[b], be->max_seq);
    if ((rc = check_slots(be, slots, n, "kv restore")) || (rc = cuda_set_device(c->device)))
        return rc;
    const uint8_t *k = in->k, *v = in->v;
    size_t row = (size_t)in->seq * D, cache_row = (size_t)be->max_seq * D;
    for (int l = 0; l < c->n_layers && !rc; ++l)
        for (int b = 0; b < n && !rc; ++b) {
            size_t src = ((size_t)l * n + b) * nkv * row * sizeof(float);
            size_t width = (size_t)in->lengths[b] * D * sizeof(float);
            int layer = c->role.layer_start + l;
            rc = cuda_memcpy_2d(k_slot(c, slots[b], layer, 0), cache_row * 4, k + src, row * 4,
                                width, (size_t)nkv, CUDA_COPY_TO_DEVICE);
            if (!rc)
                rc = cuda_memcpy_2d(v_slot(c, slots[b], layer, 0), cache_row * 4, v + src, row * 4,
                                    width, (size_t)nkv, CUDA_COPY_TO_DEVICE);
        }
    if (rc) return rc;
    for (int b = 0; b < n; ++b)
        c->len[slots[b]] = in->lengths[b];
    return 0;
}

/* ---------------------------------------------------------------- describe, free, open */

static void cuda_describe(const struct stage_backend *be, char *buf, size_t cap) {
    const struct cuda_context *c = ctx(be);
    char mem[200];
    if (cuda_device_describe(c->device, mem, sizeof mem)) snprintf(mem, sizeof mem, "%s", "?");
    snprintf(buf, cap,
             "device: cuda:%d, %s\nweights: %d tensors, %zu bytes (%zu bytes on the device), "
             "KV %zu bytes on the device",
             c->device, mem, c->num_tensors, c->weight_bytes, c->device_weight_bytes,
             cuda_kv_bytes(be));
}

static void cuda_free_backend(struct stage_backend *be) {
    struct cuda_context *c = ctx(be);
    if (!c) return;
    cuda_set_device(c->device);
    free_scratch(c);
    cuda_free(c->logits);
    cuda_free(c->k_cache);
    cuda_free(c->v_cache);
    for (int i = 0; i < c->n_owned; ++i)
        cuda_free(c->owned[i]);
    free(c->owned);
    if (c->layers)
        for (int l = 0; l < c->n_layers; ++l) {
            free(c->layers[l].expert_gate);
            free(c->layers[l].expert_up);
            free(c->layers[l].expert_down);
        }
    free(c->layers);
    free(c->inv_freq);
    free(c->len);
    free(c->in_use);
    free(c);
    be->context = NULL;
}

static const struct stage_backend_i cuda_iface = {
    .embed = cuda_embed,
    .forward = cuda_forward,
    .logits = cuda_logits,
    .kv_acquire = cuda_kv_acquire,
    .kv_release = cuda_kv_release,
    .kv_bytes = cuda_kv_bytes,
    .kv_pack = cuda_kv_pack,
    .kv_restore = cuda_kv_restore,
    .describe = cuda_describe,
    .free = cuda_free_backend,
};

/* The device index of "cuda" (0) or "cuda:N". */
static int device_index(const char *device) {
    return device[4] == ':' ? atoi(device + 5) : 0;
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
        (cfg->num_experts_per_tok < 1 || cfg->num_experts_per_tok > cfg->num_experts))
        return strata_set_error(STRATA_EINVAL, "cuda backend: top-k %d with %d experts",
                                cfg->num_experts_per_tok, cfg->num_experts);
    if ((rc = cuda_set_device(c->device))) return rc;
    c->n_layers = opt->role.layer_end - opt->role.layer_start;
    c->layers = calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *c->layers);
    c->inv_freq = malloc((size_t)(half ? half : 1) * sizeof *c->inv_freq);
    c->len = calloc((size_t)opt->num_slots, sizeof *c->len);
    c->in_use = calloc((size_t)opt->num_slots, 1);
    if (!c->layers || !c->inv_freq || !c->len || !c->in_use)
        return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    rope_inv_freq(c->inv_freq, (float)cfg->rope_theta, cfg->head_dim);
    if ((rc = backend_cuda_load_weights(c, opt->weights))) return rc;
    c->head_floats = (size_t)opt->max_seq * (size_t)cfg->head_dim;
    c->slot_floats = (size_t)c->n_layers * (size_t)cfg->num_kv_heads * c->head_floats;
    c->score_floats = (size_t)cfg->num_heads * (size_t)opt->max_seq;
    if (c->score_floats < ATTN_SCRATCH_FLOATS) c->score_floats = ATTN_SCRATCH_FLOATS;
    size_t bytes = c->slot_floats * (size_t)opt->num_slots * sizeof(float);
    /* Zeroed like the reference's calloc'd cache (never read past a slot's length). */
    if ((rc = cuda_malloc((void **)&c->k_cache, bytes)) ||
        (rc = cuda_malloc((void **)&c->v_cache, bytes)) ||
        (rc = cuda_memset(c->k_cache, 0, bytes)) || (rc = cuda_memset(c->v_cache, 0, bytes)))
        return rc;
    /* Scratch for a typical decode batch now; grown on demand for larger calls. */
    return ensure_scratch(c, opt->num_slots);
}

int backend_cuda_open(struct stage_backend **out, const struct stage_backend_options *opt) {
    const char *device = opt->device ? opt->device : "cuda";
    char reason[256];
    *out = NULL;
    if (!cuda_device_available(reason, sizeof reason))
        return strata_set_error(STRATA_EDEVICE, "device '%s' is not available: %s", device, reason);
    int index = device_index(device);
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
    int rc = open_context(c, opt);
    if (rc < 0) {
        stage_backend_free(be);
        return rc;
    }
    *out = be;
    return 0;
}
