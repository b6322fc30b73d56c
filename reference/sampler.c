/* Token sampling (sampler.h): greedy argmax, or temperature -> top-k -> top-p over a
 * softmax, drawn with a seeded splitmix64 generator so a seed replays the same tokens.
 * Candidates are ordered by logit descending, ties by lower token id, so the result does
 * not depend on qsort's stability. */
#include "reference/sampler.h"

#include <math.h>
#include <stdlib.h>

void sampler_init(struct sampler *s, const struct sampler_params *p) {
    s->params = *p;
    s->rng_state = p->seed;
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits. */
static float uniform01(uint64_t *state) {
    return (float)(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
}

static const float *sort_logits; /* qsort has no context argument; single-threaded use */

static int by_logit_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_logits[i] > sort_logits[j]) return -1;
    if (sort_logits[i] < sort_logits[j]) return 1;
    return (i > j) - (i < j);
}

/* Indices of the k largest logits, sorted; a heap-free partial selection keeps this O(V·k)
 * only for small k, so large k falls back to a full sort. */
static int candidates(int *idx, const float *logits, int vocab, int k) {
    for (int i = 0; i < vocab; ++i)
        idx[i] = i;
    sort_logits = logits;
    if (k > 0 && k <= 64) {
        for (int t = 0; t < k; ++t) {
            int best = t;
            for (int i = t + 1; i < vocab; ++i)
                if (by_logit_desc(&idx[i], &idx[best]) < 0) best = i;
            int tmp = idx[t];
            idx[t] = idx[best];
            idx[best] = tmp;
        }
        return k;
    }
    qsort(idx, (size_t)vocab, sizeof *idx, by_logit_desc);
    return k > 0 && k < vocab ? k : vocab;
}

int sampler_sample(struct sampler *s, const float *logits, int vocab, void *scratch) {
    const struct sampler_params *p = &s->params;
    if (p->temperature <= 0.0f || !scratch) return argmax(logits, vocab);
    float *prob = scratch;
    int *idx = (int *)(prob + vocab);
    int n = candidates(idx, logits, vocab, p->top_k < vocab ? p->top_k : vocab);
    /* Softmax over the candidates at temperature T (largest first, so prob[0] = exp(0)). */
    float max = logits[idx[0]], sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        prob[i] = expf((logits[idx[i]] - max) / p->temperature);
        sum += prob[i];
    }
    /* Nucleus: the smallest prefix whose mass reaches top_p (at least one token). */
    if (p->top_p < 1.0f) {
        float mass = 0.0f;
        int keep = n;
        for (int i = 0; i < n; ++i) {
            mass += prob[i] / sum;
            if (mass >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0.0f;
        for (int i = 0; i < n; ++i)
            sum += prob[i];
    }
    float r = uniform01(&s->rng_state) * sum, acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        acc += prob[i];
        if (r < acc) return idx[i];
    }
    return idx[n - 1];
}
