/* The CUDA backend's weights: uploaded once at open by walking the role's manifest
 * (runtime/model/stage_tensors.h), as reference/model_load.c does; see backend_cuda.c.
 * Under TP a rank uploads only its slice of each tensor (runtime/model/tp_shard.h's
 * tp_tensor_slice, the CPU loader's slicing): a row slice straight from the mapping, a
 * column slice copied row by row from it into a host buffer first, so only the slice's
 * bytes of the checkpoint are read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/backend_cuda_internal.h"

static int dev_alloc(struct cuda_context *c, void **p, size_t bytes) {
    if (c->n_owned == c->cap_owned) {
        int cap = c->cap_owned ? 2 * c->cap_owned : 64;
        void **grown = realloc(c->owned, (size_t)cap * sizeof *grown);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
        c->owned = grown;
        c->cap_owned = cap;
    }
    int rc = cuda_malloc(p, bytes);
    if (rc) return rc;
    c->owned[c->n_owned++] = *p;
    c->device_weight_bytes += bytes;
    return 0;
}

static int dev_upload(struct cuda_context *c, const void **out, const void *src, size_t bytes) {
    void *p = NULL;
    int rc = dev_alloc(c, &p, bytes);
    if (!rc) rc = cuda_memcpy_to_device(p, src, bytes);
    *out = p;
    return rc;
}

/* An f32 host copy of any float tensor (the caller frees it). */
static float *widen(const struct st_tensor *t) {
    float *f = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (f && st_tensor_to_f32(f, t)) {
        free(f);
        return NULL;
    }
    return f;
}

static int upload_vector(struct cuda_context *c, const float **out, const struct st_tensor *t) {
    float *f = widen(t);
    if (!f) return strata_set_error(STRATA_ENOMEM, "cuda backend: cannot widen %s", t->name);
    int rc = dev_upload(c, (const void **)out, f, (size_t)t->numel * sizeof(float));
    free(f);
    return rc;
}

static int upload_matrix(struct cuda_context *c, struct ops_weight *w, const struct st_tensor *t) {
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    if (t->dtype == ST_BF16 || t->dtype == ST_F32) {
        *w = (struct ops_weight){NULL, t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32, rows, cols};
        return dev_upload(c, &w->data, t->data, t->nbytes);
    }
    float *f = widen(t);
    if (!f) return strata_set_error(STRATA_ENOMEM, "cuda backend: cannot widen %s", t->name);
    *w = (struct ops_weight){NULL, OPS_F32, rows, cols};
    int rc = dev_upload(c, &w->data, f, (size_t)t->numel * sizeof(float));
    free(f);
    return rc;
}

/* Row-major [rows, cols] device copy of a block stored input-major: element (r, c) at
 * base[c * width + offset + r] (elements of `esz` bytes). */
static int upload_transposed(struct cuda_context *c, struct ops_weight *w, const char *base,
                             size_t width, size_t offset, int rows, int cols, size_t esz,
                             enum ops_dtype dtype) {
    char *dst = malloc((size_t)rows * (size_t)cols * esz);
    if (!dst) return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    for (int r = 0; r < rows; ++r)
        for (int col = 0; col < cols; ++col)
            memcpy(dst + ((size_t)r * (size_t)cols + (size_t)col) * esz,
                   base + ((size_t)col * width + offset + (size_t)r) * esz, esz);
    *w = (struct ops_weight){NULL, dtype, rows, cols};
    int rc = dev_upload(c, &w->data, dst, (size_t)rows * (size_t)cols * esz);
    free(dst);
    return rc;
}

/* One fused expert tensor -> per-expert device matrices (reference/model_load.c's
 * place_fused): out-major uploaded once and pointed into, in-major transposed once. `t`
 * holds experts [c->experts_lo, c->experts_hi) (all of them, or a TP rank's), stored in
 * `layout` (told from the whole tensor's shape: a rank's slice has fewer experts). */
static int upload_fused(struct cuda_context *c, struct layer_weights *L,
                        const struct stage_tensor *want, const struct st_tensor *t,
                        enum stage_tensor_layout layout) {
    const size_t H = (size_t)c->cfg->hidden_size, I = (size_t)c->cfg->moe_intermediate_size;
    const size_t esz = t->dtype == ST_BF16 ? 2 : 4;
    const enum ops_dtype dt = t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32;
    const int in_major = layout == STAGE_LAYOUT_IN_MAJOR;
    const int gate_up = want->slot == STAGE_SLOT_EXPERTS_GATE_UP;
    const size_t block = (gate_up ? 2 * I : I) * H * esz;
    const char *dev = NULL;
    int rc = 0;
    if (!in_major && (rc = dev_upload(c, (const void **)&dev, t->data, t->nbytes))) return rc;
    for (int e = c->experts_lo; e < c->experts_hi && !rc; ++e) {
        const size_t at = (size_t)(e - c->experts_lo) * block;
        const char *host = (const char *)t->data + at;
        const char *base = in_major ? NULL : dev + at;
        if (gate_up && in_major) {
            rc = upload_transposed(c, &L->expert_gate[e], host, 2 * I, 0, (int)I, (int)H, esz, dt);
            if (!rc)
                rc =
                    upload_transposed(c, &L->expert_up[e], host, 2 * I, I, (int)I, (int)H, esz, dt);
        } else if (gate_up) {
            L->expert_gate[e] = (struct ops_weight){base, dt, (int)I, (int)H};
            L->expert_up[e] = (struct ops_weight){base + I * H * esz, dt, (int)I, (int)H};
        } else if (in_major) {
            rc = upload_transposed(c, &L->expert_down[e], host, H, 0, (int)H, (int)I, esz, dt);
        } else {
            L->expert_down[e] = (struct ops_weight){base, dt, (int)H, (int)I};
        }
    }
    return rc;
}

/* *view = the part of `t` the slice names (one part along dim 0 or 1): rows are a view into
 * the mapping, columns a heap copy (*copy, the caller frees it). */
static int slice_view(struct st_tensor *view, void **copy, const struct st_tensor *t,
                      const struct tp_slice *sl) {
    *view = *t;
    *copy = NULL;
    if (sl->kind != TP_SLICE_SPLIT || (sl->start == 0 && sl->count == sl->extent)) return 0;
    if (sl->parts != 1 || sl->dim > 1 || (sl->dim == 1 && t->ndim != 2))
        return strata_set_error(STRATA_EINVAL, "cuda backend: cannot slice %s under TP", t->name);
    const size_t esz = st_dtype_size(t->dtype), rows = (size_t)t->shape[0];
    const size_t per_row = rows ? (size_t)t->numel / rows : 0, n = (size_t)sl->count;
    if (sl->dim == 0) {
        view->shape[0] = (int64_t)n;
        view->numel = (int64_t)(n * per_row);
        view->data = (const char *)t->data + (size_t)sl->start * per_row * esz;
    } else {
        char *dst = malloc(rows * n * esz + 1);
        if (!dst) return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
        for (size_t r = 0; r < rows; ++r)
            memcpy(dst + r * n * esz,
                   (const char *)t->data + (r * per_row + (size_t)sl->start) * esz, n * esz);
        view->shape[1] = (int64_t)n;
        view->numel = (int64_t)(rows * n);
        view->data = *copy = dst;
    }
    view->nbytes = (size_t)view->numel * esz;
    return 0;
}

static int place_whole(struct cuda_context *c, const struct stage_tensor *want,
                       const struct st_tensor *t, enum stage_tensor_layout layout) {
    switch (want->slot) {
    case STAGE_SLOT_EMBED: /* a last stage without the embedding reads it as the tied head */
        return upload_matrix(c, c->role.with_embed ? &c->embed : &c->lm_head, t);
    case STAGE_SLOT_LM_HEAD: return upload_matrix(c, &c->lm_head, t);
    case STAGE_SLOT_FINAL_NORM: return upload_vector(c, &c->final_norm, t);
    case STAGE_SLOT_VISION: return 0;
    default: break;
    }
    struct layer_weights *L = &c->layers[want->layer - c->role.layer_start];
    const float **vec = layer_weights_vector(L, want->slot);
    if (vec) return upload_vector(c, vec, t);
    struct ops_weight *mat = layer_weights_matrix(L, want);
    if (mat) return upload_matrix(c, mat, t);
    return upload_fused(c, L, want, t, layout);
}

/* Bytes of this rank's part of one manifest entry (0: an expert another rank holds). */
static int entry_bytes(uint64_t *out, struct cuda_context *c, const struct stage_tensor *want,
                       const struct st_tensor *t, struct tp_slice *sl) {
    *sl = (struct tp_slice){.kind = TP_SLICE_REPLICATED};
    *out = 0;
    int rc =
        c->tp > 1 ? tp_tensor_slice(sl, &c->shard, want, stage_tensor_stored_layout(want, t)) : 0;
    if (!rc && sl->kind != TP_SLICE_ABSENT) *out = tp_slice_bytes(sl, t->nbytes);
    return rc;
}

/* Places one manifest entry: this rank's slice of it under TP, else the whole tensor. */
static int place(struct cuda_context *c, const struct stage_tensor *want,
                 const struct st_tensor *t) {
    struct tp_slice sl;
    uint64_t bytes;
    const enum stage_tensor_layout layout = stage_tensor_stored_layout(want, t);
    int rc = entry_bytes(&bytes, c, want, t, &sl);
    if (rc || sl.kind == TP_SLICE_ABSENT) return rc; /* an expert another rank holds */
    c->weight_bytes += bytes;
    c->num_tensors++;
    struct st_tensor part;
    void *copy = NULL;
    if (!(rc = slice_view(&part, &copy, t, &sl))) rc = place_whole(c, want, &part, layout);
    free(copy);
    return rc;
}

/* The stored bytes of this rank's part of every listed tensor: the progress total, known
 * before the first upload (the same sum place() makes of weight_bytes). */
static int list_bytes(uint64_t *total, struct cuda_context *c, const struct stage_tensor_list *list,
                      const struct safetensors *st) {
    *total = 0;
    for (int i = 0; i < list->count; ++i) {
        struct tp_slice sl;
        uint64_t bytes;
        int rc =
            entry_bytes(&bytes, c, &list->items[i], safetensors_find(st, list->items[i].name), &sl);
        if (rc) return rc;
        *total += bytes;
    }
    return 0;
}

/* Places every listed tensor, reporting the bytes uploaded so far after each. */
static int place_all(struct cuda_context *c, const struct stage_tensor_list *list,
                     const struct safetensors *st, const struct strata_progress *progress) {
    static const char phase[] = "uploading to the device";
    uint64_t total = 0;
    int rc = progress && progress->fn ? list_bytes(&total, c, list, st) : 0;
    if (!rc) strata_progress_report(progress, 0, total, phase);
    for (int i = 0; i < list->count && !rc; ++i) {
        rc = place(c, &list->items[i], safetensors_find(st, list->items[i].name));
        /* weight_bytes is the running sum of the same per-tensor bytes as the total */
        if (!rc && progress && progress->fn)
            strata_progress_report(progress, c->weight_bytes, total, phase);
    }
    return rc;
}

int backend_cuda_load_weights(struct cuda_context *c, const struct safetensors *st,
                              const struct strata_progress *progress) {
    const struct model_config *cfg = c->cfg;
    for (int l = 0; l < c->n_layers; ++l) {
        struct layer_weights *L = &c->layers[l];
        L->index = c->role.layer_start + l;
        L->is_moe = model_config_layer_is_moe(cfg, L->index);
        if (!L->is_moe) continue;
        L->expert_gate = calloc((size_t)cfg->num_experts, sizeof *L->expert_gate);
        L->expert_up = calloc((size_t)cfg->num_experts, sizeof *L->expert_up);
        L->expert_down = calloc((size_t)cfg->num_experts, sizeof *L->expert_down);
        if (!L->expert_gate || !L->expert_up || !L->expert_down)
            return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    }
    struct stage_role role = c->role;
    role.with_vision = 0;
    struct stage_tensor_list list;
    char source[96];
    snprintf(source, sizeof source, "cuda backend: layers [%d,%d)%s%s", role.layer_start,
             role.layer_end, role.with_embed ? " +embed" : "", role.with_head ? " +head" : "");
    int rc = stage_tensor_list_build(&list, cfg, &role, st);
    if (rc) return rc;
    if (!(rc = stage_tensor_list_check(&list, st, source))) rc = place_all(c, &list, st, progress);
    if (!rc && role.with_head && list.head_is_embed && role.with_embed) c->lm_head = c->embed;
    stage_tensor_list_free(&list);
    return rc;
}
