/* A request's sampling parameters: how the last stage picks each next token. They belong to
 * the request's description (wire Request, client options), so they live on the ground floor
 * where a client can name them without linking the decoder; reference/sampler.h implements
 * them. */
#ifndef STRATA_RUNTIME_BASE_SAMPLING_PARAMS_H
#define STRATA_RUNTIME_BASE_SAMPLING_PARAMS_H

#include <stdint.h>

struct sampler_params {
    float temperature; /* <= 0 means greedy */
    int top_k;         /* <= 0 means no top-k cut */
    float top_p;       /* >= 1 means no nucleus cut */
    uint64_t seed;
};

#endif
