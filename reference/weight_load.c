/* The one weight loader; see weight_load.h. */
#include "reference/weight_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

struct walk {
    struct weight_target *t;
    const struct weight_sink *s;
    int copied; /* the current entry made a copy */
};

static void *copy_mem(struct walk *w, size_t bytes, int extra) {
    void *p = w->s->alloc(w->s->ctx, bytes ? bytes : 1, extra);
    if (p) w->copied = 1;
    return p;
}

static int nomem(const struct walk *w) {
    return strata_set_error(STRATA_ENOMEM, "%s: out of host memory", w->t->who);
}

static void release(const struct walk *w, void *copy) {
    if (copy) w->s->release(w->s->ctx, copy);
}

/* *part = the part of `t` this rank holds (`sl`: one part, dim 0 or 1; NULL or not a split:
 * all of it). Rows are a view of the mapping; columns a copy (*copy) read row by row from
 * it, so only the slice's bytes are touched. */
static int sliced(struct walk *w, struct st_tensor *part, void **copy, const struct st_tensor *t,
                  const struct tp_slice *sl) {
    *part = *t;
    *copy = NULL;
    if (!sl || sl->kind != TP_SLICE_SPLIT || (sl->start == 0 && sl->count == sl->extent))
        return STRATA_OK;
    if (sl->parts != 1 || sl->dim > 1 || (sl->dim == 1 && t->ndim != 2))
        return strata_set_error(STRATA_EINVAL, "%s: cannot slice %s under TP", w->t->who, t->name);
    const size_t esz = st_dtype_size(t->dtype), rows = (size_t)t->shape[0];
    const size_t per_row = rows ? (size_t)t->numel / rows : 0, n = (size_t)sl->count;
    if (sl->dim == 0) {
        part->shape[0] = (int64_t)n;
        part->numel = (int64_t)(n * per_row);
        part->data = (const char *)t->data + (size_t)sl->start * per_row * esz;
    } else {
        char *dst = copy_mem(w, rows * n * esz, 0); /* it stands for the stored slice */
        if (!dst) return nomem(w);
        for (size_t r = 0; r < rows; ++r)
            memcpy(dst + r * n * esz,
                   (const char *)t->data + (r * per_row + (size_t)sl->start) * esz, n * esz);
        part->shape[1] = (int64_t)n;
        part->numel = (int64_t)(rows * n);
        part->data = *copy = dst;
    }
    part->nbytes = (size_t)part->numel * esz;
    return STRATA_OK;
}

/* *f = an f32 copy of `part` (a walk's copy); `slice`, the copy `part` may be, is released
 * either way. */
static int widened(struct walk *w, float **f, const struct st_tensor *part, void *slice) {
    int rc = 0;
    *f = copy_mem(w, (size_t)part->numel * sizeof(float), 1);
    if (!*f) rc = nomem(w);
    if (!rc) rc = st_tensor_to_f32(*f, part);
    release(w, slice);
    if (rc) {
        release(w, *f);
        *f = NULL;
    }
    return rc;
}

/* bf16 / f32 matrices as stored; any other dtype widened to an f32 copy. */
static int place_matrix(struct walk *w, struct ops_weight *out, const struct st_tensor *whole,
                        const struct tp_slice *sl) {
    struct st_tensor part;
    void *slice = NULL;
    float *f;
    memset(out, 0, sizeof *out);
    int rc = sliced(w, &part, &slice, whole, sl);
    if (rc) return rc;
    const int rows = (int)part.shape[0], cols = (int)part.shape[1];
    if (part.dtype == ST_BF16 || part.dtype == ST_F32)
        return w->s->matrix(
            w->s->ctx, out,
            (struct ops_weight){part.data, part.dtype == ST_BF16 ? OPS_BF16 : OPS_F32, rows, cols},
            slice != NULL);
    if ((rc = widened(w, &f, &part, slice))) return rc;
    return w->s->matrix(w->s->ctx, out, (struct ops_weight){f, OPS_F32, rows, cols}, 1);
}

static int place_vector(struct walk *w, const float **out, const struct st_tensor *whole,
                        const struct tp_slice *sl) {
    struct st_tensor part;
    void *slice = NULL;
    float *f;
    int rc = sliced(w, &part, &slice, whole, sl);
    if (rc || (rc = widened(w, &f, &part, slice))) return rc;
    return w->s->vector(w->s->ctx, out, f, (size_t)part.numel);
}

/* Row-major [rows, cols] copy of a block stored input-major: element (r, c) is at
 * base[c * width + offset + r] (elements of `esz` bytes). */
static int place_transposed(struct walk *w, struct ops_weight *out, const char *base, size_t width,
                            size_t offset, int rows, int cols, size_t esz, enum ops_dtype dtype) {
    char *dst = copy_mem(w, (size_t)rows * (size_t)cols * esz, 1);
    if (!dst) return nomem(w);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            memcpy(dst + ((size_t)r * (size_t)cols + (size_t)c) * esz,
                   base + ((size_t)c * width + offset + (size_t)r) * esz, esz);
    return w->s->matrix(w->s->ctx, out, (struct ops_weight){dst, dtype, rows, cols}, 1);
}

/* Columns [col0, col0 + n) of a row-major [rows, cols] block, copied row by row. */
static int place_cols(struct walk *w, struct ops_weight *out, const char *base, int rows,
                      size_t cols, size_t col0, int n, size_t esz, enum ops_dtype dtype) {
    char *dst = copy_mem(w, (size_t)rows * (size_t)n * esz, 1);
    if (!dst) return nomem(w);
    for (size_t r = 0; r < (size_t)rows; ++r)
        memcpy(dst + r * (size_t)n * esz, base + (r * cols + col0) * esz, (size_t)n * esz);
    return w->s->matrix(w->s->ctx, out, (struct ops_weight){dst, dtype, rows, n}, 1);
}

/* One fused expert tensor (all E experts) -> per-expert matrices of the experts this rank
 * holds, each cut to its expert columns [i0, i0 + n) of I (`sl` from tp_tensor_slice: a
 * dim-0 split is whole experts, a split of the I axis cuts every expert). Out-major blocks
 * are used as stored where the cut is rows (gate rows first, then up); input-major ones are
 * transposed once. The manifest accepted only BF16 / F32 here. */
static int place_fused(struct walk *w, struct layer_weights *L, const struct stage_tensor *want,
                       const struct st_tensor *t, const struct tp_slice *sl) {
    const struct model_config *c = w->t->cfg;
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    const size_t esz = t->dtype == ST_BF16 ? 2 : 4;
    const enum ops_dtype dt = t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
    const int in_major = stage_tensor_stored_layout(want, t) == STAGE_LAYOUT_IN_MAJOR;
    const int gate_up = want->slot == STAGE_SLOT_EXPERTS_GATE_UP;
    const size_t block = (gate_up ? 2 * I : I) * H * esz; /* one expert's bytes */
    int e0 = 0, e1 = c->num_experts, rc = STRATA_OK;
    size_t i0 = 0, n = I;
    if (sl && sl->kind == TP_SLICE_SPLIT && sl->dim == 0) {
        e0 = (int)sl->start;
        e1 = (int)(sl->start + sl->count);
    } else if (sl && sl->kind == TP_SLICE_SPLIT) {
        i0 = (size_t)sl->start;
        n = (size_t)sl->count;
    }
    const struct weight_sink *s = w->s;
    for (int e = e0; e < e1 && !rc; ++e) {
        const char *base = (const char *)t->data + (size_t)e * block;
        if (gate_up && in_major) {
            rc = place_transposed(w, &L->expert_gate[e], base, 2 * I, i0, (int)n, (int)H, esz, dt);
            if (!rc)
                rc = place_transposed(w, &L->expert_up[e], base, 2 * I, I + i0, (int)n, (int)H, esz,
                                      dt);
        } else if (gate_up) {
            rc = s->matrix(s->ctx, &L->expert_gate[e],
                           (struct ops_weight){base + i0 * H * esz, dt, (int)n, (int)H}, 0);
            if (!rc)
                rc = s->matrix(s->ctx, &L->expert_up[e],
                               (struct ops_weight){base + (I + i0) * H * esz, dt, (int)n, (int)H},
                               0);
        } else if (in_major) { /* stored [I, H]: rows i0.. of it are the wanted columns */
            rc = place_transposed(w, &L->expert_down[e], base + i0 * H * esz, H, 0, (int)H, (int)n,
                                  esz, dt);
        } else if (n == I) {
            rc = s->matrix(s->ctx, &L->expert_down[e],
                           (struct ops_weight){base, dt, (int)H, (int)I}, 0);
        } else {
            rc = place_cols(w, &L->expert_down[e], base, (int)H, I, i0, (int)n, esz, dt);
        }
    }
    return rc;
}

/* Places one checked manifest entry; `t` is its tensor in the checkpoint, `sl` the part of
 * it this rank holds (NULL: all of it). */
static int place(struct walk *w, const struct stage_tensor *want, const struct st_tensor *t,
                 const struct tp_slice *sl) {
    struct weight_target *T = w->t;
    switch (want->slot) {
    case STAGE_SLOT_EMBED: /* a last stage without the embedding reads it as the tied head */
        return place_matrix(w, T->role.with_embed ? T->embed : T->lm_head, t, sl);
    case STAGE_SLOT_LM_HEAD: return place_matrix(w, T->lm_head, t, sl);
    case STAGE_SLOT_FINAL_NORM: return place_vector(w, T->final_norm, t, sl);
    case STAGE_SLOT_VISION: return STRATA_OK; /* never requested: the decoder's tensors */
    default: break;
    }
    struct layer_weights *L = &T->layers[want->layer - T->role.layer_start];
    const float **vec = layer_weights_vector(L, want->slot);
    struct ops_weight *mat = vec ? NULL : layer_weights_matrix(L, want);
    if (vec) return place_vector(w, vec, t, sl);
    if (mat) return place_matrix(w, mat, t, sl);
    return place_fused(w, L, want, t, sl);
}

/* This rank's part of one manifest entry and its stored bytes (0: an expert another rank
 * holds). */
static int entry_slice(const struct weight_target *T, struct tp_slice *sl, uint64_t *bytes,
                       const struct stage_tensor *want, const struct st_tensor *t) {
    *sl = (struct tp_slice){.kind = TP_SLICE_REPLICATED};
    int rc =
        T->shard ? tp_tensor_slice(sl, T->shard, want, stage_tensor_stored_layout(want, t)) : 0;
    *bytes = !rc && sl->kind != TP_SLICE_ABSENT ? tp_slice_bytes(sl, t->nbytes) : 0;
    return rc;
}

/* Per-layer bookkeeping the manifest does not carry: index, MoE flag, expert tables. */
static int init_layers(const struct weight_target *T) {
    const struct model_config *c = T->cfg;
    for (int l = 0; l < T->role.layer_end - T->role.layer_start; ++l) {
        struct layer_weights *L = &T->layers[l];
        L->index = T->role.layer_start + l;
        L->is_moe = model_config_layer_is_moe(c, L->index);
        if (!L->is_moe) continue;
        L->expert_gate = calloc((size_t)c->num_experts, sizeof *L->expert_gate);
        L->expert_up = calloc((size_t)c->num_experts, sizeof *L->expert_up);
        L->expert_down = calloc((size_t)c->num_experts, sizeof *L->expert_down);
        if (!L->expert_gate || !L->expert_up || !L->expert_down)
            return strata_set_error(STRATA_ENOMEM, "%s: out of host memory", T->who);
    }
    return STRATA_OK;
}

static int walk_list(struct walk *w, const struct stage_tensor_list *list,
                     const struct safetensors *st) {
    const struct weight_sink *s = w->s;
    struct tp_slice sl;
    uint64_t bytes, total = 0;
    int rc = STRATA_OK;
    for (int i = 0; i < list->count && !rc; ++i) {
        rc = entry_slice(w->t, &sl, &bytes, &list->items[i],
                         safetensors_find(st, list->items[i].name));
        total += bytes;
    }
    if (!rc && s->begin) s->begin(s->ctx, total);
    for (int i = 0; i < list->count && !rc; ++i) {
        const struct stage_tensor *want = &list->items[i];
        const struct st_tensor *t = safetensors_find(st, want->name);
        if ((rc = entry_slice(w->t, &sl, &bytes, want, t)) || sl.kind == TP_SLICE_ABSENT)
            continue; /* an expert another rank holds */
        w->t->weight_bytes += bytes;
        w->t->num_tensors++;
        w->copied = 0;
        rc = place(w, want, t, &sl);
        if (!rc && s->placed) s->placed(s->ctx, bytes, w->copied);
    }
    return rc;
}

int weight_load(struct weight_target *T, const struct weight_sink *sink,
                const struct safetensors *st) {
    struct stage_role role = T->role;
    role.with_vision = 0;
    struct stage_tensor_list list;
    char source[96];
    snprintf(source, sizeof source, "%s: layers [%d,%d)%s%s", T->who, role.layer_start,
             role.layer_end, role.with_embed ? " +embed" : "", role.with_head ? " +head" : "");
    T->weight_bytes = 0;
    T->num_tensors = T->head_is_embed = 0;
    int rc = stage_tensor_list_build(&list, T->cfg, &role, st);
    if (rc) return rc;
    struct walk w = {.t = T, .s = sink};
    if (!(rc = stage_tensor_list_check(&list, st, source)) && !(rc = init_layers(T)))
        rc = walk_list(&w, &list, st);
    if (!rc && role.with_head) {
        T->head_is_embed = list.head_is_embed;
        if (list.head_is_embed && role.with_embed) *T->lm_head = *T->embed;
    }
    stage_tensor_list_free(&list);
    return rc;
}
