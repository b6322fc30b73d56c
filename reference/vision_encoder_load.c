/* Loading the vision tower's tensors into a vision_encoder.
 *
 * As reference/model_load.c does for the decoder: the manifest (runtime/model/
 * stage_tensors.h, role with_vision only) lists the tensors, their shapes and dtypes, and
 * gives the one report of every missing or mis-shaped tensor; this file checks the
 * checkpoint against it and places each entry by its vision part and index, never building
 * or parsing a name. bf16 / f32 matrices stay in the mapping; f16 matrices, the position
 * table and every norm / bias vector are widened to f32 copies once (counted in
 * vision_encoder_extra_bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/vision_encoder_internal.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

/* Remembers a heap copy so vision_encoder_free releases it; NULL when out of memory. */
static void *own(struct vision_encoder *e, size_t bytes) {
    if (e->n_owned == e->cap_owned) {
        int cap = e->cap_owned ? 2 * e->cap_owned : 64;
        void **grown = realloc(e->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        e->owned = grown;
        e->cap_owned = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return NULL;
    e->owned[e->n_owned++] = p;
    e->extra_bytes += bytes;
    return p;
}

/* A matrix [shape[0], numel / shape[0]]: the Conv3d kernel [Hv, C, Tp, p, p] is contiguous, so
 * its flattening is the [Hv, C*Tp*p*p] matrix the patch rows multiply (spec §6.1). */
static int place_matrix(struct vision_encoder *e, struct ops_weight *w, const struct st_tensor *t) {
    int rows = (int)t->shape[0], cols = (int)(t->numel / t->shape[0]);
    if (t->dtype == ST_BF16 || t->dtype == ST_F32) {
        *w = (struct ops_weight){t->data, t->dtype == ST_BF16 ? OPS_BF16 : OPS_F32, rows, cols};
        return STRATA_OK;
    }
    float *copy = own(e, (size_t)t->numel * sizeof(float));
    if (!copy) return strata_set_error(STRATA_ENOMEM, "vision encoder: out of memory");
    st_tensor_to_f32(copy, t);
    *w = (struct ops_weight){copy, OPS_F32, rows, cols};
    return STRATA_OK;
}

static int place_vector(struct vision_encoder *e, const float **v, const struct st_tensor *t) {
    float *copy = own(e, (size_t)t->numel * sizeof(float));
    if (!copy) return strata_set_error(STRATA_ENOMEM, "vision encoder: out of memory");
    st_tensor_to_f32(copy, t);
    *v = copy;
    return STRATA_OK;
}

/* The vector field of a block part, or NULL for a matrix part. */
static const float **block_vector(struct vision_block *b, enum stage_vision_part part) {
    switch (part) {
    case STAGE_VIS_NORM1_W: return &b->norm1_w;
    case STAGE_VIS_NORM1_B: return &b->norm1_b;
    case STAGE_VIS_NORM2_W: return &b->norm2_w;
    case STAGE_VIS_NORM2_B: return &b->norm2_b;
    case STAGE_VIS_QKV_B: return &b->qkv_b;
    case STAGE_VIS_PROJ_B: return &b->proj_b;
    case STAGE_VIS_FC1_B: return &b->fc1_b;
    case STAGE_VIS_FC2_B: return &b->fc2_b;
    default: return NULL;
    }
}

static struct ops_weight *block_matrix(struct vision_block *b, enum stage_vision_part part) {
    switch (part) {
    case STAGE_VIS_QKV_W: return &b->qkv;
    case STAGE_VIS_PROJ_W: return &b->proj;
    case STAGE_VIS_FC1_W: return &b->fc1;
    case STAGE_VIS_FC2_W: return &b->fc2;
    default: return NULL;
    }
}

static int place_merger(struct vision_encoder *e, struct vision_merger *mg,
                        enum stage_vision_part part, const struct st_tensor *t) {
    switch (part) {
    case STAGE_VIS_MERGER_NORM_W: return place_vector(e, &mg->norm_w, t);
    case STAGE_VIS_MERGER_NORM_B: return place_vector(e, &mg->norm_b, t);
    case STAGE_VIS_MERGER_FC1_W: return place_matrix(e, &mg->fc1, t);
    case STAGE_VIS_MERGER_FC1_B: return place_vector(e, &mg->fc1_b, t);
    case STAGE_VIS_MERGER_FC2_W: return place_matrix(e, &mg->fc2, t);
    case STAGE_VIS_MERGER_FC2_B: return place_vector(e, &mg->fc2_b, t);
    default: return strata_set_error(STRATA_EINVAL, "vision encoder: bad merger part %d", part);
    }
}

/* Places one checked manifest entry; `t` is its tensor in the checkpoint. */
static int place(struct vision_encoder *e, const struct stage_tensor *want,
                 const struct st_tensor *t) {
    e->weight_bytes += t->nbytes;
    const int i = want->vision_index;
    switch (want->vision) {
    case STAGE_VIS_PATCH_W: return place_matrix(e, &e->patch, t);
    case STAGE_VIS_PATCH_B: return place_vector(e, &e->patch_b, t);
    case STAGE_VIS_POS_EMBED: return place_vector(e, &e->pos_embed, t);
    case STAGE_VIS_MERGER_NORM_W:
    case STAGE_VIS_MERGER_NORM_B:
    case STAGE_VIS_MERGER_FC1_W:
    case STAGE_VIS_MERGER_FC1_B:
    case STAGE_VIS_MERGER_FC2_W:
    case STAGE_VIS_MERGER_FC2_B:
        return place_merger(e, i < 0 ? &e->merger : &e->deepstack[i], want->vision, t);
    case STAGE_VIS_NONE:
        return strata_set_error(STRATA_EINVAL, "vision encoder: %s is not a vision tensor",
                                want->name);
    default: break;
    }
    struct vision_block *b = &e->blocks[i];
    const float **vec = block_vector(b, want->vision);
    if (vec) return place_vector(e, vec, t);
    return place_matrix(e, block_matrix(b, want->vision), t);
}

int vision_load_weights(struct vision_encoder *e, const struct model_config *cfg,
                        const struct safetensors *st) {
    struct stage_role role = {0, 0, 0, 0, 1}; /* the vision tower alone */
    struct stage_tensor_list list;
    int rc = stage_tensor_list_build(&list, cfg, &role, st);
    if (rc) return rc;
    rc = stage_tensor_list_check(&list, st, "vision encoder (model.visual.*)");
    for (int i = 0; i < list.count && !rc; ++i)
        rc = place(e, &list.items[i], safetensors_find(st, list.items[i].name));
    stage_tensor_list_free(&list);
    return rc;
}
