/* Bitwise comparison of simulated runs (see compare.h). */
#include "sim/compare.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* Request b (numbered `nb` in messages) against request a (`what`: "baseline" or "its
 * first run"): 1 when they are bit-identical, else 0 and why. */
static int outcome_identical(const struct sim_request_outcome *a,
                             const struct sim_request_outcome *b, int nb, const char *what,
                             char *why, size_t cap) {
    if (a->status != 0) {
        snprintf(why, cap, "request %d failed in the %s: %s", nb, what, a->message);
        return 0;
    }
    if (b->status != 0) {
        snprintf(why, cap, "request %d failed: %s", nb, b->message);
        return 0;
    }
    int n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens;
    for (int s = 0; s < n; s++)
        if (a->tokens[s] != b->tokens[s]) {
            snprintf(why, cap, "request %d: token %d is %d, %s %d", nb, s, (int)b->tokens[s], what,
                     (int)a->tokens[s]);
            return 0;
        }
    if (a->n_tokens != b->n_tokens) {
        snprintf(why, cap, "request %d: %d tokens, %s %d", nb, b->n_tokens, what, a->n_tokens);
        return 0;
    }
    if (!a->logits || !b->logits || a->vocab != b->vocab) {
        snprintf(why, cap, "request %d: logits missing or of another vocabulary", nb);
        return 0;
    }
    for (size_t k = 0; k < (size_t)n * (size_t)a->vocab; k++)
        if (float_bits(a->logits[k]) != float_bits(b->logits[k])) {
            snprintf(
                why, cap, "request %d: logit [step %zu, id %zu] is %.9g (0x%08x), %s %.9g (0x%08x)",
                nb, k / (size_t)a->vocab, k % (size_t)a->vocab, (double)b->logits[k],
                float_bits(b->logits[k]), what, (double)a->logits[k], float_bits(a->logits[k]));
            return 0;
        }
    return 1;
}

int sim_reports_identical(const struct sim_report *baseline, const struct sim_report *run,
                          char *why, size_t cap) {
    if (baseline->num_requests < run->num_requests) {
        snprintf(why, cap, "%d requests but only %d in the baseline", run->num_requests,
                 baseline->num_requests);
        return 0;
    }
    for (int i = 0; i < run->num_requests; i++)
        if (!outcome_identical(&baseline->requests[i], &run->requests[i], i + 1, "baseline", why,
                               cap))
            return 0;
    if (cap) why[0] = '\0';
    return 1;
}

int sim_repeats_identical(const struct sim_report *run, int count, char *why, size_t cap) {
    if (run->num_requests < 2 * count) {
        snprintf(why, cap, "%d requests, not %d and their repeats", run->num_requests, count);
        return 0;
    }
    for (int i = 0; i < count; i++)
        if (!outcome_identical(&run->requests[i], &run->requests[count + i], count + i + 1,
                               "its first run", why, cap))
            return 0;
    if (cap) why[0] = '\0';
    return 1;
}

double sim_logits_max_abs_diff(const struct sim_report *run, int request, const float *reference,
                               int n_steps, int vocab) {
    if (request < 0 || request >= run->num_requests) return -1.0;
    const struct sim_request_outcome *o = &run->requests[request];
    if (!o->logits || o->vocab != vocab) return -1.0;
    int n = o->n_tokens < n_steps ? o->n_tokens : n_steps;
    if (n <= 0) return -1.0;
    double worst = 0.0;
    for (size_t k = 0; k < (size_t)n * (size_t)vocab; k++) {
        double d = fabs((double)o->logits[k] - (double)reference[k]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

int sim_next_turns_identical(const struct sim_report *run, int count, int first_at, int greedy,
                             char *why, size_t cap) {
    if (run->num_requests < first_at + count) {
        snprintf(why, cap, "%d requests, not %d and their next turns", run->num_requests,
                 first_at + count);
        return 0;
    }
    for (int i = 0; i < count; i++) {
        const struct sim_request_outcome *f = &run->requests[i], *t = &run->requests[first_at + i];
        const int nb = first_at + i + 1, a = t->prompt_len - f->prompt_len;
        if (f->status != 0 || t->status != 0) {
            snprintf(why, cap, "request %d or its first turn failed: %s", nb,
                     t->status ? t->message : f->message);
            return 0;
        }
        const int kept = (f->prompt_len + f->n_tokens - 1) / 16, limit = (t->prompt_len - 1) / 16;
        const int want = 16 * (kept < limit ? kept : limit);
        if (t->cached_tokens != want) {
            snprintf(why, cap,
                     "request %d, the next turn of request %d: %d prompt positions from the KV "
                     "cache, not %d (its first turn wrote %d)",
                     nb, i + 1, t->cached_tokens, want, f->prompt_len + f->n_tokens - 1);
            return 0;
        }
        if (!f->logits || !t->logits || f->vocab != t->vocab) {
            snprintf(why, cap, "request %d: logits missing or of another vocabulary", nb);
            return 0;
        }
        const int steps = greedy ? t->n_tokens : 1;
        for (int s = 0; s < steps && a + s < f->n_tokens; s++) {
            if (greedy && t->tokens[s] != f->tokens[a + s]) {
                snprintf(why, cap, "request %d: token %d is %d, its first turn's %d", nb, s,
                         (int)t->tokens[s], (int)f->tokens[a + s]);
                return 0;
            }
            const float *x = t->logits + (size_t)s * (size_t)t->vocab;
            const float *y = f->logits + (size_t)(a + s) * (size_t)f->vocab;
            for (int k = 0; k < t->vocab; k++)
                if (float_bits(x[k]) != float_bits(y[k])) {
                    snprintf(why, cap,
                             "request %d: logit [step %d, id %d] is %.9g, its first turn's "
                             "[step %d] %.9g",
                             nb, s, k, (double)x[k], a + s, (double)y[k]);
                    return 0;
                }
        }
    }
    if (cap) why[0] = '\0';
    return 1;
}
