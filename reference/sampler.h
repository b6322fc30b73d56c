/* Token sampling for users: greedy, temperature, top-k, top-p with a seeded RNG.
 * Greedy returns the first maximal index (torch.argmax semantics, spec §7). */
#ifndef STRATA_REFERENCE_SAMPLER_H
#define STRATA_REFERENCE_SAMPLER_H

#include <stdint.h>

#include "runtime/base/sampling_params.h"

struct sampler {
    struct sampler_params params;
    uint64_t rng_state;
};

void sampler_init(struct sampler *s, const struct sampler_params *p);
/* Picks a token from logits [vocab]; `scratch` (float-aligned, e.g. malloc'd) holds at least vocab
 * floats + vocab ints worth of space (2 * vocab * 4 bytes) or is NULL for greedy. */
int sampler_sample(struct sampler *s, const float *logits, int vocab, void *scratch);
int argmax(const float *x, int n);

/* Greedy over a vocabulary split into contiguous parts in id order (a vocab-parallel LM head:
 * TP rank t holds ids [start_t, start_t + n_t)), without assembling the row: each part
 * reduces its values to one candidate (argmax_part) and argmax_merge picks the winner among
 * the parts' candidates, in part order. The result is exactly argmax() of the whole row,
 * NaN included. argmax() keeps the first maximal index (ties go to the lowest id), a NaN
 * never replaces the best so far, and a NaN at id 0 stays the answer (nothing compares
 * greater than it). So the part holding id 0 reports argmax()'s own pick; a later part its
 * first largest non-NaN value (index -1 when it has none); the merge returns the first part's
 * pick when its value is NaN, else the first candidate strictly greater than every one before
 * it (equal values: the lower part, so the lower id, wins). */
struct argmax_candidate {
    float value;
    int index; /* global id, -1 = none */
};
struct argmax_candidate argmax_part(const float *x, int n, int start);
int argmax_merge(const struct argmax_candidate *c, int parts);
/* Advances the sampler past `steps` sampled tokens without sampling them, as if
 * sampler_sample had run `steps` times (with scratch): one draw per token at temperature
 * > 0, none when greedy. Recovery resumes a request's sampler at step n with it. */
void sampler_skip(struct sampler *s, int steps);

#endif
