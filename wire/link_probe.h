/* A link measured with the stages' own frames: one side echoes, the other sends Activation
 * frames of several sizes over the same TCP (and TLS) connection the stages use and times the
 * round trips. One way = round trip / 2. The link it reports is the performance model's
 * (runtime/model/perf_model.h struct perf_link): latency_us and gbps (gigabytes per second).
 * The latency is the smallest frame's *mean* (rows 0: a token-sized frame, as the ring's
 * returning token; link_probe.c) and every size's mean is reported: a long run pays every
 * stall a lossy link causes (a lost segment that TCP's tail-loss probe does not recover waits
 * for the 200 ms retransmission timeout), which a median hides; the bandwidth comes from the
 * medians, which those rare stalls do not tilt. Used by strata-stage --probe-links (each stage
 * probes its link to the next) and strata-stage-bench probe-link (any two boxes). */
#ifndef STRATA_WIRE_LINK_PROBE_H
#define STRATA_WIRE_LINK_PROBE_H

#include <stddef.h>

#include "wire/transport.h"

#define WIRE_PROBE_MAX_SIZES 8
/* The largest frame a probe sends or echoes (the connections' max_frame). */
#define WIRE_PROBE_MAX_FRAME ((size_t)256 << 20)

struct wire_probe_point {
    int rows;
    double bytes;                   /* the whole frame */
    double mean_us, p50_us, max_us; /* one way */
    int trips;
};

struct wire_probe_result {
    int n;
    struct wire_probe_point pt[WIRE_PROBE_MAX_SIZES];
    /* bandwidth from the least-squares slope of the median one-way time on bytes (where larger
     * frames were not slower: the largest frame's bytes over its median time, a bound below
     * the link's), latency from the smallest frame's mean less its bytes at that bandwidth */
    double latency_us, gbps;
};

/* Echoes every frame (each must be an Activation) back on conn until the peer closes (0) or
 * a frame does not come within idle_ms; *echoed counts them. */
int wire_probe_echo(struct wire_conn *conn, int idle_ms, unsigned long *echoed);

/* latency_us and gbps from r's points (n >= 2; wire_probe_measure calls it), as the struct
 * says. */
void wire_probe_fit(struct wire_probe_result *r);

/* Round trips of frames of rows[i] x hidden f32 rows (0: the token-sized frame), for about
 * `seconds` per size (5 to max_trips of them, after 3 unmeasured), and the fit. */
int wire_probe_measure(struct wire_conn *conn, int hidden, const int *rows, int n_sizes,
                       double seconds, int max_trips, struct wire_probe_result *out);

/* The result as the hosts file's "link" object, with `source` (a sentence, no quotes) and
 * the points; STRATA_ERANGE when it does not fit buf. */
int wire_probe_format(const struct wire_probe_result *r, const char *source, char *buf, size_t cap);

/* "0,1,16,128" into rows [n] (2 to WIRE_PROBE_MAX_SIZES sizes of 0 to 65536 rows); -1 when
 * not. */
int wire_probe_parse_rows(const char *list, int *rows, int *n);

#endif
