/* The decoder layer written once; see forward.h. */
#include "reference/forward.h"

#include "runtime/base/status.h"

/* Attention of every item's rows (buffers q -> attn) over its slot, after appending the
 * rows' keys and values. Under KVP (Medha) each rank scores the keys it holds, the group
 * all-gathers the per-(row, head) maxima and takes their max (exact), each rank sums its
 * exponentials against that max over its aligned blocks (one subtree of attention's block
 * tree), and the partials are all-gathered and merged by the tree's top: two all-gathers
 * per layer and row tile, and the bits of one rank's attention. A row's result does not
 * depend on the tiling. */
static int forward_attend(const struct forward_ops *o, void *x, const struct forward_dims *d,
                          const struct forward_buffers *b, const struct layer_weights *L,
                          const struct forward_item *items, int n_items, int N) {
    const int nh = d->heads, D = d->head_dim;
    const size_t qd = (size_t)nh * (size_t)D, part_row = (size_t)nh * (size_t)(D + 2);
    int rc = o->kv_store(x, L, items, n_items, N);
    if (d->kvp <= 1) {
        for (int it = 0, row = 0; it < n_items && !rc; row += items[it].n_tokens, ++it)
            rc =
                o->attention(x, L, &items[it], b->attn + (size_t)row * qd, b->q + (size_t)row * qd);
        return rc;
    }
    for (int r0 = 0; r0 < N && !rc; r0 += d->kvp_tile) {
        const int r1 = N - r0 < d->kvp_tile ? N : r0 + d->kvp_tile;
        const size_t rows = (size_t)(r1 - r0), rows_nh = rows * (size_t)nh;
        for (int step = 1; step <= 2 && !rc; ++step) {
            /* Each item's rows inside the tile; a row's offset t in the tile indexes max,
             * part and scores. */
            for (int it = 0, row = 0; it < n_items && !rc; row += items[it].n_tokens, ++it) {
                const int a = row > r0 ? row : r0;
                const int e = row + items[it].n_tokens < r1 ? row + items[it].n_tokens : r1;
                if (a >= e) continue;
                const size_t t = (size_t)(a - r0);
                float *scores = b->kvp_scores + t * (size_t)nh * (size_t)d->kvp_held;
                if (step == 1)
                    rc = o->attention_partial_max(x, L, &items[it], a - row, e - a,
                                                  b->kvp_max + t * (size_t)nh, scores,
                                                  b->q + (size_t)a * qd);
                else
                    rc = o->attention_partial(x, L, &items[it], a - row, e - a,
                                              b->kvp_mine + t * part_row, scores,
                                              b->kvp_max + t * (size_t)nh);
            }
            if (rc) break;
            if (step == 1 && !(rc = o->kvp_allgather(x, b->kvp_max_all, b->kvp_max, rows_nh)))
                rc = o->attention_group_max(x, b->kvp_max, b->kvp_max_all, rows_nh);
        }
        if (!rc && !(rc = o->kvp_allgather(x, b->kvp_parts, b->kvp_mine, rows * part_row)))
            rc = o->attention_merge(x, b->attn + (size_t)r0 * qd, b->kvp_parts, r1 - r0);
    }
    return rc;
}

/* MoE block (spec §4) of x [N, H] into out [N, H]: route each row to its top-k experts,
 * group the (row, choice) slots by held expert, run each expert's SwiGLU MLP on its rows,
 * and add each row's weighted outputs by the expert tree. Under TP --moe expert a rank's
 * sum is one node of that tree, which the layer's TP reduce completes; under --moe split
 * each expert's down partials are added before the weights multiply them (weighting first
 * would round differently), so out is complete here. A row's result never depends on the
 * others, so the rows run in chunks of the backend's moe_chunk. */
static int forward_moe(const struct forward_ops *o, void *x, const struct forward_dims *d,
                       const struct forward_buffers *b, const struct layer_weights *L, float *out,
                       const float *in, int N) {
    const int H = d->hidden, K = d->top_k, chunk = d->moe_chunk > 0 ? d->moe_chunk : N;
    int rc = 0;
    for (int i0 = 0; i0 < N && !rc; i0 += chunk) {
        const int n = N - i0 < chunk ? N - i0 : chunk, cap = n * K;
        const float *xi = in + (size_t)i0 * (size_t)H;
        float *const router_out[1] = {b->router};
        const struct ops_weight *const router_w[1] = {&L->router};
        if ((rc = o->matmul_multi(x, router_out, router_w, 1, xi, n)) ||
            (rc = o->moe_route(x, b->moe_expert, b->moe_w, b->router, n)) ||
            (rc = o->moe_group(x, b->moe_offsets, b->moe_row, b->moe_slot, b->moe_expert, n)) ||
            (rc = o->gather_rows(x, b->moe_x, xi, b->moe_row, cap, H)) ||
            (rc = o->matmul_grouped(x, b->ffn_gate, b->moe_x, L, FORWARD_EXPERT_GATE,
                                    b->moe_offsets, cap)) ||
            (rc = o->matmul_grouped(x, b->ffn_up, b->moe_x, L, FORWARD_EXPERT_UP, b->moe_offsets,
                                    cap)) ||
            (rc = o->swiglu(x, b->ffn_gate, b->ffn_gate, b->ffn_up, cap * d->moe_ffn)) ||
            (rc = o->matmul_grouped(x, b->moe_x, b->ffn_gate, L, FORWARD_EXPERT_DOWN,
                                    b->moe_offsets, cap)) ||
            (d->moe_split && (rc = o->tp_reduce(x, b->moe_x, (size_t)cap * (size_t)H))))
            return rc;
        rc = o->moe_expert_sum(x, out + (size_t)i0 * (size_t)H, b->moe_x, b->moe_slot,
                               b->moe_expert, b->moe_w, n);
    }
    return rc;
}

int forward_layer(const struct forward_ops *o, void *x, const struct forward_dims *d,
                  const struct forward_buffers *b, const struct layer_weights *L,
                  const struct forward_item *items, int n_items, int N) {
    const int H = d->hidden, D = d->head_dim, nh = d->heads, nkv = d->kv_heads;
    const int qd = nh * D, kvd = nkv * D;
    int rc;

    /* Attention block: a = RMSNorm_in(h); q/k/v; per-head q/k norm; RoPE; cache; attend;
     * h = h + o_proj(a) (TP: the ranks' o_proj partials added first), and with that add the
     * MLP block's m = RMSNorm_post(h). */
    float *const qkv_out[3] = {b->q, b->k, b->v};
    const struct ops_weight *const qkv_w[3] = {&L->q, &L->k, &L->v};
    if ((rc = o->rmsnorm(x, b->norm, b->hidden, L->input_norm, d->eps, N, H)) ||
        (rc = o->matmul_multi(x, qkv_out, qkv_w, 3, b->norm, N)) ||
        (rc = o->add_bias(x, b->q, L->q_bias, N, qd)) ||
        (rc = o->add_bias(x, b->k, L->k_bias, N, kvd)) ||
        (rc = o->add_bias(x, b->v, L->v_bias, N, kvd)) ||
        (rc = o->qk_norm_rope(x, b->q, b->k, L->q_norm, L->k_norm, d->eps, b->rope_cos, b->rope_sin,
                              N, nh, nkv, D)) ||
        (rc = forward_attend(o, x, d, b, L, items, n_items, N)) ||
        (rc = o->matmul_split(x, b->proj, b->attn, &L->o, N)) ||
        (rc = o->tp_reduce(x, b->proj, (size_t)N * (size_t)H)) ||
        (rc = o->add_bias(x, b->proj, L->o_bias, N, H)) ||
        (rc = o->add_rmsnorm(x, b->norm, b->hidden, b->proj, L->post_norm, d->eps, N, H)))
        return rc;

    /* MLP block: h = h + MLP_or_MoE(m). Dense: down(silu(gate) * up); TP: the ranks' down
     * partials (or, MoE by experts, their nodes of the expert tree) added. */
    const int reduced = L->is_moe && d->moe_split;
    if (L->is_moe) {
        rc = forward_moe(o, x, d, b, L, b->proj, b->norm, N);
    } else {
        float *const gu_out[2] = {b->ffn_gate, b->ffn_up};
        const struct ops_weight *const gu_w[2] = {&L->gate, &L->up};
        if (!(rc = o->matmul_multi(x, gu_out, gu_w, 2, b->norm, N)) &&
            !(rc = o->swiglu(x, b->ffn_gate, b->ffn_gate, b->ffn_up, N * d->ffn)))
            rc = o->matmul_split(x, b->proj, b->ffn_gate, &L->down, N);
    }
    if (!rc && !reduced) rc = o->tp_reduce(x, b->proj, (size_t)N * (size_t)H);
    if (!rc) rc = o->vec_add(x, b->hidden, b->proj, N * H);

    /* DeepStack (spec §5.4): after layer k's output, feature k on the visual rows. */
    if (!rc) rc = o->deepstack(x, L, items, n_items);
    return rc;
}
