/* `--weights-dtype q8`: after the loader has placed every matrix (as stored), each one the
 * forward pass multiplies is replaced by a q8 copy (reference/ops_q8.h), quantised on the
 * model's pool. Which matrices: reference/model.h (reference_weights_dtype). The stored
 * matrices are mmapped views (or the loader's own widened copies) and are not read again:
 * ref_release_matrix (model_memory.c) gives their memory back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int check_q8(struct reference_model *m, struct ops_weight *w, const char *what, int layer,
                    void *ctx) {
    (void)m;
    if (w->dtype == OPS_Q8) return STRATA_OK;
    if (!ops_q8_supported(w->cols)) {
        char where[32] = "";
        if (layer >= 0) snprintf(where, sizeof where, " of layer %d", layer);
        return strata_set_error(STRATA_EINVAL,
                                "weights dtype q8: %s%s is [%d, %d]; q8 takes at most %d columns",
                                what, where, w->rows, w->cols, OPS_Q8_MAX_COLS);
    }
    *(size_t *)ctx += weight_arena_round(ops_q8_bytes(w->rows, w->cols));
    return STRATA_OK;
}

static int quantize(struct reference_model *m, struct ops_weight *w, const char *what, int layer,
                    void *ctx) {
    (void)what, (void)layer, (void)ctx;
    if (w->dtype == OPS_Q8) return STRATA_OK;
    size_t bytes = ops_q8_bytes(w->rows, w->cols);
    void *buf = weight_arena_alloc(&m->arena, bytes);
    if (!buf) return strata_set_error(STRATA_ENOMEM, "weights dtype q8: the arena is too small");
    size_t stored = ref_matrix_bytes(w);
    struct ops_weight src = *w;
    /* A loader copy was counted when it was made; a view is paged in now. */
    const int view = m->opt.progress.fn && ref_owned_index(m, w->data) < 0;
    m->q8_replaced_bytes += stored;
    m->q8_bytes += bytes;
    ops_q8_quantize_weight(w, buf, &src, m->pool);
    if (ref_release_matrix(m, src.data, stored)) m->extra_bytes -= stored;
    if (view) ref_progress(m, stored, "quantising to q8");
    return STRATA_OK;
}

/* Routers stay as stored (small, and the top-k choice is the most sensitive step). The
 * q8 copies go to one huge-page-advised arena (reference/weight_arena.h), sized first. */
int ref_quantize_weights(struct reference_model *m) {
    size_t total = 0;
    int rc = ref_for_each_matrix(m, 0, check_q8, &total);
    if (!rc) rc = weight_arena_init(&m->arena, total);
    if (!rc) rc = ref_for_each_matrix(m, 0, quantize, NULL);
    return rc;
}
