/* The decoder layer written once; see forward.h. */
#include "reference/forward.h"

#include "runtime/base/status.h"

int forward_layer(const struct forward_ops *o, void *x, const struct forward_dims *d,
                  const struct forward_buffers *b, const struct layer_weights *L,
                  const struct forward_item *items, int n_items, int N) {
    const int H = d->hidden, D = d->head_dim, nh = d->heads, nkv = d->kv_heads;
    const int qd = nh * D, kvd = nkv * D;
    int rc;

    /* Attention block: a = RMSNorm_in(h); q/k/v; per-head q/k norm; RoPE; cache; attend;
     * h = h + o_proj(a) (TP: the ranks' o_proj partials added first). */
    float *const qkv_out[3] = {b->q, b->k, b->v};
    const struct ops_weight *const qkv_w[3] = {&L->q, &L->k, &L->v};
    if ((rc = o->rmsnorm(x, b->norm, b->hidden, L->input_norm, d->eps, N, H)) ||
        (rc = o->matmul_multi(x, qkv_out, qkv_w, 3, b->norm, N)) ||
        (rc = o->add_bias(x, b->q, L->q_bias, N, qd)) ||
        (rc = o->add_bias(x, b->k, L->k_bias, N, kvd)) ||
        (rc = o->add_bias(x, b->v, L->v_bias, N, kvd)) ||
        (rc = o->rmsnorm(x, b->q, b->q, L->q_norm, d->eps, N * nh, D)) ||
        (rc = o->rmsnorm(x, b->k, b->k, L->k_norm, d->eps, N * nkv, D)) ||
        (rc = o->rope_rows(x, b->q, b->rope_cos, b->rope_sin, N, qd, nh, D)) ||
        (rc = o->rope_rows(x, b->k, b->rope_cos, b->rope_sin, N, kvd, nkv, D)) ||
        (rc = o->attend(x, L, items, n_items, N)) ||
        (rc = o->matmul_split(x, b->proj, b->attn, &L->o, N)) ||
        (rc = o->tp_reduce(x, b->proj, (size_t)N * (size_t)H)) ||
        (rc = o->add_bias(x, b->proj, L->o_bias, N, H)) ||
        (rc = o->vec_add(x, b->hidden, b->proj, N * H)))
        return rc;

    /* MLP block: h = h + MLP_or_MoE(RMSNorm_post(h)). Dense: down(silu(gate) * up); TP:
     * the ranks' down partials (or, MoE by experts, their nodes of the expert tree) added. */
    int reduced = 0;
    if ((rc = o->rmsnorm(x, b->norm, b->hidden, L->post_norm, d->eps, N, H))) return rc;
    if (L->is_moe) {
        rc = o->moe(x, L, b->proj, b->norm, N, &reduced);
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
