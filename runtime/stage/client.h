/* Client side of a pipeline: connect to stage 0, submit requests (prompt ids, sampling,
 * max tokens, stop ids), read the streamed tokens, cancel. Several requests may be in
 * flight on one connection; events carry their nonce. Used by strata-client, the
 * integration tests and the demo. */
#ifndef STRATA_RUNTIME_STAGE_CLIENT_H
#define STRATA_RUNTIME_STAGE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/request.h"
#include "wire/auth.h"
#include "wire/message.h"
#include "wire/tls.h"
#include "wire/transport.h"

struct strata_client {
    struct wire_conn conn;
    struct wire_arena arena;
};

/* Connects to stage 0 at host:port and runs the Hello handshake (key may have len 0). */
int client_connect(struct strata_client *client, const char *host, int port,
                   const struct wire_auth_key *key, int timeout_ms);
/* The same over TLS 1.3 when tls is not NULL (wire/tls.h): the TLS handshake first, then
 * the Hello inside it with `key` (NULL = no HMAC; see wire_security_setup). */
int client_connect_tls(struct strata_client *client, const char *host, int port,
                       struct wire_tls *tls, const struct wire_auth_key *key, int timeout_ms);
/* Accepts a zeroed or half-built client. */
void client_close(struct strata_client *client);

/* Sends a Request (request->nonce != 0: nonce 0 is reserved). */
int client_submit(struct strata_client *client, const struct stage_request *request);
int client_cancel(struct strata_client *client, uint64_t nonce);

/* Waits up to timeout_ms for the next token or error of any request on this connection.
 * An Error with nonce 0 comes back as REQUEST_EVENT_CONNECTION_ERROR: stage 0 is closing
 * the connection and every request on it is lost. STRATA_ETIMEOUT when nothing arrived;
 * STRATA_ECLOSED when stage 0 went away. */
int client_next_event(struct strata_client *client, struct request_event *event, int timeout_ms);

/* Recovery when stage 0 itself dies (runtime/stage/stage_recovery.c): the connection closed
 * or failed, and the requests on it are lost at stage 0 but not for the client, which has
 * their prompts and the tokens received so far. Connects again, retrying every 100 ms for
 * up to timeout_ms (a supervisor restarting stage 0 takes a moment); `port_file`, when not
 * NULL, is re-read before each attempt (a restarted stage 0 may listen elsewhere). The
 * client is closed first. STRATA_ETIMEOUT (naming the last failure) when no stage 0 came. */
int client_reconnect(struct strata_client *client, const char *host, int port,
                     const char *port_file, struct wire_tls *tls, const struct wire_auth_key *key,
                     int timeout_ms);
/* Resubmits `request` on the new connection, resuming after the n tokens already received
 * for it (steps 0..n-1, n < max_tokens): stage 0 replays prompt + those tokens, and the
 * events go on from step n with the tokens (and, with a seed, the samples) of an
 * undisturbed run. n = 0 submits it from the start. */
int client_resubmit(struct strata_client *client, const struct stage_request *request,
                    const int32_t *tokens, int n);

/* Ring describe (runtime/stage/stage_describe.c): every stage of the pipeline as it
 * describes itself, in ring order. */
#define CLIENT_MAX_STAGES 64
struct client_stage_info {
    int stage_index, num_stages;
    int layer_start, layer_end; /* owned decoder layers [layer_start, layer_end) */
    int embed, head, vision;    /* roles */
    int tp, kvp;                /* grid degrees (1 = none) */
    int threads, max_seq, max_batch;
    int kv_slots_in_use, queue_depth; /* load when the describe passed the stage */
    int requests_waiting;             /* stage 0: in its admission queue then */
    int kv_blocks, kv_blocks_used;    /* the KV pool (blocks of 16 positions), held then */
    int kv_blocks_reserved;           /* free blocks promised to running requests then */
    int kv_blocks_cached;             /* kept for prefix reuse, held by no request then */
    struct wire_stage_totals totals;  /* stage 0's queue and prefix-cache counters */
    char device[160];                 /* the backend's own words, e.g. "cpu, 4 threads" */
    char weights_dtype[16];           /* "bf16", "q8" */
    char version[64];                 /* "strata X.Y.Z" */
    char next[64];                    /* the link onwards, "host:port" ("" = down) */
    int front; /* the vision stage in front of stage 0 (outside the ring; no decoder layers) */
};
struct client_describe {
    int num_stages;
    struct client_stage_info stages[CLIENT_MAX_STAGES];
};

/* Sends a Control Describe with `nonce` (!= 0, distinct from the requests in flight). */
int client_describe_send(struct strata_client *client, uint64_t nonce);
/* Copies the entries of a received Describe (REQUEST_EVENT_DESCRIBE's frame) into `out`;
 * STRATA_EFORMAT when it is not one or lists more than CLIENT_MAX_STAGES stages. */
int client_describe_read(struct client_describe *out, const uint8_t *frame, size_t len);
/* Sends a Describe and waits up to timeout_ms for its answer, on a connection with no
 * requests in flight (strata-client --describe): the stages, or the Error stage 0 answered
 * (its code and message: a stage or link down), or STRATA_ETIMEOUT. */
int client_describe(struct strata_client *client, struct client_describe *out, int timeout_ms);
/* The stages as a text table, one line per stage after a header (strata-client --describe):
 * stage, layers [a,b), roles, tp x kvp grid, threads, weights dtype, KV slots x positions,
 * build, then the device in the backend's words (free text, last). Truncated to cap. */
void client_describe_table(char *buf, size_t cap, const struct client_describe *d);
/* Stage 0's queue and prefix-cache counters as one line ("" when no entry is stage 0's);
 * apart from the table, whose lines scripts read as rows. */
void client_describe_totals(char *buf, size_t cap, const struct client_describe *d);

#endif
