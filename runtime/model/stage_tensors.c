/* Tensor lists for one stage (names and shapes of shared spec §2) and the checker that
 * reports every missing or mis-shaped tensor at once. See stage_tensors.h. */
#include "runtime/model/stage_tensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

static enum stage_tensor_kind kind_of(enum stage_tensor_slot slot) {
    switch (slot) {
    case STAGE_SLOT_EMBED: return STAGE_TENSOR_EMBED;
    case STAGE_SLOT_FINAL_NORM: return STAGE_TENSOR_NORM;
    case STAGE_SLOT_LM_HEAD: return STAGE_TENSOR_LM_HEAD;
    case STAGE_SLOT_VISION: return STAGE_TENSOR_VISION;
    default: return STAGE_TENSOR_LAYER;
    }
}

static int add(struct stage_tensor_list *list, enum stage_tensor_slot slot, int layer, int expert,
               int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* Appends one tensor whose name is printf(fmt, ...); any float dtype, plain layout. */
static int add(struct stage_tensor_list *list, enum stage_tensor_slot slot, int layer, int expert,
               int ndim, const int64_t *shape, const char *fmt, ...) {
    if (list->count == list->cap) {
        int cap = list->cap ? list->cap * 2 : 64;
        struct stage_tensor *items = realloc(list->items, (size_t)cap * sizeof *items);
        if (!items) return strata_set_error(STRATA_ENOMEM, "stage tensor list: out of memory");
        list->items = items;
        list->cap = cap;
    }
    struct stage_tensor *t = &list->items[list->count];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof t->name)
        return strata_set_error(STRATA_EINVAL, "tensor name too long: %s...", t->name);
    t->kind = kind_of(slot);
    t->slot = slot;
    t->layer = layer;
    t->expert = expert;
    t->ndim = ndim;
    for (int i = 0; i < ndim; ++i)
        t->shape[i] = shape[i];
    t->dtypes = STAGE_DTYPES_FLOAT;
    t->layout = STAGE_LAYOUT_PLAIN;
    t->vision = STAGE_VIS_NONE;
    t->vision_index = -1;
    list->count++;
    return STRATA_OK;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* ADDX(slot, layer, expert, (dims...), fmt, ...); ADD is ADDX with no expert. */
#define ADDX(slot, layer, expert, shape_list, ...)                                                 \
    do {                                                                                           \
        int add_rc =                                                                               \
            add(list, slot, layer, expert, NDIM shape_list, SHAPE shape_list, __VA_ARGS__);        \
        if (add_rc) return add_rc;                                                                 \
    } while (0)
#define ADD(slot, layer, shape_list, ...) ADDX(slot, layer, -1, shape_list, __VA_ARGS__)

static int has(const struct safetensors *st, const char *name) {
    return st && safetensors_find(st, name) != NULL;
}

/* Per-expert tensors are the one part of the list that grows as a product of config fields
 * (num_experts x MoE layers x 3): a small hostile or mistaken config.json could ask for
 * hundreds of millions of entries (tens of GB, minutes) before any check runs. No real
 * checkpoint comes near this many tensors (Qwen3-235B has about 18k), and a checkpoint with
 * more raises the limit to its own count, since a list that matches it cannot be longer. */
#define LIST_MAX_ENTRIES (1 << 18)

/* Marks the last entry as a fused expert tensor stored in `layout`. */
static void mark_fused(struct stage_tensor_list *list, enum stage_tensor_layout layout,
                       int swap_ok) {
    struct stage_tensor *t = &list->items[list->count - 1];
    t->dtypes = STAGE_DTYPES_FUSED;
    t->layout = layout;
    t->swap_ok = swap_ok;
}

/* Expert layout rule: per-expert tensors when the checkpoint has them; otherwise
 * qwen3_vl_moe is fused input-major (spec §2.2) and qwen3_moe is fused when the checkpoint
 * says so (either orientation) and per-expert by default. */
static int add_moe_layer(struct stage_tensor_list *list, const struct model_config *cfg,
                         const struct safetensors *st, int l) {
    const char *p = cfg->tensor_prefix;
    const int64_t H = cfg->hidden_size, E = cfg->num_experts, I = cfg->moe_intermediate_size;
    ADD(STAGE_SLOT_ROUTER, l, (E, H), "%slayers.%d.mlp.gate.weight", p, l);
    char fused[STAGE_TENSOR_NAME_MAX], expert0[STAGE_TENSOR_NAME_MAX];
    snprintf(fused, sizeof fused, "%slayers.%d.mlp.experts.gate_up_proj", p, l);
    snprintf(expert0, sizeof expert0, "%slayers.%d.mlp.experts.0.gate_proj.weight", p, l);
    int per_expert = has(st, expert0);
    if (!per_expert && cfg->type == MODEL_QWEN3_VL_MOE) {
        /* Input-major grouped-GEMM layout, no ".weight" suffix. */
        ADD(STAGE_SLOT_EXPERTS_GATE_UP, l, (E, H, 2 * I), "%s", fused);
        mark_fused(list, STAGE_LAYOUT_IN_MAJOR, 0);
        ADD(STAGE_SLOT_EXPERTS_DOWN, l, (E, I, H), "%slayers.%d.mlp.experts.down_proj", p, l);
        mark_fused(list, STAGE_LAYOUT_IN_MAJOR, 0);
        return STRATA_OK;
    }
    if (!per_expert && has(st, fused)) {
        ADD(STAGE_SLOT_EXPERTS_GATE_UP, l, (E, 2 * I, H), "%s", fused);
        mark_fused(list, STAGE_LAYOUT_OUT_MAJOR, 1);
        ADD(STAGE_SLOT_EXPERTS_DOWN, l, (E, H, I), "%slayers.%d.mlp.experts.down_proj", p, l);
        mark_fused(list, STAGE_LAYOUT_OUT_MAJOR, 1);
        return STRATA_OK;
    }
    const int64_t limit =
        st && safetensors_count(st) > LIST_MAX_ENTRIES ? safetensors_count(st) : LIST_MAX_ENTRIES;
    if (list->count + 3 * E > limit) {
        if (st)
            return strata_set_error(STRATA_EFORMAT,
                                    "num_experts %d asks for more than %lld tensors (3 per expert "
                                    "in every MoE layer, past it at layer %d) but the checkpoint "
                                    "holds %d: the config does not describe this checkpoint",
                                    cfg->num_experts, (long long)limit, l, safetensors_count(st));
        return strata_set_error(
            STRATA_EFORMAT,
            "num_experts %d asks for more than %lld tensors (3 per expert in "
            "every MoE layer, past it at layer %d): no checkpoint is that large",
            cfg->num_experts, (long long)limit, l);
    }
    for (int e = 0; e < cfg->num_experts; ++e) {
        ADDX(STAGE_SLOT_EXPERT_GATE, l, e, (I, H), "%slayers.%d.mlp.experts.%d.gate_proj.weight", p,
             l, e);
        ADDX(STAGE_SLOT_EXPERT_UP, l, e, (I, H), "%slayers.%d.mlp.experts.%d.up_proj.weight", p, l,
             e);
        ADDX(STAGE_SLOT_EXPERT_DOWN, l, e, (H, I), "%slayers.%d.mlp.experts.%d.down_proj.weight", p,
             l, e);
    }
    return STRATA_OK;
}

static int add_layer(struct stage_tensor_list *list, const struct model_config *cfg,
                     const struct safetensors *st, int l) {
    const char *p = cfg->tensor_prefix;
    const int64_t H = cfg->hidden_size, D = cfg->head_dim;
    const int64_t Q = (int64_t)cfg->num_heads * D, KV = (int64_t)cfg->num_kv_heads * D;
    const int64_t F = cfg->intermediate_size;
    ADD(STAGE_SLOT_INPUT_NORM, l, (H), "%slayers.%d.input_layernorm.weight", p, l);
    ADD(STAGE_SLOT_Q, l, (Q, H), "%slayers.%d.self_attn.q_proj.weight", p, l);
    ADD(STAGE_SLOT_K, l, (KV, H), "%slayers.%d.self_attn.k_proj.weight", p, l);
    ADD(STAGE_SLOT_V, l, (KV, H), "%slayers.%d.self_attn.v_proj.weight", p, l);
    ADD(STAGE_SLOT_O, l, (H, Q), "%slayers.%d.self_attn.o_proj.weight", p, l);
    if (cfg->attention_bias) {
        ADD(STAGE_SLOT_Q_BIAS, l, (Q), "%slayers.%d.self_attn.q_proj.bias", p, l);
        ADD(STAGE_SLOT_K_BIAS, l, (KV), "%slayers.%d.self_attn.k_proj.bias", p, l);
        ADD(STAGE_SLOT_V_BIAS, l, (KV), "%slayers.%d.self_attn.v_proj.bias", p, l);
        ADD(STAGE_SLOT_O_BIAS, l, (H), "%slayers.%d.self_attn.o_proj.bias", p, l);
    }
    ADD(STAGE_SLOT_Q_NORM, l, (D), "%slayers.%d.self_attn.q_norm.weight", p, l);
    ADD(STAGE_SLOT_K_NORM, l, (D), "%slayers.%d.self_attn.k_norm.weight", p, l);
    ADD(STAGE_SLOT_POST_NORM, l, (H), "%slayers.%d.post_attention_layernorm.weight", p, l);
    if (model_config_layer_is_moe(cfg, l)) return add_moe_layer(list, cfg, st, l);
    ADD(STAGE_SLOT_GATE, l, (F, H), "%slayers.%d.mlp.gate_proj.weight", p, l);
    ADD(STAGE_SLOT_UP, l, (F, H), "%slayers.%d.mlp.up_proj.weight", p, l);
    ADD(STAGE_SLOT_DOWN, l, (H, F), "%slayers.%d.mlp.down_proj.weight", p, l);
    return STRATA_OK;
}

/* Tags the last entry as vision part `part` with index `index` (enum stage_vision_part). */
static void mark_vision(struct stage_tensor_list *list, enum stage_vision_part part, int index) {
    list->items[list->count - 1].vision = part;
    list->items[list->count - 1].vision_index = index;
}

/* ADDV(part, index, (dims...), fmt, ...): one vision tower tensor. */
#define ADDV(part, index, shape_list, ...)                                                         \
    do {                                                                                           \
        ADD(STAGE_SLOT_VISION, -1, shape_list, __VA_ARGS__);                                       \
        mark_vision(list, part, index);                                                            \
    } while (0)

/* One merger (main: j == -1, norm over Hv; DeepStack j: norm over Hm), two linears. */
static int add_merger(struct stage_tensor_list *list, const struct model_config *cfg, int j) {
    const struct vision_config *v = &cfg->vision;
    const int64_t m = v->spatial_merge_size;
    const int64_t Hm = v->hidden_size * m * m, O = v->out_hidden_size;
    const int64_t norm_dim = j < 0 ? v->hidden_size : Hm;
    char base[64];
    if (j < 0)
        snprintf(base, sizeof base, "model.visual.merger");
    else
        snprintf(base, sizeof base, "model.visual.deepstack_merger_list.%d", j);
    ADDV(STAGE_VIS_MERGER_NORM_W, j, (norm_dim), "%s.norm.weight", base);
    ADDV(STAGE_VIS_MERGER_NORM_B, j, (norm_dim), "%s.norm.bias", base);
    ADDV(STAGE_VIS_MERGER_FC1_W, j, (Hm, Hm), "%s.linear_fc1.weight", base);
    ADDV(STAGE_VIS_MERGER_FC1_B, j, (Hm), "%s.linear_fc1.bias", base);
    ADDV(STAGE_VIS_MERGER_FC2_W, j, (O, Hm), "%s.linear_fc2.weight", base);
    ADDV(STAGE_VIS_MERGER_FC2_B, j, (O), "%s.linear_fc2.bias", base);
    return STRATA_OK;
}

/* Vision tower names and shapes, spec §2.3. */
static int add_vision(struct stage_tensor_list *list, const struct model_config *cfg) {
    const struct vision_config *v = &cfg->vision;
    const int64_t Hv = v->hidden_size, Iv = v->intermediate_size, C = v->in_channels;
    const int64_t Tp = v->temporal_patch_size, P = v->patch_size;
    const char *p = "model.visual.";
    ADDV(STAGE_VIS_PATCH_W, -1, (Hv, C, Tp, P, P), "%spatch_embed.proj.weight", p);
    ADDV(STAGE_VIS_PATCH_B, -1, (Hv), "%spatch_embed.proj.bias", p);
    ADDV(STAGE_VIS_POS_EMBED, -1, (v->num_position_embeddings, Hv), "%spos_embed.weight", p);
    for (int i = 0; i < v->depth; ++i) {
        ADDV(STAGE_VIS_NORM1_W, i, (Hv), "%sblocks.%d.norm1.weight", p, i);
        ADDV(STAGE_VIS_NORM1_B, i, (Hv), "%sblocks.%d.norm1.bias", p, i);
        ADDV(STAGE_VIS_NORM2_W, i, (Hv), "%sblocks.%d.norm2.weight", p, i);
        ADDV(STAGE_VIS_NORM2_B, i, (Hv), "%sblocks.%d.norm2.bias", p, i);
        ADDV(STAGE_VIS_QKV_W, i, (3 * Hv, Hv), "%sblocks.%d.attn.qkv.weight", p, i);
        ADDV(STAGE_VIS_QKV_B, i, (3 * Hv), "%sblocks.%d.attn.qkv.bias", p, i);
        ADDV(STAGE_VIS_PROJ_W, i, (Hv, Hv), "%sblocks.%d.attn.proj.weight", p, i);
        ADDV(STAGE_VIS_PROJ_B, i, (Hv), "%sblocks.%d.attn.proj.bias", p, i);
        ADDV(STAGE_VIS_FC1_W, i, (Iv, Hv), "%sblocks.%d.mlp.linear_fc1.weight", p, i);
        ADDV(STAGE_VIS_FC1_B, i, (Iv), "%sblocks.%d.mlp.linear_fc1.bias", p, i);
        ADDV(STAGE_VIS_FC2_W, i, (Hv, Iv), "%sblocks.%d.mlp.linear_fc2.weight", p, i);
        ADDV(STAGE_VIS_FC2_B, i, (Hv), "%sblocks.%d.mlp.linear_fc2.bias", p, i);
    }
    int rc = add_merger(list, cfg, -1);
    for (int j = 0; !rc && j < v->num_deepstack; ++j)
        rc = add_merger(list, cfg, j);
    return rc;
}

int stage_tensor_list_build(struct stage_tensor_list *list, const struct model_config *cfg,
                            const struct stage_role *role, const struct safetensors *st) {
    if (!list || !cfg || !role)
        return strata_set_error(STRATA_EINVAL, "stage_tensor_list_build: null argument");
    memset(list, 0, sizeof *list);
    if (role->layer_start < 0 || role->layer_end < role->layer_start ||
        role->layer_end > cfg->num_layers)
        return strata_set_error(STRATA_ERANGE, "layer range [%d, %d) is not inside [0, %d)",
                                role->layer_start, role->layer_end, cfg->num_layers);
    const char *p = cfg->tensor_prefix;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    char embed[STAGE_TENSOR_NAME_MAX];
    snprintf(embed, sizeof embed, "%sembed_tokens.weight", p);
    /* Tying rule (spec §1.3): tied flag, or no lm_head.weight in the checkpoint. */
    list->head_is_embed = cfg->tie_word_embeddings || (st && !has(st, "lm_head.weight"));
    int rc = STRATA_OK;
    if (role->with_vision && cfg->has_vision && (rc = add_vision(list, cfg))) goto fail;
    if (role->with_embed && (rc = add(list, STAGE_SLOT_EMBED, -1, -1, 2, SHAPE(V, H), "%s", embed)))
        goto fail;
    for (int l = role->layer_start; l < role->layer_end; ++l)
        if ((rc = add_layer(list, cfg, st, l))) goto fail;
    if (role->with_head) {
        if ((rc = add(list, STAGE_SLOT_FINAL_NORM, -1, -1, 1, SHAPE(H), "%snorm.weight", p)))
            goto fail;
        if (list->head_is_embed) {
            if (!role->with_embed &&
                (rc = add(list, STAGE_SLOT_EMBED, -1, -1, 2, SHAPE(V, H), "%s", embed)))
                goto fail;
        } else if ((rc = add(list, STAGE_SLOT_LM_HEAD, -1, -1, 2, SHAPE(V, H), "lm_head.weight"))) {
            goto fail;
        }
    }
    return STRATA_OK;
fail:
    stage_tensor_list_free(list);
    return rc;
}

void stage_tensor_list_free(struct stage_tensor_list *list) {
    if (!list) return;
    free(list->items);
    memset(list, 0, sizeof *list);
}

int stage_tensor_list_find(const struct stage_tensor_list *list, const char *name) {
    for (int i = 0; list && i < list->count; ++i)
        if (strcmp(list->items[i].name, name) == 0) return i;
    return -1;
}

static int dims_equal(const struct stage_tensor *want, const struct st_tensor *got, int swap) {
    if (got->ndim != want->ndim) return 0;
    for (int i = 0; i < want->ndim; ++i) {
        int j = swap && (i == 1 || i == 2) ? 3 - i : i;
        if (got->shape[i] != want->shape[j]) return 0;
    }
    return 1;
}

static int shape_matches(const struct stage_tensor *want, const struct st_tensor *got) {
    return dims_equal(want, got, 0) ||
           (want->swap_ok && want->ndim == 3 && dims_equal(want, got, 1));
}

enum stage_tensor_layout stage_tensor_stored_layout(const struct stage_tensor *want,
                                                    const struct st_tensor *got) {
    if (want->layout == STAGE_LAYOUT_PLAIN || dims_equal(want, got, 0)) return want->layout;
    return want->layout == STAGE_LAYOUT_OUT_MAJOR ? STAGE_LAYOUT_IN_MAJOR : STAGE_LAYOUT_OUT_MAJOR;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; ++i)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static void format_dtypes(char *buf, size_t cap, unsigned dtypes) {
    const enum st_dtype order[] = {ST_BF16, ST_F16, ST_F32, ST_I64, ST_I32, ST_U8};
    int total = 0, seen = 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i)
        total += (dtypes >> order[i]) & 1u;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i) {
        if (!((dtypes >> order[i]) & 1u)) continue;
        size_t used = strlen(buf);
        const char *sep = !seen ? "" : seen == total - 1 ? " or " : ", ";
        snprintf(buf + used, cap - used, "%s%s", sep, st_dtype_name(order[i]));
        ++seen;
    }
}

enum problem { PROBLEM_NONE = 0, PROBLEM_MISSING, PROBLEM_SHAPE, PROBLEM_DTYPE };

/* Classifies one entry against the checkpoint; `text` gets "NAME" (missing) or
 * "NAME is <got>, expected <want>" (wrong shape or dtype). */
static enum problem diagnose(const struct stage_tensor *want, const struct safetensors *st,
                             char *text, size_t cap) {
    const struct st_tensor *got = safetensors_find(st, want->name);
    char ws[96], gs[192];
    if (!got) {
        snprintf(text, cap, "%s", want->name);
        return PROBLEM_MISSING;
    }
    if (!shape_matches(want, got)) {
        format_shape(ws, sizeof ws, want->ndim, want->shape);
        format_shape(gs, sizeof gs, got->ndim, got->shape);
        if (snprintf(text, cap, "%s is %s, expected %s", want->name, gs, ws) < 0) text[0] = '\0';
        return PROBLEM_SHAPE;
    }
    if (!((want->dtypes >> got->dtype) & 1u)) {
        format_dtypes(ws, sizeof ws, want->dtypes);
        snprintf(text, cap, "%s is %s, expected %s", want->name, st_dtype_name(got->dtype), ws);
        return PROBLEM_DTYPE;
    }
    return PROBLEM_NONE;
}

/* Appends `text` to the report unless it would pass the budget; counts what was dropped. */
static void report_append(char *report, size_t cap, int *dropped, const char *text) {
    size_t used = strlen(report);
    if (*dropped || used + strlen(text) + 2 >= cap) {
        ++*dropped;
        return;
    }
    snprintf(report + used, cap - used, "%s%s", used ? ", " : "", text);
}

int stage_tensor_list_check(const struct stage_tensor_list *list, const struct safetensors *st,
                            const char *source) {
    if (!list || !st) return strata_set_error(STRATA_EINVAL, "stage_tensor_list_check: null");
    char missing[440] = "", bad[440] = "", text[STAGE_TENSOR_NAME_MAX + 300];
    int n_missing = 0, n_bad = 0, drop_missing = 0, drop_bad = 0;
    for (int i = 0; i < list->count; ++i) {
        enum problem p = diagnose(&list->items[i], st, text, sizeof text);
        if (p == PROBLEM_MISSING) {
            ++n_missing;
            report_append(missing, sizeof missing, &drop_missing, text);
        } else if (p != PROBLEM_NONE) {
            ++n_bad;
            report_append(bad, sizeof bad, &drop_bad, text);
        }
    }
    if (!n_missing && !n_bad) return STRATA_OK;
    char more_missing[32] = "", more_bad[32] = "";
    if (drop_missing) snprintf(more_missing, sizeof more_missing, " ... and %d more", drop_missing);
    if (drop_bad) snprintf(more_bad, sizeof more_bad, " ... and %d more", drop_bad);
    const char *src = source ? source : "checkpoint";
    if (n_missing && n_bad)
        return strata_set_error(
            STRATA_ENOTFOUND,
            "%s: %d tensor(s) missing: %s%s; %d with the wrong shape or dtype: %s%s", src,
            n_missing, missing, more_missing, n_bad, bad, more_bad);
    if (n_missing)
        return strata_set_error(STRATA_ENOTFOUND, "%s: %d tensor(s) missing: %s%s", src, n_missing,
                                missing, more_missing);
    return strata_set_error(STRATA_EFORMAT, "%s: %d tensor(s) with the wrong shape or dtype: %s%s",
                            src, n_bad, bad, more_bad);
}

int stage_tensor_list_report(FILE *out, const struct stage_tensor_list *list,
                             const struct safetensors *st) {
    static const char *const prefix[] = {"", "missing", "wrong shape", "wrong dtype"};
    char text[STAGE_TENSOR_NAME_MAX + 300];
    int lines = 0;
    for (int i = 0; list && st && i < list->count; ++i) {
        enum problem p = diagnose(&list->items[i], st, text, sizeof text);
        if (p == PROBLEM_NONE) continue;
        fprintf(out, "%s %s\n", prefix[p], text);
        ++lines;
    }
    return lines;
}

uint64_t stage_tensor_list_bytes(const struct stage_tensor_list *list,
                                 const struct safetensors *st) {
    uint64_t total = 0;
    for (int i = 0; list && i < list->count; ++i) {
        const struct st_tensor *t = safetensors_find(st, list->items[i].name);
        if (t) total += t->nbytes;
    }
    return total;
}

uint64_t stage_tensor_list_bytes_estimate(const struct stage_tensor_list *list,
                                          size_t dtype_bytes) {
    uint64_t total = 0;
    for (int i = 0; list && i < list->count; ++i) {
        uint64_t numel = 1;
        for (int d = 0; d < list->items[i].ndim; ++d)
            numel *= (uint64_t)list->items[i].shape[d];
        total += numel * dtype_bytes;
    }
    return total;
}
