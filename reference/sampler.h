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
/* Advances the sampler past `steps` sampled tokens without sampling them, as if
 * sampler_sample had run `steps` times (with scratch): one draw per token at temperature
 * > 0, none when greedy. Recovery resumes a request's sampler at step n with it. */
void sampler_skip(struct sampler *s, int steps);

#endif
