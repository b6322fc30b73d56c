/* Loading a reference_model's owned tensors from a safetensors checkpoint.
 *
 * Which tensors a role needs, their shapes and dtypes, and the one report of every missing
 * or mis-shaped tensor all come from the manifest (runtime/model/stage_tensors.h): this file
 * checks the checkpoint against it and then places each manifest entry by its slot, layer
 * and expert; it never builds a tensor name.
 *
 * Matrices stay as stored when they are bf16 or f32 (pointers into the mmapped file, then
 * moved into a huge-page arena by model_memory.c unless weights_in_file); f16
 * matrices and every norm / bias vector are widened to f32 copies once, and input-major
 * fused experts ([E, H, 2I] / [E, I, H]) are transposed once into per-expert row-major
 * copies. Those copies are counted in reference_model_extra_bytes(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/model_internal.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

struct loader {
    struct reference_model *m;
    int nomem;
};

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

/* A view of rows [row0, row0 + n) of `t` (dim 0; a vector's elements): no copy. */
static struct st_tensor rows_view(const struct st_tensor *t, int64_t row0, int64_t n) {
    struct st_tensor v = *t;
    const int64_t per_row = t->shape[0] ? t->numel / t->shape[0] : 0;
    const size_t esz = st_dtype_size(t->dtype);
    v.shape[0] = n;
    v.numel = n * per_row;
    v.data = (const char *)t->data + (size_t)(row0 * per_row) * esz;
    v.nbytes = (size_t)v.numel * esz;
    return v;
}

/* A heap copy of columns [col0, col0 + n) of the 2-D `t`, in its stored dtype, read row by
 * row from the mapping (only those bytes are touched: never the whole tensor). */
static struct st_tensor cols_copy(struct loader *ld, const struct st_tensor *t, int64_t col0,
                                  int64_t n) {
    struct st_tensor v = *t;
    const size_t esz = st_dtype_size(t->dtype), rows = (size_t)t->shape[0];
    const size_t cols = (size_t)t->shape[1];
    char *dst = own(ld, rows * (size_t)n * esz);
    v.data = NULL;
    if (!dst) return v;
    for (size_t r = 0; r < rows; ++r)
        memcpy(dst + r * (size_t)n * esz, (const char *)t->data + (r * cols + (size_t)col0) * esz,
               (size_t)n * esz);
    ld->m->extra_bytes -= rows * (size_t)n * esz; /* it stands for the stored slice */
    v.shape[1] = n;
    v.numel = (int64_t)rows * n;
    v.data = dst;
    v.nbytes = (size_t)v.numel * esz;
    return v;
}

/* The part of `t` this rank holds (`sl` from tp_tensor_slice; one part, dim 0 or 1). */
static struct st_tensor sliced(struct loader *ld, const struct st_tensor *t,
                               const struct tp_slice *sl) {
    if (!sl || sl->kind != TP_SLICE_SPLIT) return *t;
    if (sl->dim == 0) return rows_view(t, sl->start, sl->count);
    return cols_copy(ld, t, sl->start, sl->count);
}

static void place_matrix(struct loader *ld, struct ops_weight *w, const struct st_tensor *whole,
                         const struct tp_slice *sl) {
    memset(w, 0, sizeof *w);
    const struct st_tensor part = sliced(ld, whole, sl), *t = &part;
    if (!t->data) return;
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    if (t->dtype == ST_BF16 || t->dtype == ST_F32) {
        *w = (struct ops_weight){t->data, t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32, rows, cols};
        return;
    }
    float *copy = own(ld, (size_t)t->numel * sizeof(float));
    if (!copy) return;
    st_tensor_to_f32(copy, t);
    *w = (struct ops_weight){copy, OPS_F32, rows, cols};
}

static const float *place_vector(struct loader *ld, const struct st_tensor *whole,
                                 const struct tp_slice *sl) {
    const struct st_tensor t = sliced(ld, whole, sl);
    float *copy = own(ld, (size_t)t.numel * sizeof(float));
    if (copy) st_tensor_to_f32(copy, &t);
    return copy;
}

/* Row-major [rows, cols] copy of a block stored input-major: element (r, c) is at
 * base[c * width + offset + r] (elements of `esz` bytes). */
static void place_transposed(struct loader *ld, struct ops_weight *w, const char *base,
                             size_t width, size_t offset, int rows, int cols, size_t esz,
                             enum ops_dtype dtype) {
    char *dst = own(ld, (size_t)rows * (size_t)cols * esz);
    if (!dst) return;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            memcpy(dst + ((size_t)r * (size_t)cols + (size_t)c) * esz,
                   base + ((size_t)c * width + offset + (size_t)r) * esz, esz);
    *w = (struct ops_weight){dst, dtype, rows, cols};
}

/* Columns [col0, col0 + n) of a row-major [rows, cols] block, copied row by row. */
static void place_cols(struct loader *ld, struct ops_weight *w, const char *base, int rows,
                       size_t cols, size_t col0, int n, size_t esz, enum ops_dtype dtype) {
    char *dst = own(ld, (size_t)rows * (size_t)n * esz);
    if (!dst) return;
    for (size_t r = 0; r < (size_t)rows; ++r)
        memcpy(dst + r * (size_t)n * esz, base + (r * cols + col0) * esz, (size_t)n * esz);
    *w = (struct ops_weight){dst, dtype, rows, n};
}

/* One fused expert tensor (all E experts) -> per-expert matrices of the experts this rank
 * holds, each cut to its expert columns [i0, i0 + n) of I (`sl` from tp_tensor_slice: a
 * dim-0 split is whole experts, a split of the I axis cuts every expert). Out-major
 * blocks are used in place where the cut is rows (gate rows first, then up); input-major
 * ones are transposed once. The manifest accepted only BF16 / F32 here. */
static void place_fused(struct loader *ld, struct layer_weights *L, const struct stage_tensor *want,
                        const struct st_tensor *t, const struct tp_slice *sl) {
    const struct model_config *c = &ld->m->cfg;
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    const size_t esz = t->dtype == ST_BF16 ? 2 : 4;
    const enum ops_dtype dt = t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
    const int in_major = stage_tensor_stored_layout(want, t) == STAGE_LAYOUT_IN_MAJOR;
    const int gate_up = want->slot == STAGE_SLOT_EXPERTS_GATE_UP;
    const size_t block = (gate_up ? 2 * I : I) * H * esz; /* one expert's bytes */
    int e0 = 0, e1 = c->num_experts;
    size_t i0 = 0, n = I;
    if (sl->kind == TP_SLICE_SPLIT && sl->dim == 0) {
        e0 = (int)sl->start;
        e1 = (int)(sl->start + sl->count);
    } else if (sl->kind == TP_SLICE_SPLIT) {
        i0 = (size_t)sl->start;
        n = (size_t)sl->count;
    }
    for (int e = e0; e < e1 && !ld->nomem; ++e) {
        const char *base = (const char *)t->data + (size_t)e * block;
        if (gate_up && in_major) {
            place_transposed(ld, &L->expert_gate[e], base, 2 * I, i0, (int)n, (int)H, esz, dt);
            place_transposed(ld, &L->expert_up[e], base, 2 * I, I + i0, (int)n, (int)H, esz, dt);
        } else if (gate_up) {
            L->expert_gate[e] = (struct ops_weight){base + i0 * H * esz, dt, (int)n, (int)H};
            L->expert_up[e] = (struct ops_weight){base + (I + i0) * H * esz, dt, (int)n, (int)H};
        } else if (in_major) { /* stored [I, H]: rows i0.. of it are the wanted columns */
            place_transposed(ld, &L->expert_down[e], base + i0 * H * esz, H, 0, (int)H, (int)n, esz,
                             dt);
        } else if (n == I) {
            L->expert_down[e] = (struct ops_weight){base, dt, (int)H, (int)I};
        } else {
            place_cols(ld, &L->expert_down[e], base, (int)H, I, i0, (int)n, esz, dt);
        }
    }
}

/* Places one checked manifest entry; `t` is its tensor in the checkpoint, `sl` the part of
 * it this rank holds. */
static void place(struct loader *ld, const struct stage_tensor *want, const struct st_tensor *t,
                  const struct tp_slice *sl) {
    struct reference_model *m = ld->m;
    if (sl->kind == TP_SLICE_ABSENT) return; /* an expert another rank holds */
    m->weight_bytes += tp_slice_bytes(sl, t->nbytes);
    m->num_tensors++;
    switch (want->slot) {
    case STAGE_SLOT_EMBED: /* a last stage without the embedding reads it as the tied head */
        place_matrix(ld, m->opt.with_embed ? &m->embed : &m->lm_head, t, sl);
        return;
    case STAGE_SLOT_LM_HEAD: place_matrix(ld, &m->lm_head, t, sl); return;
    case STAGE_SLOT_FINAL_NORM: m->final_norm = place_vector(ld, t, sl); return;
    case STAGE_SLOT_VISION: return; /* never requested: the decoder is text-only */
    default: break;
    }
    struct layer_weights *L = &m->layers[want->layer - m->opt.layer_start];
    const float **vec = layer_weights_vector(L, want->slot);
    struct ops_weight *mat = vec ? NULL : layer_weights_matrix(L, want);
    if (vec)
        *vec = place_vector(ld, t, sl);
    else if (mat)
        place_matrix(ld, mat, t, sl);
    else
        place_fused(ld, L, want, t, sl);
}

void ref_progress(struct reference_model *m, uint64_t bytes, const char *phase) {
    if (!m->opt.progress.fn) return;
    const uint64_t left = m->progress_total - m->progress_done;
    m->progress_done += bytes < left ? bytes : left;
    strata_progress_report(&m->opt.progress, m->progress_done, m->progress_total, phase);
}

void ref_progress_done(struct reference_model *m, const char *phase) {
    if (m->progress_done < m->progress_total || m->progress_total == 0)
        ref_progress(m, m->progress_total - m->progress_done, phase);
}

/* The progress total: the stored bytes of this rank's part of every listed tensor (what
 * place() adds to weight_bytes), known before any is read. */
static int progress_total(struct reference_model *m, const struct stage_tensor_list *list,
                          const struct safetensors *st) {
    m->progress_total = m->progress_done = 0;
    for (int i = 0; i < list->count; ++i) {
        const struct stage_tensor *want = &list->items[i];
        const struct st_tensor *t = safetensors_find(st, want->name);
        struct tp_slice sl = {.kind = TP_SLICE_REPLICATED};
        int rc = m->tp > 1
                     ? tp_tensor_slice(&sl, &m->shard, want, stage_tensor_stored_layout(want, t))
                     : 0;
        if (rc) return rc;
        if (sl.kind != TP_SLICE_ABSENT) m->progress_total += tp_slice_bytes(&sl, t->nbytes);
    }
    return STRATA_OK;
}

/* Per-layer bookkeeping the manifest does not carry: index, MoE flag, expert tables. */
static int init_layers(struct reference_model *m) {
    const struct model_config *c = &m->cfg;
    for (int l = 0; l < m->n_layers; ++l) {
        struct layer_weights *L = &m->layers[l];
        L->index = m->opt.layer_start + l;
        L->is_moe = model_config_layer_is_moe(c, L->index);
        if (!L->is_moe) continue;
        L->expert_gate = calloc((size_t)c->num_experts, sizeof *L->expert_gate);
        L->expert_up = calloc((size_t)c->num_experts, sizeof *L->expert_up);
        L->expert_down = calloc((size_t)c->num_experts, sizeof *L->expert_down);
        if (!L->expert_gate || !L->expert_up || !L->expert_down)
            return strata_set_error(STRATA_ENOMEM, "reference_model: out of memory");
    }
    return STRATA_OK;
}

int ref_load_weights(struct reference_model *m, const struct safetensors *st) {
    const struct reference_load_options *o = &m->opt;
    struct stage_role role = {o->layer_start, o->layer_end, o->with_embed, o->with_head, 0};
    struct stage_tensor_list list;
    char source[96];
    snprintf(source, sizeof source, "reference_model: layers [%d,%d)%s%s", o->layer_start,
             o->layer_end, o->with_embed ? " +embed" : "", o->with_head ? " +head" : "");
    int rc = stage_tensor_list_build(&list, &m->cfg, &role, st);
    if (rc) return rc;
    if (!(rc = stage_tensor_list_check(&list, st, source)) && !(rc = init_layers(m))) {
        struct loader ld = {.m = m};
        /* Views of the mapping are read later (arena copy, q8), copies now. */
        const int later = o->weights_dtype == REFERENCE_WEIGHTS_Q8 || !o->weights_in_file;
        if (o->progress.fn && !(rc = progress_total(m, &list, st)))
            strata_progress_report(&o->progress, 0, m->progress_total, "reading tensors");
        for (int i = 0; i < list.count && !ld.nomem && !rc; ++i) {
            const struct stage_tensor *want = &list.items[i];
            const struct st_tensor *t = safetensors_find(st, want->name);
            struct tp_slice sl = {.kind = TP_SLICE_REPLICATED};
            if (m->tp > 1)
                rc = tp_tensor_slice(&sl, &m->shard, want, stage_tensor_stored_layout(want, t));
            const int owned = m->n_owned;
            if (!rc) place(&ld, want, t, &sl);
            if (!rc && sl.kind != TP_SLICE_ABSENT && (!later || m->n_owned != owned))
                ref_progress(m, tp_slice_bytes(&sl, t->nbytes), "reading tensors");
        }
        if (ld.nomem) rc = strata_set_error(STRATA_ENOMEM, "reference_model: out of memory");
    }
    if (!rc && o->with_head) {
        m->head_is_embed = list.head_is_embed;
        if (list.head_is_embed && o->with_embed) m->lm_head = m->embed;
    }
    const char *phase = "reading tensors";
    if (!rc && o->weights_dtype == REFERENCE_WEIGHTS_Q8) {
        rc = ref_quantize_weights(m);
        phase = "quantising to q8";
    } else if (!rc && !o->weights_in_file) {
        rc = ref_copy_weights(m);
        phase = "copying to huge pages";
    }
    /* What no phase read (an untied embedding: gathered a row at a time; q8's routers) is
     * placed all the same: the load is done. */
    if (!rc) ref_progress_done(m, phase);
    stage_tensor_list_free(&list);
    return rc;
}
