/* Greedy ids straight from the LM head (reference_logits_argmax, model.h): the vocab-parallel
 * argmax tensor parallelism uses. Under TP the logits are never assembled: each rank reduces its
 * own vocabulary rows to one candidate per row (the largest value, its lowest id) and only those
 * pairs are all-gathered, 2 floats per row and rank instead of V / T; the winner is chosen
 * by reference/sampler.h's argmax_merge, which gives exactly argmax() of the whole row (the
 * sampler's greedy rule, ties to the lowest id). Each logit is the same whole dot product as
 * in reference_logits, so the ids equal argmax(reference_logits(...)) bit for bit.
 *
 * Kept beside, not inside, model.c: it touches only the final norm, the LM head and the
 * logit scratch (its own slice of struct reference_model). */
#include <string.h>

#include "reference/model_internal.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"

/* Ids travel as floats in the all-gather: exact below 2^24. */
#define ARGMAX_MAX_VOCAB (1 << 24)

/* logit_part holds [n, H] normed rows, [n, Vt] local logits, then [tp + 1][n][2] pairs. */
static int head_scratch(struct reference_model *m, size_t rows, size_t Vt, size_t T) {
    const size_t need = rows * (size_t)m->cfg.hidden_size + rows * Vt + (T + 1) * rows * 2;
    if (need <= m->cap_logit_part) return STRATA_OK;
    float *grown = realloc(m->logit_part, need * sizeof(float));
    if (!grown)
        return strata_set_error(STRATA_ENOMEM, "reference_logits_argmax: no memory for %zu rows",
                                rows);
    m->logit_part = grown;
    m->cap_logit_part = need;
    return STRATA_OK;
}

int reference_logits_argmax(struct reference_model *m, int32_t *ids, const float *hidden, int n) {
    if (!m->opt.with_head)
        return strata_set_error(STRATA_EINVAL,
                                "reference_logits_argmax: this model does not own the head");
    if (n < 0) return strata_set_error(STRATA_EINVAL, "reference_logits_argmax: %d rows", n);
    if (n == 0) return STRATA_OK;
    if (!ids || !hidden)
        return strata_set_error(STRATA_EINVAL, "reference_logits_argmax: NULL buffer");
    const int T = m->tp > 1 ? m->tp : 1, H = m->cfg.hidden_size;
    const size_t rows = (size_t)n, Vt = (size_t)m->vocab_n;
    if (m->cfg.vocab_size >= ARGMAX_MAX_VOCAB)
        return strata_set_error(STRATA_EINVAL, "reference_logits_argmax: vocabulary of %d ids",
                                m->cfg.vocab_size);
    int rc = head_scratch(m, rows, Vt, (size_t)T);
    if (rc) return rc;
    float *norm = m->logit_part, *local = norm + rows * (size_t)H, *all = local + rows * Vt;
    float *mine = all + (size_t)T * rows * 2;
    rmsnorm(norm, hidden, m->final_norm, m->cfg.rms_norm_eps, n, H);
    matmul(local, norm, &m->lm_head, n, m->pool);
    if (T == 1) {
        for (size_t i = 0; i < rows; ++i)
            ids[i] = argmax(local + i * Vt, (int)Vt);
        return STRATA_OK;
    }
    for (size_t i = 0; i < rows; ++i) {
        struct argmax_candidate c = argmax_part(local + i * Vt, (int)Vt, m->vocab_start);
        mine[2 * i] = c.value;
        mine[2 * i + 1] = (float)c.index;
    }
    if ((rc = m->opt.coll.allgather(m->opt.coll.ctx, all, mine, rows * 2))) return rc;
    for (size_t i = 0; i < rows; ++i) {
        struct argmax_candidate c[GRID_MAX_DEGREE];
        for (int t = 0; t < T; ++t) /* rank t's pair of row i; ranks hold the ids in order */
            c[t] = (struct argmax_candidate){all[((size_t)t * rows + i) * 2],
                                             (int)all[((size_t)t * rows + i) * 2 + 1]};
        ids[i] = argmax_merge(c, T);
    }
    return STRATA_OK;
}
