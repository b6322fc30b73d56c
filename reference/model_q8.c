/* `--weights-dtype q8`: after the loader has placed every matrix (as stored), each one the
 * forward pass multiplies is replaced by a q8 copy (reference/ops_q8.h), quantised on the
 * model's pool. Which matrices: reference/model.h (reference_weights_dtype). The stored
 * matrices are mmapped views (or the loader's own widened copies) and are not read again:
 * release_stored gives their memory back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "reference/model_internal.h"
#include "reference/ops_q8.h"
#include "runtime/base/status.h"

int reference_weights_dtype_parse(enum reference_weights_dtype *out, const char *name) {
    if (name && strcmp(name, "bf16") == 0) {
        *out = REFERENCE_WEIGHTS_STORED;
        return STRATA_OK;
    }
    if (name && strcmp(name, "q8") == 0) {
        *out = REFERENCE_WEIGHTS_Q8;
        return STRATA_OK;
    }
    return strata_set_error(STRATA_EINVAL, "weights dtype '%s': expected bf16 or q8",
                            name ? name : "(null)");
}

const char *reference_weights_dtype_name(enum reference_weights_dtype dtype) {
    return dtype == REFERENCE_WEIGHTS_Q8 ? "q8" : "bf16";
}

size_t reference_model_q8_bytes(const struct reference_model *m, size_t *replaced) {
    if (replaced) *replaced = m->q8_replaced_bytes;
    return m->q8_bytes;
}

/* A heap buffer released by reference_model_free (the loader's list of owned copies). */
static void *own(struct reference_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = malloc(bytes);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

/* The stored matrix `w` is no longer read: a copy made at load is freed; a view of the
 * mmapped checkpoint (PROT_READ, MAP_PRIVATE: never written) has its whole pages dropped
 * from this process with MADV_DONTNEED, so the q8 copy replaces it in the resident set too
 * (a later read, e.g. the embedding's row gather of a tied head, faults them back in from
 * the file: the contents cannot change). */
static void release_stored(struct reference_model *m, const struct ops_weight *w, size_t bytes) {
    for (int i = 0; i < m->n_owned; ++i)
        if (m->owned[i] == w->data) {
            if (w->data == m->embed.data) return; /* a tied head's f32 copy: still gathered */
            free(m->owned[i]);
            m->owned[i] = NULL;
            m->extra_bytes -= bytes;
            return;
        }
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t begin = (uintptr_t)w->data, end = begin + bytes;
    uintptr_t first = (begin + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t last = end & ~((uintptr_t)page - 1);
    if (last > first) madvise((void *)first, last - first, MADV_DONTNEED); /* advisory */
}

static int quantize(struct reference_model *m, struct ops_weight *w, const char *what, int layer) {
    if (!w->data || w->dtype == OPS_Q8) return STRATA_OK;
    if (!ops_q8_supported(w->cols)) {
        char where[32] = "";
        if (layer >= 0) snprintf(where, sizeof where, " of layer %d", layer);
        return strata_set_error(STRATA_EINVAL,
                                "weights dtype q8: %s%s is [%d, %d]; q8 takes at most %d columns",
                                what, where, w->rows, w->cols, OPS_Q8_MAX_COLS);
    }
    size_t bytes = ops_q8_bytes(w->rows, w->cols);
    void *buf = own(m, bytes);
    if (!buf) return strata_set_error(STRATA_ENOMEM, "weights dtype q8: out of memory");
    size_t stored = (size_t)w->rows * (size_t)w->cols * (w->dtype == OPS_BF16 ? 2u : sizeof(float));
    struct ops_weight src = *w;
    m->q8_replaced_bytes += stored;
    m->q8_bytes += bytes;
    ops_q8_quantize_weight(w, buf, &src, m->pool);
    release_stored(m, &src, stored);
    return STRATA_OK;
}

static int quantize_layer(struct reference_model *m, struct layer_weights *L) {
    struct {
        struct ops_weight *w;
        const char *what;
    } mats[] = {{&L->q, "q_proj"},      {&L->k, "k_proj"},       {&L->v, "v_proj"},
                {&L->o, "o_proj"},      {&L->gate, "gate_proj"}, {&L->up, "up_proj"},
                {&L->down, "down_proj"}};
    int rc = STRATA_OK;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0] && !rc; ++i)
        rc = quantize(m, mats[i].w, mats[i].what, L->index);
    for (int e = 0; L->is_moe && e < m->cfg.num_experts && !rc; ++e)
        if (!(rc = quantize(m, &L->expert_gate[e], "an expert's gate_proj", L->index)) &&
            !(rc = quantize(m, &L->expert_up[e], "an expert's up_proj", L->index)))
            rc = quantize(m, &L->expert_down[e], "an expert's down_proj", L->index);
    return rc;
}

int ref_quantize_weights(struct reference_model *m) {
    int rc = STRATA_OK;
    for (int l = 0; l < m->n_layers && !rc; ++l)
        rc = quantize_layer(m, &m->layers[l]);
    /* A tied head is a copy of the embedding's struct: only the head becomes q8. */
    if (!rc && m->opt.with_head) rc = quantize(m, &m->lm_head, "lm_head", -1);
    return rc;
}
