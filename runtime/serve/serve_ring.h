/* The ring as the fronts last saw it, and which stage stopped answering when it breaks.
 *
 * A describe round the ring (serve_engine_describe) lists every stage while the ring is whole;
 * once it breaks, stage 0 can say only that the describe did not come back (a stage further
 * down dropped it) or that one of its own links is down. So the front keeps the last whole
 * answer and, when a describe fails, checks each stage it knew by connecting to the address
 * the stage before it dialled (its `next`; stage 0 is the front's own stage-0 address): a
 * refused or silent connect marks that stage down with the reason, the others stay known but
 * unconfirmed. A TCP connect that closes without a handshake costs a stage nothing (its
 * acceptor logs it at debug level and counts no failure), and the probes run only when the
 * describe has already failed. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_RING_H
#define STRATA_RUNTIME_SERVE_SERVE_RING_H

#include <pthread.h>

#include "runtime/serve/serve_engine.h"
#include "runtime/serve/serve_json.h"

struct serve_ring {
    pthread_mutex_t mu;
    int have_last;
    struct client_describe last; /* the last whole answer */
};

/* How long one probe's connect may take: a dead host's address drops SYNs silently. */
#define SERVE_RING_PROBE_MS 300

void serve_ring_init(struct serve_ring *r);
void serve_ring_free(struct serve_ring *r);

/* A describe within timeout_ms. 0: *out is the ring, every status up. Else the describe's
 * status, with *out the last whole ring (num_stages 0 when none was seen) and status[i] each
 * stage's state from the probes. */
int serve_ring_describe(struct serve_ring *r, struct serve_engine *e, int timeout_ms,
                        struct client_describe *out,
                        struct serve_stage_status status[CLIENT_MAX_STAGES]);

/* "host:port" split for a probe; STRATA_EINVAL when it is not one (exposed for its test). */
int serve_ring_parse_address(const char *address, char *host, size_t host_cap, int *port);

#endif
