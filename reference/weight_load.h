/* The one walk over a role's tensor manifest that places a stage's weights, for every
 * backend. Which tensors a role needs, their shapes and dtypes and the one report of every
 * missing or mis-shaped tensor come from the manifest (runtime/model/stage_tensors.h); the
 * part of each tensor a TP rank holds from runtime/model/tp_shard.h; where each slot lands
 * from layer_weights.h. This file decides how a stored tensor becomes a matrix the ops read
 * (kept as stored when bf16 / f32, f16 widened to f32, every norm / bias vector widened,
 * input-major fused experts transposed into per-expert row-major matrices, a column slice
 * copied row by row so only its bytes of the mapping are read) and hands each result, in
 * host memory, to the backend's placement sink: the CPU keeps it (a view of the mapping or
 * a copy it owns), a device uploads it. */
#ifndef STRATA_REFERENCE_WEIGHT_LOAD_H
#define STRATA_REFERENCE_WEIGHT_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "reference/layer_weights.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"

/* A backend's placement of host-side weights. Every call returns 0 or a negative STRATA_E*
 * with the message set, except alloc (NULL: out of memory) and release. */
struct weight_sink {
    void *ctx;
    /* Host memory for a copy the walk makes. `extra`: the copy adds bytes beyond the stored
     * ones (a widening, a transposition), not a slice standing for stored bytes. */
    void *(*alloc)(void *ctx, size_t bytes, int extra);
    /* A copy from alloc the walk no longer needs (the sink may keep it until its end). */
    void (*release)(void *ctx, void *copy);
    /* *w = the matrix `host` (host memory: a view of the mapping, or when `copy` a buffer
     * from alloc, which the sink then owns) in the backend's memory. */
    int (*matrix)(void *ctx, struct ops_weight *w, struct ops_weight host, int copy);
    /* *out = the f32 vector host [n] (from alloc; the sink owns it) in the backend's memory. */
    int (*vector)(void *ctx, const float **out, float *host, size_t n);
    /* Before the first tensor: the stored bytes of this rank's part of every listed tensor;
     * after each placed entry: its bytes, and whether the walk copied any of them (a view
     * of the mapping is read only when the backend reads it). Either may be NULL. */
    void (*begin)(void *ctx, uint64_t total);
    void (*placed)(void *ctx, uint64_t bytes, int copied);
};

/* What the walk fills. layers [role.layer_end - role.layer_start] (each's index, MoE flag
 * and expert arrays set here; the arrays belong to the caller after, on failure too). */
struct weight_target {
    const struct model_config *cfg;
    struct stage_role role;       /* role.with_vision is ignored: the decoder's tensors */
    const struct tp_shard *shard; /* this TP rank's part; NULL: the whole model */
    const char *who;              /* names the loader in messages */
    struct layer_weights *layers;
    struct ops_weight *embed, *lm_head; /* a tied head: *lm_head = *embed when both owned */
    const float **final_norm;
    /* Out: stored bytes of this rank's part, tensors placed, and whether the head is the
     * embedding (tied). */
    uint64_t weight_bytes;
    int num_tensors, head_is_embed;
};

/* Checks the checkpoint against the role's manifest and places every entry through `sink`. */
int weight_load(struct weight_target *target, const struct weight_sink *sink,
                const struct safetensors *st);

#endif
