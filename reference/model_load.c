/* Loading a reference_model's owned tensors from a safetensors checkpoint: the CPU's
 * placement sink for the one manifest walk (reference/weight_load.h).
 *
 * Matrices stay as stored when they are bf16 or f32 (pointers into the mmapped file, then
 * moved into a huge-page arena by model_memory.c unless weights_in_file); the walk's copies
 * (f16 widenings, norm / bias vectors, transposed or column-cut experts, column slices)
 * become heap copies the model owns, counted in reference_model_extra_bytes() unless a copy
 * stands for stored bytes (a TP column slice). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/model_internal.h"
#include "reference/weight_load.h"
#include "runtime/base/status.h"

/* Remembers a heap copy so reference_model_free releases it. */
static void *sink_alloc(void *ctx, size_t bytes, int extra) {
    struct reference_model *m = ctx;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return NULL;
    m->owned[m->n_owned++] = p;
    if (extra) m->extra_bytes += bytes;
    return p;
}

/* Copies stay owned until reference_model_free (a slice widened to f32 keeps both). */
static void sink_release(void *ctx, void *copy) {
    (void)ctx;
    (void)copy;
}

static int sink_matrix(void *ctx, struct ops_weight *w, struct ops_weight host, int copy) {
    (void)ctx;
    (void)copy;
    *w = host;
    return STRATA_OK;
}

static int sink_vector(void *ctx, const float **out, float *host, size_t n) {
    (void)ctx;
    (void)n;
    *out = host;
    return STRATA_OK;
}

static void sink_begin(void *ctx, uint64_t total) {
    struct reference_model *m = ctx;
    m->progress_total = total;
    m->progress_done = 0;
    strata_progress_report(&m->opt.progress, 0, total, "reading tensors");
}

/* Views of the mapping are read later (arena copy, q8), copies now. */
static void sink_placed(void *ctx, uint64_t bytes, int copied) {
    struct reference_model *m = ctx;
    const int later = m->opt.weights_dtype == REFERENCE_WEIGHTS_Q8 || !m->opt.weights_in_file;
    if (!later || copied) ref_progress(m, bytes, "reading tensors");
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

int ref_load_weights(struct reference_model *m, const struct safetensors *st) {
    const struct reference_load_options *o = &m->opt;
    const struct weight_sink sink = {.ctx = m,
                                     .alloc = sink_alloc,
                                     .release = sink_release,
                                     .matrix = sink_matrix,
                                     .vector = sink_vector,
                                     .begin = o->progress.fn ? sink_begin : NULL,
                                     .placed = sink_placed};
    struct weight_target target = {
        .cfg = &m->cfg,
        .role = {o->layer_start, o->layer_end, o->with_embed, o->with_head, 0},
        .shard = m->tp > 1 ? &m->shard : NULL,
        .who = "reference_model",
        .layers = m->layers,
        .embed = &m->embed,
        .lm_head = &m->lm_head,
        .final_norm = &m->final_norm,
    };
    int rc = weight_load(&target, &sink, st);
    m->weight_bytes += target.weight_bytes;
    m->num_tensors += target.num_tensors;
    if (!rc && o->with_head) m->head_is_embed = target.head_is_embed;
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
    return rc;
}
