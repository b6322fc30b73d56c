/* Token sampling (sampler.h): greedy argmax, or temperature -> top-k -> top-p over a
 * softmax, drawn with a seeded splitmix64 generator so a seed replays the same tokens.
 * Candidates are ordered by logit descending, ties by lower token id, so the result does
 * not depend on qsort's stability. No global state: samplers on different threads are
 * independent. */
#include "reference/sampler.h"

#include <math.h>
#include <stdlib.h>

void sampler_init(struct sampler *s, const struct sampler_params *p) {
    s->params = *p;
    s->rng_state = p->seed;
}

/* The best value stays in a register: comparing with x[best] re-read the array through the
 * index every step (a load on the loop-carried chain, ~7 cycles an element: 0.5 ms per token
 * over a 151936-entry vocabulary). Same result, NaN included: nothing compares greater than
 * a NaN x[0], and a later NaN never compares greater. */
int argmax(const float *x, int n) {
    int best = 0;
    float bv = x[0];
    for (int i = 1; i < n; ++i)
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    return best;
}

struct argmax_candidate argmax_part(const float *x, int n, int start) {
    if (start == 0) {
        const int i = argmax(x, n);
        return (struct argmax_candidate){x[i], i};
    }
    int best = -1;
    for (int i = 0; i < n; ++i)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? (struct argmax_candidate){0.0f, -1}
                    : (struct argmax_candidate){x[best], start + best};
}

int argmax_merge(const struct argmax_candidate *c, int parts) {
    if (isnan(c[0].value)) return c[0].index; /* argmax() of a row starting with NaN: id 0 */
    int best = 0;
    for (int p = 1; p < parts; ++p)
        if (c[p].index >= 0 && c[p].value > c[best].value) best = p;
    return c[best].index;
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sampler_skip(struct sampler *s, int steps) {
    /* sampler_sample draws exactly one splitmix64 value per token at temperature > 0. */
    if (s->params.temperature <= 0.0f || steps <= 0) return;
    for (int i = 0; i < steps; ++i)
        (void)splitmix64(&s->rng_state);
}

/* Uniform in [0, 1) with 24 random bits. */
static float uniform01(uint64_t *state) {
    return (float)(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
}

/* A candidate token; `value` holds its logit, then its unnormalised probability. The
 * scratch buffer (2 * vocab * 4 bytes) holds exactly `vocab` of these. */
struct candidate {
    float value;
    int id;
};

static int by_logit_desc(const void *a, const void *b) {
    const struct candidate *x = a, *y = b;
    if (x->value > y->value) return -1;
    if (x->value < y->value) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Orders the k best candidates first (all of them when k <= 0 or k >= vocab) and returns
 * how many are kept. Small k uses a selection pass instead of a full sort. */
static int rank_candidates(struct candidate *c, const float *logits, int vocab, int k) {
    for (int i = 0; i < vocab; ++i)
        c[i] = (struct candidate){logits[i], i};
    if (k > 0 && k <= 64 && k < vocab) {
        for (int t = 0; t < k; ++t) {
            int best = t;
            for (int i = t + 1; i < vocab; ++i)
                if (by_logit_desc(&c[i], &c[best]) < 0) best = i;
            struct candidate tmp = c[t];
            c[t] = c[best];
            c[best] = tmp;
        }
        return k;
    }
    qsort(c, (size_t)vocab, sizeof *c, by_logit_desc);
    return k > 0 && k < vocab ? k : vocab;
}

int sampler_sample(struct sampler *s, const float *logits, int vocab, void *scratch) {
    const struct sampler_params *p = &s->params;
    if (p->temperature <= 0.0f || !scratch) return argmax(logits, vocab);
    struct candidate *c = scratch;
    int n = rank_candidates(c, logits, vocab, p->top_k);
    /* Softmax over the candidates at temperature T (largest first, so c[0] gets exp(0)). */
    float max = c[0].value, sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        c[i].value = expf((c[i].value - max) / p->temperature);
        sum += c[i].value;
    }
    /* Nucleus: the smallest prefix whose mass reaches top_p (at least one token). */
    if (p->top_p < 1.0f) {
        float mass = 0.0f;
        int keep = n;
        for (int i = 0; i < n; ++i) {
            mass += c[i].value / sum;
            if (mass >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0.0f;
        for (int i = 0; i < n; ++i)
            sum += c[i].value;
    }
    float r = uniform01(&s->rng_state) * sum, acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        acc += c[i].value;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}
