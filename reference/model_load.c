/* Loading a reference_model's owned tensors from a safetensors checkpoint.
 *
 * Matrices stay as stored when they are bf16 or f32 (pointers into the mmapped file); f16
 * matrices and every norm / bias vector are widened to f32 copies once, and qwen3_vl_moe's
 * input-major fused experts ([E, H, 2I] / [E, I, H]) are transposed once into per-expert
 * row-major copies. Those copies are counted in reference_model_extra_bytes().
 *
 * Every tensor the owned layer range needs is looked up before failing, so one error
 * message lists all missing or mis-shaped tensors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/model_internal.h"
#include "runtime/base/status.h"

struct loader {
    const struct safetensors *st;
    struct reference_model *m;
    char problems[2048];
    size_t len;
    int n_missing, n_bad, n_problems;
    int nomem;
};

static void problem(struct loader *ld, int missing, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void problem(struct loader *ld, int missing, const char *fmt, ...) {
    if (missing)
        ld->n_missing++;
    else
        ld->n_bad++;
    if (ld->n_problems++ >= 12) return; /* the count still reports the rest */
    if (ld->len + 4 >= sizeof ld->problems) return;
    if (ld->len)
        ld->len += (size_t)snprintf(ld->problems + ld->len, sizeof ld->problems - ld->len, "; ");
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(ld->problems + ld->len, sizeof ld->problems - ld->len, fmt, ap);
    va_end(ap);
    if (w > 0) ld->len += (size_t)w;
    if (ld->len >= sizeof ld->problems) ld->len = sizeof ld->problems - 1;
}

/* Remembers a heap copy so reference_model_free releases it. */
static void *own(struct loader *ld, size_t bytes) {
    struct reference_model *m = ld->m;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) {
            ld->nomem = 1;
            return NULL;
        }
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        ld->nomem = 1;
        return NULL;
    }
    m->owned[m->n_owned++] = p;
    m->extra_bytes += bytes;
    return p;
}

/* Finds `name` with the given shape (dims < 0 are not checked); NULL and a recorded problem
 * otherwise. Counts the tensor's stored bytes once. */
static const struct st_tensor *want(struct loader *ld, const char *name, int ndim,
                                    const int64_t *dims) {
    const struct st_tensor *t = safetensors_find(ld->st, name);
    if (!t) {
        problem(ld, 1, "missing %s", name);
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; ++i)
        ok = t->shape[i] == dims[i];
    if (!ok) {
        char got[96] = "", exp[96] = "";
        size_t g = 0, e = 0;
        for (int i = 0; i < t->ndim && g < sizeof got; ++i)
            g += (size_t)snprintf(got + g, sizeof got - g, "%s%lld", i ? "," : "",
                                  (long long)t->shape[i]);
        for (int i = 0; i < ndim && e < sizeof exp; ++i)
            e += (size_t)snprintf(exp + e, sizeof exp - e, "%s%lld", i ? "," : "",
                                  (long long)dims[i]);
        problem(ld, 0, "%s has shape [%s], want [%s]", name, got, exp);
        return NULL;
    }
    if (t->dtype != ST_BF16 && t->dtype != ST_F32 && t->dtype != ST_F16) {
        problem(ld, 0, "%s has dtype %s, want BF16, F16 or F32", name, st_dtype_name(t->dtype));
        return NULL;
    }
    ld->m->weight_bytes += t->nbytes;
    ld->m->num_tensors++;
    return t;
}

static void load_matrix(struct loader *ld, struct ops_weight *w, const char *name, int rows,
                        int cols) {
    int64_t dims[2] = {rows, cols};
    memset(w, 0, sizeof *w);
    const struct st_tensor *t = want(ld, name, 2, dims);
    if (!t) return;
    w->rows = rows;
    w->cols = cols;
    if (t->dtype == ST_BF16 || t->dtype == ST_F32) {
        w->data = t->data;
        w->dtype = t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
        return;
    }
    float *copy = own(ld, (size_t)t->numel * sizeof(float));
    if (!copy) return;
    st_tensor_to_f32(copy, t);
    w->data = copy;
    w->dtype = OPS_F32;
}

static const float *load_vector(struct loader *ld, const char *name, int n) {
    int64_t dims[1] = {n};
    const struct st_tensor *t = want(ld, name, 1, dims);
    if (!t) return NULL;
    float *copy = own(ld, (size_t)n * sizeof(float));
    if (!copy) return NULL;
    st_tensor_to_f32(copy, t);
    return copy;
}

static const char *fmt_name(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static const char *fmt_name(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}

/* qwen3_vl_moe fused input-major experts: gate_up [E, H, 2I], down [E, I, H] -> per-expert
 * row-major copies in the stored element type. */
static void load_fused_input_major(struct loader *ld, struct ref_layer *L, const char *prefix) {
    const struct model_config *c = &ld->m->cfg;
    int E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    char name[256];
    int64_t gu_dims[3] = {E, H, 2 * I}, down_dims[3] = {E, I, H};
    const struct st_tensor *gu =
        want(ld, fmt_name(name, sizeof name, "%sexperts.gate_up_proj", prefix), 3, gu_dims);
    const struct st_tensor *dn =
        want(ld, fmt_name(name, sizeof name, "%sexperts.down_proj", prefix), 3, down_dims);
    if (!gu || !dn) return;
    if (gu->dtype == ST_F16 || dn->dtype == ST_F16) {
        problem(ld, 0, "%sexperts: F16 fused experts are not supported (BF16 or F32)", prefix);
        return;
    }
    for (int e = 0; e < E; ++e) {
        struct ops_weight *mats[3] = {&L->expert_gate[e], &L->expert_up[e], &L->expert_down[e]};
        const struct st_tensor *src[3] = {gu, gu, dn};
        int rows[3] = {I, I, H}, cols[3] = {H, H, I};
        for (int which = 0; which < 3; ++which) {
            const struct st_tensor *t = src[which];
            size_t esz = t->dtype == ST_BF16 ? 2 : 4;
            char *dst = own(ld, (size_t)rows[which] * (size_t)cols[which] * esz);
            if (!dst) return;
            /* Source element (e, c, r) of an input-major [E, cols, width] block is row r,
             * column c of the row-major matrix; gate is the first I of the 2I width. */
            size_t width = which == 2 ? (size_t)H : (size_t)(2 * I);
            size_t offset = which == 1 ? (size_t)I : 0;
            const char *base =
                (const char *)t->data + (size_t)e * (size_t)cols[which] * width * esz;
            for (int r = 0; r < rows[which]; ++r)
                for (int col = 0; col < cols[which]; ++col)
                    memcpy(dst + ((size_t)r * (size_t)cols[which] + (size_t)col) * esz,
                           base + ((size_t)col * width + offset + (size_t)r) * esz, esz);
            mats[which]->data = dst;
            mats[which]->dtype = t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
            mats[which]->rows = rows[which];
            mats[which]->cols = cols[which];
        }
    }
}

/* v5 runtime layout for qwen3_moe: gate_up [E, 2I, H] (gate rows first), down [E, H, I]. */
static void load_fused_linear(struct loader *ld, struct ref_layer *L, const char *prefix) {
    const struct model_config *c = &ld->m->cfg;
    int E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    char name[256];
    int64_t gu_dims[3] = {E, 2 * I, H}, down_dims[3] = {E, H, I};
    const struct st_tensor *gu =
        want(ld, fmt_name(name, sizeof name, "%sexperts.gate_up_proj", prefix), 3, gu_dims);
    const struct st_tensor *dn =
        want(ld, fmt_name(name, sizeof name, "%sexperts.down_proj", prefix), 3, down_dims);
    if (!gu || !dn) return;
    if (gu->dtype == ST_F16 || dn->dtype == ST_F16) {
        problem(ld, 0, "%sexperts: F16 fused experts are not supported (BF16 or F32)", prefix);
        return;
    }
    for (int e = 0; e < E; ++e) {
        size_t gesz = gu->dtype == ST_BF16 ? 2 : 4, desz = dn->dtype == ST_BF16 ? 2 : 4;
        const char *g = (const char *)gu->data + (size_t)e * 2 * (size_t)I * (size_t)H * gesz;
        const char *d = (const char *)dn->data + (size_t)e * (size_t)H * (size_t)I * desz;
        enum ops_dtype gdt = gu->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
        enum ops_dtype ddt = dn->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
        L->expert_gate[e] = (struct ops_weight){g, gdt, I, H};
        L->expert_up[e] = (struct ops_weight){g + (size_t)I * (size_t)H * gesz, gdt, I, H};
        L->expert_down[e] = (struct ops_weight){d, ddt, H, I};
    }
}

static void load_layer(struct loader *ld, struct ref_layer *L, int layer) {
    struct reference_model *m = ld->m;
    const struct model_config *c = &m->cfg;
    int H = c->hidden_size, D = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    char p[200], name[256];
    snprintf(p, sizeof p, "%slayers.%d.", c->tensor_prefix, layer);
    L->index = layer;
    L->input_norm = load_vector(ld, fmt_name(name, sizeof name, "%sinput_layernorm.weight", p), H);
    L->post_norm =
        load_vector(ld, fmt_name(name, sizeof name, "%spost_attention_layernorm.weight", p), H);
    L->q_norm = load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.q_norm.weight", p), D);
    L->k_norm = load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.k_norm.weight", p), D);
    load_matrix(ld, &L->q, fmt_name(name, sizeof name, "%sself_attn.q_proj.weight", p), nh * D, H);
    load_matrix(ld, &L->k, fmt_name(name, sizeof name, "%sself_attn.k_proj.weight", p), nkv * D, H);
    load_matrix(ld, &L->v, fmt_name(name, sizeof name, "%sself_attn.v_proj.weight", p), nkv * D, H);
    load_matrix(ld, &L->o, fmt_name(name, sizeof name, "%sself_attn.o_proj.weight", p), H, nh * D);
    if (c->attention_bias) {
        L->q_bias =
            load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.q_proj.bias", p), nh * D);
        L->k_bias =
            load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.k_proj.bias", p), nkv * D);
        L->v_bias =
            load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.v_proj.bias", p), nkv * D);
        L->o_bias = load_vector(ld, fmt_name(name, sizeof name, "%sself_attn.o_proj.bias", p), H);
    }
    L->is_moe = model_config_layer_is_moe(c, layer);
    if (!L->is_moe) {
        int F = c->intermediate_size;
        load_matrix(ld, &L->gate, fmt_name(name, sizeof name, "%smlp.gate_proj.weight", p), F, H);
        load_matrix(ld, &L->up, fmt_name(name, sizeof name, "%smlp.up_proj.weight", p), F, H);
        load_matrix(ld, &L->down, fmt_name(name, sizeof name, "%smlp.down_proj.weight", p), H, F);
        return;
    }
    int E = c->num_experts, I = c->moe_intermediate_size;
    load_matrix(ld, &L->router, fmt_name(name, sizeof name, "%smlp.gate.weight", p), E, H);
    L->expert_gate = calloc((size_t)E, sizeof *L->expert_gate);
    L->expert_up = calloc((size_t)E, sizeof *L->expert_up);
    L->expert_down = calloc((size_t)E, sizeof *L->expert_down);
    if (!L->expert_gate || !L->expert_up || !L->expert_down) {
        ld->nomem = 1;
        return;
    }
    char mlp[220];
    snprintf(mlp, sizeof mlp, "%smlp.", p);
    int per_expert =
        safetensors_find(ld->st,
                         fmt_name(name, sizeof name, "%sexperts.0.gate_proj.weight", mlp)) != NULL;
    if (!per_expert && (c->type == MODEL_QWEN3_VL_MOE)) {
        load_fused_input_major(ld, L, mlp);
        return;
    }
    if (!per_expert &&
        safetensors_find(ld->st, fmt_name(name, sizeof name, "%sexperts.gate_up_proj", mlp))) {
        load_fused_linear(ld, L, mlp);
        return;
    }
    for (int e = 0; e < E; ++e) {
        load_matrix(ld, &L->expert_gate[e],
                    fmt_name(name, sizeof name, "%sexperts.%d.gate_proj.weight", mlp, e), I, H);
        load_matrix(ld, &L->expert_up[e],
                    fmt_name(name, sizeof name, "%sexperts.%d.up_proj.weight", mlp, e), I, H);
        load_matrix(ld, &L->expert_down[e],
                    fmt_name(name, sizeof name, "%sexperts.%d.down_proj.weight", mlp, e), H, I);
    }
}

int ref_load_weights(struct reference_model *m, const struct safetensors *st) {
    struct loader ld = {.st = st, .m = m};
    const struct model_config *c = &m->cfg;
    int H = c->hidden_size, V = c->vocab_size;
    char name[256];
    fmt_name(name, sizeof name, "%sembed_tokens.weight", c->tensor_prefix);
    if (m->opt.with_embed) load_matrix(&ld, &m->embed, name, V, H);
    for (int l = 0; l < m->n_layers; ++l)
        load_layer(&ld, &m->layers[l], m->opt.layer_start + l);
    if (m->opt.with_head) {
        m->final_norm =
            load_vector(&ld, fmt_name(name, sizeof name, "%snorm.weight", c->tensor_prefix), H);
        /* Tying rule (spec §1.3): the flag, or a checkpoint without lm_head.weight. */
        int tied = c->tie_word_embeddings || !safetensors_find(st, "lm_head.weight");
        m->head_is_embed = tied;
        if (tied && m->opt.with_embed) {
            m->lm_head = m->embed;
        } else {
            const char *head = "lm_head.weight";
            if (tied) head = fmt_name(name, sizeof name, "%sembed_tokens.weight", c->tensor_prefix);
            load_matrix(&ld, &m->lm_head, head, V, H);
        }
    }
    if (ld.nomem)
        return strata_set_error(STRATA_ENOMEM, "reference_model: out of memory while loading");
    if (ld.n_problems)
        return strata_set_error(ld.n_missing ? STRATA_ENOTFOUND : STRATA_EFORMAT,
                                "reference_model: %d missing and %d mis-shaped tensors for "
                                "layers [%d,%d)%s%s: %s%s",
                                ld.n_missing, ld.n_bad, m->opt.layer_start, m->opt.layer_end,
                                m->opt.with_embed ? " +embed" : "",
                                m->opt.with_head ? " +head" : "", ld.problems,
                                ld.n_problems > 12 ? "; ..." : "");
    return STRATA_OK;
}
