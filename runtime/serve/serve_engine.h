/* The front's side of the pipeline: one shared connection to stage 0 that every HTTP request
 * submits on (each with its own nonce), and a reader thread that hands each streamed token to
 * the request it belongs to. The connection is opened on the first submit and again after it
 * is lost (requests on a lost connection fail); a caller that stops waiting (its HTTP client
 * went away, or a stop string matched) cancels its request so every stage frees its KV. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_ENGINE_H
#define STRATA_RUNTIME_SERVE_SERVE_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "runtime/stage/client.h"

/* One request's results. tokens[] is allocated at submit for max_tokens and never moves, so
 * the owner reads tokens[0 .. a count it got from serve_engine_wait) without the lock. */
struct serve_job {
    uint64_t nonce;
    int32_t *tokens;
    int cap, n_tokens;
    int done;                             /* a token with finish set, or an error, arrived */
    enum wire_finish finish;              /* when done without error */
    int error_code;                       /* STRATA_E* when the request failed */
    int cached_tokens;                    /* prompt tokens stage 0 took from its KV cache */
    int accepted_tokens, rejected_tokens; /* its draft tokens (speculation), so far */
    int prompt_tokens; /* the prompt as stage 0 ran it (expansions included); 0: not yet */
    char error[640];
    int registered; /* in the engine's list */
    pthread_cond_t cond;
    struct serve_job *next;
};

/* How long the fronts wait for a describe: past the stages' own bound (2 x --peer-timeout-ms,
 * 20 s by default), so a broken ring's answer is stage 0's error naming it. */
#define SERVE_DESCRIBE_TIMEOUT_MS 25000
/* /metrics' per-stage gauges: a scrape waits at most this for the describe. */
#define SERVE_METRICS_DESCRIBE_MS 2000

/* A ring describe waiting for stage 0's answer (serve_engine_describe). */
struct serve_describe_wait {
    uint64_t nonce;
    int done, error_code;
    char error[640];
    struct client_describe *out;
    pthread_cond_t cond;
    struct serve_describe_wait *next;
};

struct serve_engine {
    char host[256];
    int port;
    struct wire_tls *tls; /* NULL = plaintext; owned by the caller */
    struct wire_auth_key key;
    int has_key; /* run the Hello's HMAC with key (wire_security_setup decides) */
    int connect_timeout_ms;
    pthread_mutex_t mu;
    struct strata_client client;
    int connected, reader_running, stopping;
    pthread_t reader;
    struct serve_job *jobs;
    struct serve_describe_wait *describes;
    uint64_t next_nonce;
};

/* tls and hello_key as wire_security_setup gives them (each may be NULL). */
int serve_engine_init(struct serve_engine *e, const char *host, int port, struct wire_tls *tls,
                      const struct wire_auth_key *hello_key);
/* Closes the connection (requests in flight fail) and joins the reader. */
void serve_engine_shutdown(struct serve_engine *e);

/* Sends `req` (its nonce is chosen here) for `job`, connecting first when needed.
 * STRATA_EIO / STRATA_ETIMEOUT / STRATA_EAUTH... when stage 0 cannot be reached. */
int serve_engine_submit(struct serve_engine *e, struct serve_job *job,
                        const struct stage_request *req);

/* Waits up to timeout_ms until the job has more than `seen` tokens or is done; returns the
 * token count (done in *done). STRATA_ETIMEOUT when nothing new came. */
int serve_engine_wait(struct serve_engine *e, struct serve_job *job, int seen, int *done,
                      int timeout_ms);

/* Ends the owner's interest in a job: takes it out of the engine and, when it is not done,
 * cancels it at stage 0. Then frees the job's memory. Safe on a job never submitted. */
void serve_engine_release(struct serve_engine *e, struct serve_job *job);

/* The pipeline's stages as they describe themselves (a Control Describe round the ring on the
 * shared connection, with a nonce of the request sequence, so it never collides with one).
 * Fails with stage 0's error (a stage or link down: STRATA_EPEER / STRATA_ETIMEOUT, naming it),
 * STRATA_ETIMEOUT when no answer came within timeout_ms, or the connection's error. */
int serve_engine_describe(struct serve_engine *e, struct client_describe *out, int timeout_ms);

/* 0 when stage 0 accepts a fresh connection and handshake within timeout_ms. */
int serve_engine_ping(struct serve_engine *e, int timeout_ms);

#endif
