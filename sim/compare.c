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

int sim_reports_identical(const struct sim_report *baseline, const struct sim_report *run,
                          char *why, size_t cap) {
    if (baseline->num_requests < run->num_requests) {
        snprintf(why, cap, "%d requests but only %d in the baseline", run->num_requests,
                 baseline->num_requests);
        return 0;
    }
    for (int i = 0; i < run->num_requests; i++) {
        const struct sim_request_outcome *a = &baseline->requests[i], *b = &run->requests[i];
        if (a->status != 0) {
            snprintf(why, cap, "request %d failed in the baseline: %s", i + 1, a->message);
            return 0;
        }
        if (b->status != 0) {
            snprintf(why, cap, "request %d failed: %s", i + 1, b->message);
            return 0;
        }
        int n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens;
        for (int s = 0; s < n; s++)
            if (a->tokens[s] != b->tokens[s]) {
                snprintf(why, cap, "request %d: token %d is %d, baseline %d", i + 1, s,
                         (int)b->tokens[s], (int)a->tokens[s]);
                return 0;
            }
        if (a->n_tokens != b->n_tokens) {
            snprintf(why, cap, "request %d: %d tokens, baseline %d", i + 1, b->n_tokens,
                     a->n_tokens);
            return 0;
        }
        if (!a->logits || !b->logits || a->vocab != b->vocab) {
            snprintf(why, cap, "request %d: logits missing or of another vocabulary", i + 1);
            return 0;
        }
        for (size_t k = 0; k < (size_t)n * (size_t)a->vocab; k++)
            if (float_bits(a->logits[k]) != float_bits(b->logits[k])) {
                snprintf(why, cap,
                         "request %d: logit [step %zu, id %zu] is %.9g (0x%08x), baseline "
                         "%.9g (0x%08x)",
                         i + 1, k / (size_t)a->vocab, k % (size_t)a->vocab, (double)b->logits[k],
                         float_bits(b->logits[k]), (double)a->logits[k], float_bits(a->logits[k]));
                return 0;
            }
    }
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
