/* The accepting side of a stage: every new connection's TLS and Hello handshakes, run
 * concurrently and under limits so that no outsider can keep a real peer out.
 *
 * Why one thread with an event loop (runtime/base/event_loop.h, the stage's own loop
 * module: a file event per pending handshake, a timer per deadline) rather than a pool of
 * handshake threads: a handshake is almost all waiting (on the peer's next bytes), so a
 * thread per handshake would need as many threads as an attacker opens connections (1,000
 * idle ones, say) to keep a real peer's handshake from queueing behind them. One loop that
 * watches every pending handshake advances each the moment its bytes arrive, costs a slot
 * (a few KiB) per connection, and bounds everything with plain counters. Why not the
 * stage's own loop: a handshake's CPU work (below) would then delay the frames of the
 * requests in flight, and a flood of handshakes would delay them by as much. The TLS handshake runs
 * non-blocking (wire_tls_start / wire_tls_step), the Hello's frames are received with
 * wire_recv_frame_nb under WIRE_HANDSHAKE_MAX_FRAME. The handshake CPU work (a TLS-PSK or
 * certificate handshake: ~0.3 ms) is short; a failing address is cut off before it costs
 * any (rate limit below).
 *
 * Limits (each counted, logged and tested in tests/runtime/stage):
 *   - a deadline per handshake (handshake_timeout_ms, from the accept): a silent or
 *     trickling peer is dropped when it passes, whatever it sends;
 *   - at most max_handshakes at once, and at most max_per_address from one source address
 *     (so one host cannot fill the table for the others). A newcomer beyond a cap takes the
 *     place of the pending handshake that has come least far (nothing received < some
 *     bytes < a whole first flight taken, the peer answering < TLS done), the oldest of
 *     those, unless that one is further along than the newcomer (judged by the bytes
 *     already waiting on its socket) and younger than a grace of 250 ms: then the newcomer
 *     is turned away. On a TLS listener the kernel holds a connection until its first bytes
 *     arrive (TCP_DEFER_ACCEPT, 1 s), so a flood of silent connections, reconnecting as
 *     fast as they are dropped, reaches the table late and below any real peer, whose
 *     ClientHello is waiting when it is accepted. (A plaintext Hello starts with the
 *     server's, so there a newcomer is never turned away: the least far along goes);
 *   - failed handshakes (TLS refused, wrong key, bad Hello: not timeouts, not replaced
 *     ones, not peers that only closed) are rate-limited per address with a token bucket
 * (fail_burst, refilled at fail_per_s): an address without tokens has its connections closed at
 * accept, before any TLS work, and one summary line per address per 10 s says how many. Library
 * code: logs through runtime/base/log, never prints. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_ACCEPT_H
#define STRATA_RUNTIME_STAGE_STAGE_ACCEPT_H

#include <stdatomic.h>
#include <stdint.h>

#include "wire/auth.h"
#include "wire/tls.h"
#include "wire/transport.h"

/* ---- per-address accounting (exposed for its unit test) ---- */

#define STAGE_ADDR_LEN 48 /* an IPv6 address in text */

struct stage_addr_entry {
    char addr[STAGE_ADDR_LEN]; /* "" = free */
    int handshaking;           /* handshakes in progress from this address */
    double tokens;             /* failed handshakes still allowed now */
    int64_t refill_ms;         /* when tokens were last refilled */
    int64_t used_ms;           /* last connection (to reuse the stalest entry) */
    uint64_t failed, dropped;  /* since the last summary line */
    int64_t summary_ms;        /* when the last summary line went out (0: none yet) */
};

struct stage_addr_table {
    struct stage_addr_entry *entries; /* [capacity] */
    int capacity;
    int fail_burst;    /* bucket size */
    double fail_per_s; /* refill rate */
};

int stage_addr_table_init(struct stage_addr_table *t, int capacity, int fail_burst,
                          double fail_per_s);
void stage_addr_table_free(struct stage_addr_table *t);
/* The entry of `addr` (a peer's "host:port" or "host"; the port is ignored), made or
 * recycled (the stalest entry without handshakes) when new; NULL when every entry has a
 * handshake in progress. */
struct stage_addr_entry *stage_addr_lookup(struct stage_addr_table *t, const char *peer,
                                           int64_t now_ms);
/* 1 when the address may start a handshake (it has a token left for a failure). */
int stage_addr_allowed(struct stage_addr_table *t, struct stage_addr_entry *e, int64_t now_ms);
/* Spends a token for a failed handshake. */
void stage_addr_failed(struct stage_addr_table *t, struct stage_addr_entry *e, int64_t now_ms);

/* ---- the acceptor ---- */

struct stage_accept_options {
    struct wire_listener *listener;  /* borrowed; closed by stage_accept_run on close_listener */
    struct wire_tls *tls;            /* NULL = plaintext */
    const struct wire_auth_key *key; /* the Hello's HMAC key (NULL = none) */
    struct wire_hello self;          /* this stage's Hello */
    int handshake_timeout_ms;        /* 0 = 3000 */
    int max_handshakes;              /* 0 = 256 */
    int max_per_address;             /* 0 = 32 */
    int fail_burst;                  /* 0 = 10 */
    double fail_per_s;               /* 0 = 2 */
};

/* Called on the acceptor thread for each connection whose handshakes succeeded: takes
 * ownership of *conn (its max_frame is still WIRE_HANDSHAKE_MAX_FRAME: the taker raises
 * it for the role it adopts). */
typedef void (*stage_accept_deliver)(void *ctx, struct wire_conn *conn,
                                     const struct wire_hello *peer);

/* Runs until *stop is set (checked at least every 100 ms). When *close_listener is set it
 * closes the listener and drops every pending handshake (a draining stage accepts nothing
 * new) and goes on idling until *stop. Returns 0, or STRATA_ENOMEM at start. */
int stage_accept_run(const struct stage_accept_options *opt, stage_accept_deliver deliver,
                     void *ctx, atomic_int *stop, atomic_int *close_listener);

#endif
