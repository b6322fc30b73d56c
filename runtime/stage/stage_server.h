/* The TCP driver of one pipeline stage (the event loop of strata-stage).
 *
 * Around an I/O-free stage core (stage_core.h) it keeps:
 *   - a listening socket served by an acceptor thread, which runs the TLS handshake (when
 *     opt->tls is set; wire/tls.h) and then the Hello handshake inside it (wire/auth.h)
 *     on each new connection, all of them concurrently under deadlines, per-address caps
 *     and a failed-handshake rate limit (stage_accept.h), and hands it to the loop: the
 *     upstream stage (stage r-1; for stage 0 the last stage closing the ring) and, on
 *     stage 0, any number of clients and vision stages (Hello role Vision: served as
 *     clients, with 1 GiB frames and their VisionBlocks assembled; stage_server_vision.h);
 *   - one persistent connection to the next stage (for the last stage: stage 0), made by
 *     a connector thread and re-made with exponential backoff (50 ms .. 0.5 s) whenever it
 *     drops.
 * An event loop (runtime/base/event_loop.h: a file event per link, timers for keepalive,
 * stalled peers and recovery) reads frames, feeds the core, runs one microbatch when there
 * is work and sends what the core queued. A connection that closes, resets or times out
 * is reported to the core, which fails every affected request with an Error that travels
 * to the client; new requests are served again once the neighbour is back.
 * The acceptor and connector threads only handshake; every core call happens on the
 * loop's thread, which never waits on one peer: reads are non-blocking with a partial
 * frame kept per connection, and frames to clients are queued (wire_send_frame_nb), as are
 * the last stage's frames to stage 0 (one link of the ring that never waits, so stages
 * sending large frames - KV blocks - round the ring cannot all wait on each other). */
#ifndef STRATA_RUNTIME_STAGE_STAGE_SERVER_H
#define STRATA_RUNTIME_STAGE_STAGE_SERVER_H

#include <signal.h>
#include <stdint.h>

#include "runtime/base/log.h"
#include "runtime/stage/stage_core.h"
#include "wire/auth.h"
#include "wire/tls.h"

struct coll; /* wire/collective.h */

/* The stage's names for the logger's levels (runtime/base/log.h), as --log-level sets them. */
enum stage_log_level {
    STAGE_LOG_ERROR = STRATA_LOG_ERROR,
    STAGE_LOG_WARN = STRATA_LOG_WARN,
    STAGE_LOG_INFO = STRATA_LOG_INFO,
    STAGE_LOG_DEBUG = STRATA_LOG_DEBUG
};

struct stage_server_options {
    const char *listen_host;         /* NULL = 127.0.0.1 */
    int listen_port;                 /* 0 = any free port */
    const char *port_file;           /* if set, the bound port is written here */
    const char *next_host;           /* NULL = 127.0.0.1 */
    int next_port;                   /* used when next_port_file is NULL */
    const char *next_port_file;      /* re-read before every connect attempt */
    struct wire_tls *tls;            /* NULL = plaintext links; else TLS 1.3 on every link */
    const struct wire_auth_key *key; /* the Hello's HMAC key (NULL/len 0 = none) */
    uint8_t fingerprint[WIRE_FINGERPRINT_BYTES];
    int recv_kv;             /* accept KvBlocks from upstream */
    const char *kv_out_path; /* write received KvBlocks here */
    const char *out_path;    /* last stage: tokens + logits of finished requests */
    enum stage_log_level log_level;
    int io_timeout_ms;    /* send / receive-a-started-frame limit; 0 = 5000 */
    int step_delay_ms;    /* testing: sleep before each microbatch (a slow device) */
    int stage_stats;      /* log the time breakdown once a second while working */
    int peer_timeout_ms;  /* a stage link silent this long is dead (pings keep it alive); 0 = off */
    int drain_timeout_ms; /* on stop: finish in-flight requests for at most this; 0 = none */
    /* Standby (recovery, runtime/stage/stage_recovery.c): a second process for the same
     * stage, weights loaded, that waits while listen_port is taken (the primary serves it)
     * and takes the port over the moment it is free, so the ring re-forms without a cold
     * start. Needs a fixed listen_port. */
    int standby;
    /* A TP / KVP leader's group (stage_tp.h), or NULL: after each finished request its
     * collective counters so far are logged ("group collectives: all-reduce N calls ...",
     * wire/collective.h coll_stats), which `./strata bench tp` reads per token. */
    const struct coll *group;
};

/* Runs until *stop becomes non-zero (signal handler), then drains: stops accepting,
 * refuses new requests with an Error and serves the ones in flight to their end for at
 * most drain_timeout_ms (*stop >= 2, a second signal, cuts it short). Returns 0, or a
 * negative status when the stage cannot run at all (listen failed). */
int stage_server_run(struct stage_core *core, const struct stage_server_options *opt,
                     volatile sig_atomic_t *stop);

/* Writes a finished request's generated ids (I32 [n]) and logits (F32 [n, V], when kept)
 * to a safetensors file, atomically (temp file + rename). */
int stage_write_out(const char *path, const struct stage_result *result);

/* Sets up the process logger (strata_log, runtime/base/log.h) for stage `stage_index`:
 * lines read "[stage r SECS.MS] level: message" and print when level <= `level`. */
void stage_log_setup(int stage_index, enum stage_log_level level);

#endif
