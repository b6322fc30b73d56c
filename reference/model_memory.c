/* Where the loaded matrices live (reference/weight_arena.h says why it matters).
 *
 * After the loader has placed every manifest entry, every bf16 / f32 matrix the forward pass
 * streams is moved, in the forward pass's order, into one huge-page-advised anonymous arena:
 * views of the mmapped checkpoint have their file pages dropped from the process, the
 * loader's own copies (f16 widened, experts transposed, TP column slices) are freed. The
 * resident set stays the same size, the bits the matmuls read are the same, only the memory
 * they stream from changes. */
#include <stdlib.h>
#include <string.h>

#include "reference/model_internal.h"
#include "runtime/base/status.h"

enum { COPY_CHUNK = 64 << 20 }; /* bytes copied between two progress reports, at most */

int ref_for_each_matrix(struct reference_model *m, int with_router, ref_matrix_fn fn, void *ctx) {
    int rc = STRATA_OK;
    for (int l = 0; l < m->n_layers && !rc; ++l) {
        struct layer_weights *L = &m->layers[l];
        struct {
            struct ops_weight *w;
            const char *what;
        } mats[] = {{&L->q, "q_proj"},   {&L->k, "k_proj"},      {&L->v, "v_proj"},
                    {&L->o, "o_proj"},   {&L->router, "router"}, {&L->gate, "gate_proj"},
                    {&L->up, "up_proj"}, {&L->down, "down_proj"}};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && !rc; ++i)
            if (mats[i].w->data && (with_router || mats[i].w != &L->router))
                rc = fn(m, mats[i].w, mats[i].what, L->index, ctx);
        for (int e = 0; L->is_moe && e < m->cfg.num_experts && !rc; ++e) {
            if (L->expert_gate[e].data)
                rc = fn(m, &L->expert_gate[e], "an expert's gate_proj", L->index, ctx);
            if (!rc && L->expert_up[e].data)
                rc = fn(m, &L->expert_up[e], "an expert's up_proj", L->index, ctx);
            if (!rc && L->expert_down[e].data)
                rc = fn(m, &L->expert_down[e], "an expert's down_proj", L->index, ctx);
        }
    }
    /* A tied head is a copy of the embedding's struct: only the head is visited (the
     * embedding is gathered a row per token, never streamed). */
    if (!rc && m->opt.with_head && m->lm_head.data) rc = fn(m, &m->lm_head, "lm_head", -1, ctx);
    return rc;
}

size_t ref_matrix_bytes(const struct ops_weight *w) {
    const size_t esz = w->dtype == OPS_BF16 ? 2u : sizeof(float);
    return (size_t)w->rows * (size_t)w->cols * esz;
}

int ref_owned_index(const struct reference_model *m, const void *data) {
    for (int i = 0; i < m->n_owned; ++i)
        if (m->owned[i] == data) return i;
    return -1;
}

static int movable(const struct ops_weight *w) {
    return w->dtype == OPS_BF16 || w->dtype == OPS_F32;
}

static int count_movable(struct reference_model *m, struct ops_weight *w, const char *what,
                         int layer, void *ctx) {
    (void)m, (void)what, (void)layer;
    if (movable(w)) *(size_t *)ctx += weight_arena_round(ref_matrix_bytes(w));
    return STRATA_OK;
}

int ref_release_matrix(struct reference_model *m, const void *data, size_t bytes) {
    const int i = ref_owned_index(m, data);
    if (i < 0) {
        weight_arena_drop_mapped(data, bytes);
        return 0;
    }
    if (data == m->embed.data) return 0; /* a tied head's copy: still gathered */
    free(m->owned[i]);
    m->owned[i] = NULL;
    return 1;
}

/* Moves one matrix into the arena. Its old memory: a view's file pages are dropped; a
 * loader copy (f16 widened, experts transposed, a TP column slice) is freed, unless it is
 * also the embedding's (a tied head of a first-and-last stage: still gathered). */
static int move_matrix(struct reference_model *m, struct ops_weight *w, const char *what, int layer,
                       void *ctx) {
    (void)what, (void)layer, (void)ctx;
    if (!movable(w)) return STRATA_OK;
    const size_t bytes = ref_matrix_bytes(w);
    void *dst = weight_arena_alloc(&m->arena, bytes);
    if (!dst)
        return strata_set_error(STRATA_ENOMEM, "weights: the copy arena is too small (a bug)");
    const int i = ref_owned_index(m, w->data);
    /* A view's bytes are read (paged in) now: reported by the chunk, as one matrix can be a
     * large part of the load (Qwen3-8B's lm_head: 1.2 GB of 16). */
    for (size_t at = 0; at < bytes; at += COPY_CHUNK) {
        const size_t n = bytes - at < COPY_CHUNK ? bytes - at : COPY_CHUNK;
        memcpy((char *)dst + at, (const char *)w->data + at, n);
        if (i < 0) ref_progress(m, n, "copying to huge pages");
    }
    ref_release_matrix(m, w->data, bytes);
    w->data = dst;
    m->copied_bytes += bytes;
    return STRATA_OK;
}

int ref_copy_weights(struct reference_model *m) {
    size_t total = 0;
    ref_for_each_matrix(m, 1, count_movable, &total);
    int rc = weight_arena_init(&m->arena, total);
    if (!rc) rc = ref_for_each_matrix(m, 1, move_matrix, NULL);
    return rc;
}
