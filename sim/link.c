/* Simulated reliable link (see link.h). All randomness comes from a per-link splitmix64
 * stream, drawn in a fixed order per send (one loss draw per attempt, then one jitter draw
 * for the successful attempt), so times depend only on the seed and the sends. */
#include "sim/link.h"

#include <math.h>
#include <string.h>

#include "runtime/base/status.h"

static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform double in [0, 1) from the top 53 bits. */
static double uniform01(uint64_t *state) {
    return (double)(splitmix64_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

void sim_link_params_default(struct sim_link_params *params) {
    memset(params, 0, sizeof *params);
    params->retransmit_timeout_ns = 200 * 1000 * 1000;
    params->max_retransmits = 6;
}

int sim_link_params_check(const struct sim_link_params *params) {
    if (params->latency_ns < 0)
        return strata_set_error(STRATA_EINVAL, "link: latency must be >= 0 (got %lld ns)",
                                (long long)params->latency_ns);
    if (params->jitter_ns < 0)
        return strata_set_error(STRATA_EINVAL, "link: jitter must be >= 0 (got %lld ns)",
                                (long long)params->jitter_ns);
    if (!isfinite(params->bandwidth_gbps))
        return strata_set_error(STRATA_EINVAL, "link: bandwidth must be finite");
    if (!(params->loss >= 0.0 && params->loss <= 1.0))
        return strata_set_error(STRATA_EINVAL, "link: loss must be in [0, 1] (got %g)",
                                params->loss);
    if (params->max_retransmits < 0 || params->max_retransmits > 30)
        return strata_set_error(STRATA_EINVAL, "link: max_retransmits must be in [0, 30] (got %d)",
                                params->max_retransmits);
    if (params->retransmit_timeout_ns <= 0)
        return strata_set_error(STRATA_EINVAL, "link: retransmit timeout must be > 0 (got %lld ns)",
                                (long long)params->retransmit_timeout_ns);
    return 0;
}

int sim_link_init(struct sim_link *link, const struct sim_link_params *params, uint64_t seed) {
    memset(link, 0, sizeof *link);
    int rc = sim_link_params_check(params);
    if (rc < 0) return rc;
    link->params = *params;
    link->rng_state = seed;
    return 0;
}

void sim_link_partition(struct sim_link *link, int64_t start_ns, int64_t end_ns) {
    link->partition_start_ns = start_ns;
    link->partition_end_ns = end_ns > start_ns ? end_ns : start_ns;
}

void sim_link_close(struct sim_link *link, int64_t at_ns) {
    if (link->closed && link->closed_at_ns <= at_ns) return;
    link->closed = 1;
    link->closed_at_ns = at_ns;
}

int64_t sim_link_serialisation_ns(const struct sim_link_params *params, size_t bytes) {
    if (params->bandwidth_gbps <= 0.0) return 0;
    /* bits / (gbps * 1e9 bits/s) seconds = bits / gbps ns; round up to a whole ns. */
    return (int64_t)ceil((double)bytes * 8.0 / params->bandwidth_gbps);
}

static int partitioned(const struct sim_link *link, int64_t t) {
    return t >= link->partition_start_ns && t < link->partition_end_ns;
}

int sim_link_send(struct sim_link *link, int64_t *arrival_ns, int64_t now_ns, size_t bytes) {
    const struct sim_link_params *p = &link->params;
    if (link->closed && link->closed_at_ns <= now_ns) {
        *arrival_ns = now_ns;
        return strata_set_error(STRATA_ECLOSED, "link: connection closed by peer at %lld ns",
                                (long long)link->closed_at_ns);
    }
    int64_t serialise = sim_link_serialisation_ns(p, bytes);
    int64_t start = now_ns > link->line_free_ns ? now_ns : link->line_free_ns;
    link->line_free_ns = start + serialise;
    link->busy_ns += serialise;

    int64_t attempt_at = start;
    int64_t backoff = p->retransmit_timeout_ns;
    for (int retry = 0;; retry++) {
        int lost = partitioned(link, attempt_at);
        /* Draw for every attempt, partition or not, so a partition does not shift the
         * PRNG stream of the frames after it. */
        double draw = uniform01(&link->rng_state);
        if (!lost && p->loss > 0.0 && draw < p->loss) lost = 1;
        if (!lost) break;
        if (retry == p->max_retransmits) {
            *arrival_ns = attempt_at + serialise + backoff;
            return strata_set_error(STRATA_ETIMEOUT,
                                    "link: peer unreachable, %d retransmissions lost "
                                    "(gave up at %lld ns)",
                                    retry, (long long)*arrival_ns);
        }
        link->retransmits++;
        attempt_at += serialise + backoff;
        if (backoff < INT64_MAX / 2) backoff *= 2;
    }
    int64_t jitter = 0;
    if (p->jitter_ns > 0)
        jitter = (int64_t)(splitmix64_next(&link->rng_state) % (uint64_t)(p->jitter_ns + 1));
    int64_t arrival = attempt_at + serialise + p->latency_ns + jitter;
    if (arrival < link->last_arrival_ns) arrival = link->last_arrival_ns;
    link->last_arrival_ns = arrival;
    link->frames++;
    link->bytes += bytes;
    *arrival_ns = arrival;
    return 0;
}
