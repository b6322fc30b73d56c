/* A simulated one-way network link between two stages (or a stage and the client).
 *
 * Models a reliable, in-order byte stream such as a TCP connection, on the virtual clock:
 *   - serialisation: a frame occupies the sender's line for bytes*8 / bandwidth; frames
 *     queue behind each other (the line is busy until the previous frame is out);
 *   - propagation: a fixed one-way latency plus a per-frame jitter drawn uniformly from
 *     [0, jitter] by the link's own seeded PRNG;
 *   - loss: each transmission attempt is lost with probability `loss`; a lost frame is
 *     resent after a retransmission timeout that doubles on every retry (TCP backoff).
 *     After `max_retransmits` lost retries the sender gives up: the peer is unreachable;
 *   - partition: during [start, end) every attempt is lost, so a partition longer than
 *     the retry budget makes the peer unreachable (STRATA_ETIMEOUT at the give-up time);
 *   - close: after a stage is killed its links are closed; a send on a closed link fails
 *     with STRATA_ECLOSED (the peer's kernel resets the connection).
 * Delivery is in order: a frame never arrives before the frame sent ahead of it.
 *
 * Deterministic: the same parameters, seed and sequence of sends give the same times. */
#ifndef STRATA_SIM_LINK_H
#define STRATA_SIM_LINK_H

#include <stddef.h>
#include <stdint.h>

struct sim_link_params {
    int64_t latency_ns;            /* one-way propagation delay */
    double bandwidth_gbps;         /* line rate in 1e9 bits/s; <= 0 means unlimited */
    int64_t jitter_ns;             /* extra delay per frame, uniform in [0, jitter_ns] */
    double loss;                   /* probability a transmission attempt is lost, [0, 1] */
    int64_t retransmit_timeout_ns; /* first retry delay after a loss (> 0 if loss > 0) */
    int max_retransmits;           /* lost retries before the sender gives up (>= 0) */
};

struct sim_link {
    struct sim_link_params params;
    uint64_t rng_state;         /* splitmix64 state for jitter and loss draws */
    int64_t line_free_ns;       /* when the sender's line finishes the previous frame */
    int64_t last_arrival_ns;    /* arrival of the previous frame (in-order delivery) */
    int64_t partition_start_ns; /* attempts in [start, end) are lost; start == end: none */
    int64_t partition_end_ns;
    int closed; /* 1 once close() was called */
    int64_t closed_at_ns;
    /* Statistics. */
    uint64_t frames;      /* frames delivered */
    uint64_t bytes;       /* bytes delivered */
    uint64_t retransmits; /* lost attempts that were retried */
    int64_t busy_ns;      /* total serialisation time */
};

/* Default parameters: 0 latency, unlimited bandwidth, no jitter, no loss, 200 ms first
 * retransmission timeout (Linux's minimum RTO) and 6 retries (~25 s before giving up). */
void sim_link_params_default(struct sim_link_params *params);

/* Checks the parameters; a message names the bad field. */
int sim_link_params_check(const struct sim_link_params *params);

/* Prepares a link; `seed` selects its PRNG stream (give each link its own seed). */
int sim_link_init(struct sim_link *link, const struct sim_link_params *params, uint64_t seed);

/* Makes every transmission attempt in [start_ns, end_ns) fail (end_ns may be INT64_MAX). */
void sim_link_partition(struct sim_link *link, int64_t start_ns, int64_t end_ns);

/* Closes the link at `at_ns` (its sender or receiver died): later sends fail. */
void sim_link_close(struct sim_link *link, int64_t at_ns);

/* Sends a frame of `bytes` at virtual time `now_ns`.
 * Returns 0 and sets *arrival_ns to when the receiver has the whole frame;
 * STRATA_ETIMEOUT when every attempt was lost (the sender gives up at *arrival_ns, the
 * time the stage would learn the peer is unreachable); STRATA_ECLOSED when the link was
 * closed at or before now_ns (*arrival_ns = now_ns). */
int sim_link_send(struct sim_link *link, int64_t *arrival_ns, int64_t now_ns, size_t bytes);

/* Serialisation delay of `bytes` at the link's bandwidth, in ns (0 when unlimited). */
int64_t sim_link_serialisation_ns(const struct sim_link_params *params, size_t bytes);

#endif
