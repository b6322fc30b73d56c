/* strata-stage --role vision: the loop (see vision_stage.h). One thread runs every session's
 * I/O on an event loop (runtime/base/event_loop.h: a file event per client and per stage-0
 * link, timers for reconnecting and for dropping stalled clients); an acceptor thread only
 * handshakes new clients, as in stage_server.c; an encoder thread (vision_worker.h) decodes
 * and encodes images and wakes the loop with each result, so relaying other requests' tokens
 * never waits for an encode. */
#include "runtime/stage/vision_stage.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/event_loop.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/base/version.h"
#include "runtime/stage/stage_accept.h"
#include "runtime/stage/vision_worker.h"
#include "runtime/stage/vision_xfer.h"
#include "wire/transport.h"

#define MAX_SESSIONS 64
#define MAX_JOBS 16  /* image requests in transfer per client */
#define MAX_LIVE 256 /* requests inside the pipeline per client */
#define HANDSHAKE_TIMEOUT_MS 3000
#define CONNECT_TIMEOUT_MS 1000
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define VISION_CLIENT_MAX_QUEUED ((size_t)1 << 20) /* token frames a client has not read */
/* The loop waits at most this long: *stop is set by a signal handler that may run on
 * another thread, and then no poll() of this one ends. Also the reconnect timer's longest
 * period (it runs sooner when a session's backoff ends sooner). */
#define LOOP_MAX_WAIT_MS 100
#define STALLED_EVERY_MS 50 /* the stalled-client check (timeouts are seconds) */

/* An image request between its encoding and its Request reaching stage 0. */
struct job {
    uint64_t nonce; /* 0 = free */
    struct vision_output out;
    struct vision_tx tx;
    uint8_t *request; /* [request_len] the Request for stage 0 (grids, no files) */
    size_t request_len;
    int dropped;  /* the test drop happened */
    int encoding; /* handed to the encoder thread (task `seq`), not yet back */
    uint64_t seq;
};

struct vstage;

struct session {
    struct vstage *v;
    int slot;                    /* index in v->sessions */
    struct wire_conn client, up; /* fd -1 when closed; each a file event while open */
    uint32_t id;
    int reconnects;
    int backoff_ms;
    int64_t retry_ms; /* up is down and jobs wait: reconnect at this time */
    struct job jobs[MAX_JOBS];
    uint64_t live[MAX_LIVE]; /* nonces sent to stage 0 and not finished */
    int num_live;
};

struct vstage {
    struct vision_frontend *fe;
    const struct vision_stage_options *opt;
    struct wire_listener listener;
    struct wire_hello self, self_up;
    pthread_t acceptor;
    int acceptor_started;
    atomic_int acceptor_stop, accept_close;
    struct event_loop *loop; /* the loop's thread; the acceptor and encoder only wake it */
    int64_t reconnect_timer, reconnect_due; /* the timer and when it runs next */
    int in_reconnect;                       /* its callback is running */
    int64_t reap_timer;                     /* a close of sessions whose client failed */
    pthread_mutex_t lock;
    struct wire_conn pending[16];
    int num_pending;
    struct session *sessions[MAX_SESSIONS];
    uint32_t next_id;
    struct wire_arena arena;
    struct vision_worker *worker; /* the encoder thread (vision_worker.h) */
};

static int io_timeout(const struct vstage *v) {
    return v->opt->io_timeout_ms ? v->opt->io_timeout_ms : 5000;
}

/* A handshaken connection from the acceptor (stage_accept.h: concurrent handshakes under
 * deadlines, per-address caps and a failed-handshake rate limit, as stage 0 has): clients
 * only, their frames up to --max-request-bytes. */
static void deliver(void *ctx, struct wire_conn *conn, const struct wire_hello *peer) {
    struct vstage *v = ctx;
    if (peer->role != WIRE_ROLE_CLIENT) {
        strata_log(STRATA_LOG_WARN, "refused %s: a %s (only clients are served here)", conn->peer,
                   peer->role == WIRE_ROLE_STAGE ? "stage" : "non-client peer");
        wire_send_error(conn, STRATA_EINVAL, 0,
                        "this is a vision stage: only clients connect here (stages connect to "
                        "stage 0)");
        wire_close(conn);
        return;
    }
    conn->max_frame =
        v->opt->max_request_bytes ? v->opt->max_request_bytes : VISION_DEFAULT_MAX_REQUEST_BYTES;
    pthread_mutex_lock(&v->lock);
    if (v->num_pending < 16) wire_conn_move(&v->pending[v->num_pending++], conn);
    pthread_mutex_unlock(&v->lock);
    if (conn->fd >= 0) {
        wire_send_error(conn, STRATA_EBUSY, 0, "too many pending connections");
        wire_close(conn);
    } else {
        event_loop_wake(v->loop);
    }
}

static void *acceptor_main(void *arg) {
    struct vstage *v = arg;
    struct stage_accept_options o = {.listener = &v->listener,
                                     .tls = v->opt->tls,
                                     .key = v->opt->key,
                                     .self = v->self,
                                     .handshake_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    if (stage_accept_run(&o, deliver, v, &v->acceptor_stop, &v->accept_close) < 0)
        strata_log(STRATA_LOG_ERROR, "acceptor: %s", strata_last_error());
    return NULL;
}

static void on_up(struct event_loop *loop, int fd, void *data, int mask);

static int up_buffered(void *data) {
    return wire_conn_buffered(&((struct session *)data)->up);
}

/* Unregisters a session's conn from the loop and closes it. */
static void close_conn(struct vstage *v, struct wire_conn *c) {
    if (c->fd >= 0) event_del_file(v->loop, c->fd); /* ENOTFOUND: never registered */
    wire_close(c);
}

/* Opens the session's link to stage 0 (Hello role Vision) and registers it with the loop. */
static int connect_up(struct vstage *v, struct session *s) {
    const struct vision_stage_options *o = v->opt;
    struct wire_hello peer;
    int port = o->next_port, rc;
    if (o->next_port_file && cli_read_port_file(o->next_port_file, &port) < 0) port = -1;
    if (port <= 0) return strata_set_error(STRATA_ENOTFOUND, "stage 0's port is not known yet");
    rc = wire_connect(&s->up, o->next_host, port, 0, CONNECT_TIMEOUT_MS);
    if (rc == 0 && o->tls) rc = wire_tls_connect(&s->up, o->tls, HANDSHAKE_TIMEOUT_MS);
    if (rc == 0)
        rc = wire_handshake_client(&peer, &s->up, &v->self_up, o->key, HANDSHAKE_TIMEOUT_MS);
    if (rc == 0 && (peer.stage_index != 0 || peer.layer_start != 0))
        rc = strata_set_error(STRATA_EINVAL, "%s is stage %d, not stage 0", s->up.peer,
                              peer.stage_index);
    if (rc == 0) rc = event_add_file(v->loop, s->up.fd, EVENT_READ, on_up, up_buffered, s);
    if (rc < 0) wire_close(&s->up);
    return rc;
}

static int64_t reap_timer(struct event_loop *loop, int64_t id, void *data);

/* To a client: queued, never waited for (wire_send_frame_nb), so a client that stops
 * reading holds no one up; past VISION_CLIENT_MAX_QUEUED it is dropped. */
static void send_client(struct vstage *v, struct session *s, const void *frame, size_t len) {
    if (s->client.fd >= 0 &&
        wire_send_frame_nb(&s->client, frame, len, VISION_CLIENT_MAX_QUEUED) < 0) {
        strata_log(STRATA_LOG_INFO, "client %u: send failed: %s", s->id, strata_last_error());
        close_conn(v, &s->client);
        /* The session goes on the next pass: callers up the stack still hold it. */
        if (v->reap_timer <= 0) v->reap_timer = event_add_timer(v->loop, 0, reap_timer, v);
    }
}

static void error_client(struct vstage *v, struct session *s, int code, uint64_t nonce,
                         const char *message) {
    struct wire_error e = {.code = code, .message = message, .nonce = nonce};
    if (wire_build_error(&v->arena, &e) == 0)
        send_client(v, s, wire_arena_frame(&v->arena), wire_arena_frame_len(&v->arena));
}

static void job_free(struct job *j) {
    vision_output_free(&j->out);
    free(j->request);
    memset(j, 0, sizeof *j);
}

static void live_add(struct session *s, uint64_t nonce) {
    if (s->num_live < MAX_LIVE) s->live[s->num_live++] = nonce;
}

static void live_remove(struct session *s, uint64_t nonce) {
    for (int i = 0; i < s->num_live; i++)
        if (s->live[i] == nonce) {
            s->live[i] = s->live[--s->num_live];
            return;
        }
}

static void up_down(struct vstage *v, struct session *s, const char *reason);
static void reconnect_soon(struct vstage *v, int64_t at_ms);

/* Sends the job's next blocks within the window; after the last acknowledgement, its
 * Request. Returns 0, or -1 when the link went down (up_down has run). */
static int pump(struct vstage *v, struct session *s, struct job *j) {
    struct vision_tx *tx = &j->tx;
    if (s->up.fd < 0 || j->encoding) return 0;
    if (vision_tx_done(tx)) {
        uint64_t nonce = j->nonce;
        if (wire_send_frame(&s->up, j->request, j->request_len, io_timeout(v)) < 0) {
            up_down(v, s, strata_last_error());
            return -1;
        }
        strata_log(STRATA_LOG_INFO, "request %llu: %d image tokens in %u blocks sent to stage 0",
                   (unsigned long long)nonce, tx->n_tokens, tx->num_blocks);
        job_free(j);
        live_add(s, nonce);
        return 0;
    }
    while (tx->next_send < tx->num_blocks && tx->next_send - tx->acked < VISION_STAGE_WINDOW) {
        uint32_t i = tx->next_send;
        if (vision_tx_build(tx, &v->arena, i) < 0 ||
            wire_send_frame(&s->up, wire_arena_frame(&v->arena), wire_arena_frame_len(&v->arena),
                            io_timeout(v)) < 0) {
            up_down(v, s, strata_last_error());
            return -1;
        }
        tx->next_send++;
        if ((int)i == v->opt->drop_after_block && !j->dropped) {
            j->dropped = 1;
            strata_log(STRATA_LOG_WARN,
                       "request %llu: test drop of the stage-0 link after block %u",
                       (unsigned long long)j->nonce, i);
            up_down(v, s, "test drop (--test-drop-after-block)");
            return -1;
        }
    }
    return 0;
}

/* The link to stage 0 died: requests inside the pipeline are lost (stage 0 cancelled them
 * with the link), transfers wait for a reconnection and resume. */
static void up_down(struct vstage *v, struct session *s, const char *reason) {
    char why[512];
    strata_log(STRATA_LOG_WARN, "client %u: link to stage 0 lost: %s", s->id, reason);
    snprintf(why, sizeof why, "vision stage: the link to stage 0 dropped: %s", reason);
    close_conn(v, &s->up);
    for (int i = 0; i < s->num_live; i++)
        error_client(v, s, STRATA_ECLOSED, s->live[i], why);
    s->num_live = 0;
    for (int i = 0; i < MAX_JOBS; i++)
        if (s->jobs[i].nonce) vision_tx_rewind(&s->jobs[i].tx);
    s->retry_ms = cli_now_ms() + s->backoff_ms;
    reconnect_soon(v, s->retry_ms);
}

static int has_jobs(const struct session *s) {
    for (int i = 0; i < MAX_JOBS; i++)
        if (s->jobs[i].nonce) return 1;
    return 0;
}

/* Reconnects a session whose transfers wait; gives them up after VISION_STAGE_RECONNECTS. */
static void reconnect(struct vstage *v, struct session *s) {
    if (s->up.fd >= 0 || !has_jobs(s) || cli_now_ms() < s->retry_ms) return;
    if (connect_up(v, s) == 0) {
        strata_log(STRATA_LOG_INFO, "client %u: reconnected to stage 0; resuming transfers", s->id);
        s->reconnects = 0;
        s->backoff_ms = BACKOFF_MIN_MS;
        for (int i = 0; i < MAX_JOBS && s->up.fd >= 0; i++)
            if (s->jobs[i].nonce) pump(v, s, &s->jobs[i]);
        return;
    }
    char why[512];
    snprintf(why, sizeof why, "vision stage: stage 0 unreachable: %s", strata_last_error());
    if (++s->reconnects >= VISION_STAGE_RECONNECTS) {
        for (int i = 0; i < MAX_JOBS; i++)
            if (s->jobs[i].nonce) {
                error_client(v, s, STRATA_ECLOSED, s->jobs[i].nonce, why);
                job_free(&s->jobs[i]);
            }
        s->reconnects = 0;
        return;
    }
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : s->backoff_ms * 2;
    s->retry_ms = cli_now_ms() + s->backoff_ms;
}

static struct job *find_job(struct session *s, uint64_t nonce) {
    for (int i = 0; i < MAX_JOBS; i++)
        if (nonce && s->jobs[i].nonce == nonce) return &s->jobs[i];
    return NULL;
}

/* A client's Request with image files: a job slot, and the frame to the encoder thread. */
static void image_request(struct vstage *v, struct session *s, const struct wire_request *req,
                          const uint8_t *frame, size_t len) {
    char why[700];
    struct job *j = NULL;
    uint64_t seq = 0;
    for (int i = 0; i < MAX_JOBS && !j; i++)
        if (!s->jobs[i].nonce) j = &s->jobs[i];
    int rc = j ? 0
               : strata_set_error(STRATA_EBUSY, "%d image requests of this client are in flight",
                                  MAX_JOBS);
    if (rc == 0 && find_job(s, req->nonce))
        rc = strata_set_error(STRATA_EINVAL, "request nonce %llu is already in flight",
                              (unsigned long long)req->nonce);
    if (rc == 0) rc = vision_worker_submit(v->worker, s->id, req->nonce, frame, len, &seq);
    if (rc < 0) {
        snprintf(why, sizeof why, "vision stage: %s", strata_last_error());
        error_client(v, s, rc, req->nonce, why);
        return;
    }
    j->nonce = req->nonce;
    j->encoding = 1;
    j->seq = seq;
    if (s->up.fd < 0) reconnect_soon(v, s->retry_ms); /* transfers wait: reconnect */
}

/* An encoded request is back: its transfer starts (or its refusal goes to the client). */
static void encoded(struct vstage *v, struct vision_task *t) {
    struct session *s = NULL;
    struct job *j = NULL;
    char why[800];
    for (int i = 0; i < MAX_SESSIONS && !s; i++)
        if (v->sessions[i] && v->sessions[i]->id == t->session_id) s = v->sessions[i];
    if (s) j = find_job(s, t->nonce);
    if (!j || !j->encoding || j->seq != t->seq) { /* the client left or cancelled */
        vision_task_free(t);
        return;
    }
    int rc = t->rc;
    if (rc == 0)
        rc = vision_tx_init(&j->tx, t->nonce, t->out.embeds, t->out.n_tokens, t->out.hidden,
                            t->out.deepstack, t->out.num_deepstack,
                            v->opt->block_tokens ? v->opt->block_tokens
                                                 : VISION_DEFAULT_BLOCK_TOKENS);
    if (rc < 0) {
        snprintf(why, sizeof why, "vision stage: bad image request: %s",
                 t->rc < 0 ? t->message : strata_last_error());
        strata_log(STRATA_LOG_WARN, "client %u: request %llu refused: %s", s->id,
                   (unsigned long long)t->nonce, why);
        job_free(j);
        error_client(v, s, rc, t->nonce, why);
        vision_task_free(t);
        return;
    }
    j->out = t->out; /* the job owns the outputs and the Request now */
    memset(&t->out, 0, sizeof t->out);
    j->request = t->request;
    j->request_len = t->request_len;
    t->request = NULL;
    j->encoding = 0;
    vision_task_free(t);
    strata_log(STRATA_LOG_INFO,
               "request %llu: %d image(s) -> %d tokens x %d (+%d DeepStack), decode %.1f ms, "
               "encode %.1f ms",
               (unsigned long long)j->nonce, j->out.num_images, j->out.n_tokens, j->out.hidden,
               j->out.num_deepstack, j->out.seconds_decode * 1e3, j->out.seconds_encode * 1e3);
    if (s->up.fd < 0) {
        s->retry_ms = 0; /* reconnect() starts it */
        reconnect_soon(v, 0);
        return;
    }
    pump(v, s, j);
}

static void take_done(struct vstage *v) {
    struct vision_task *t = vision_worker_take_done(v->worker);
    while (t) {
        struct vision_task *next = t->next;
        encoded(v, t);
        t = next;
    }
}

/* One frame from a client. Returns -1 when the client must be dropped. */
static int from_client(struct vstage *v, struct session *s, const uint8_t *frame, size_t len) {
    enum wire_kind kind;
    struct wire_request req;
    struct wire_control ctl;
    if (wire_verify(&kind, NULL, frame, len) < 0) {
        char why[600];
        snprintf(why, sizeof why, "bad frame: %s", strata_last_error());
        error_client(v, s, STRATA_EFORMAT, 0, why);
        return -1;
    }
    if (kind == WIRE_KIND_REQUEST && wire_read_request(&req, frame, len) == 0 &&
        req.num_image_files) {
        image_request(v, s, &req, frame, len);
        return 0;
    }
    if (kind == WIRE_KIND_CONTROL && wire_read_control(&ctl, frame, len) == 0 &&
        ctl.kind == WIRE_CONTROL_CANCEL && find_job(s, ctl.nonce)) {
        job_free(find_job(s, ctl.nonce));
        error_client(v, s, STRATA_ECANCELED, ctl.nonce, "cancelled (in the vision stage)");
        return 0;
    }
    if (s->up.fd < 0 && connect_up(v, s) < 0) {
        char why[600];
        snprintf(why, sizeof why, "vision stage: stage 0 unreachable: %s", strata_last_error());
        error_client(v, s, STRATA_ECLOSED, kind == WIRE_KIND_REQUEST ? req.nonce : 0, why);
        return kind == WIRE_KIND_REQUEST ? 0 : -1;
    }
    if (wire_send_frame(&s->up, frame, len, io_timeout(v)) < 0) {
        up_down(v, s, strata_last_error());
        return 0;
    }
    if (kind == WIRE_KIND_REQUEST) live_add(s, req.nonce); /* a text request: bypass */
    return 0;
}

/* A describe's answer from stage 0 on its way to the client: this stage's entry goes first
 * (StageInfo.front: it is in front of stage 0, not in the ring), so a front drawing the
 * pipeline sees the vision stage and the link from it to stage 0. 0 when it was sent; 1
 * when the frame is not a describe's answer (or has no room) and goes on unchanged. */
static int describe_answer(struct vstage *v, struct session *s, const uint8_t *frame, size_t len) {
    static const char version[] = "strata " STRATA_VERSION;
    struct wire_control ctl;
    struct wire_stage_info entries[WIRE_MAX_DESCRIBE_STAGES];
    if (wire_read_control(&ctl, frame, len) < 0 || ctl.kind != WIRE_CONTROL_DESCRIBE ||
        ctl.num_stages == 0 || ctl.num_stages >= WIRE_MAX_DESCRIBE_STAGES)
        return 1;
    for (size_t i = 0; i < ctl.num_stages; i++) /* strings point into frame */
        entries[i + 1] = wire_control_stage(&ctl, i);
    int encoding = 0;
    for (int j = 0; j < MAX_JOBS; j++)
        encoding += s->jobs[j].nonce != 0;
    entries[0] = (struct wire_stage_info){
        .stage_index = 0,
        .num_stages = entries[1].num_stages,
        .vision = 1,
        .front = 1,
        .device = v->opt->device_words ? v->opt->device_words : "cpu",
        .tp = 1,
        .kvp = 1,
        .threads = v->opt->threads,
        .weights_dtype = "bf16",
        .version = version,
        .queue_depth = encoding, /* this client's image requests not yet at stage 0 */
        .next = s->up.fd >= 0 ? s->up.peer : ""};
    struct wire_control out = {.kind = WIRE_CONTROL_DESCRIBE,
                               .nonce = ctl.nonce,
                               .seq = ctl.seq,
                               .stages = entries,
                               .num_stages = ctl.num_stages + 1};
    if (wire_build_control(&v->arena, &out) < 0) return 1;
    send_client(v, s, wire_arena_frame(&v->arena), wire_arena_frame_len(&v->arena));
    return 0;
}

/* One frame from stage 0: acknowledgements drive transfers, the rest goes to the client. */
static void from_up(struct vstage *v, struct session *s, const uint8_t *frame, size_t len) {
    enum wire_kind kind;
    if (wire_verify(&kind, NULL, frame, len) < 0) {
        up_down(v, s, strata_last_error());
        return;
    }
    if (kind == WIRE_KIND_VISION_ACK) {
        struct wire_vision_ack ack;
        struct job *j;
        if (wire_read_vision_ack(&ack, frame, len) == 0 && (j = find_job(s, ack.nonce))) {
            if (vision_tx_on_ack(&j->tx, &ack) < 0)
                up_down(v, s, strata_last_error());
            else
                pump(v, s, j);
        }
        return;
    }
    if (kind == WIRE_KIND_ERROR) {
        struct wire_error e;
        if (wire_read_error(&e, frame, len) == 0) {
            if (find_job(s, e.nonce)) job_free(find_job(s, e.nonce)); /* a refused transfer */
            live_remove(s, e.nonce);
        }
    } else if (kind == WIRE_KIND_TOKEN_RESULT) {
        struct wire_token_result t;
        if (wire_read_token_result(&t, frame, len) == 0 && t.finish != WIRE_FINISH_NONE)
            live_remove(s, t.nonce);
    } else if (kind == WIRE_KIND_CONTROL && describe_answer(v, s, frame, len) == 0) {
        return;
    }
    send_client(v, s, frame, len);
}

static void session_close(struct vstage *v, int i) {
    struct session *s = v->sessions[i];
    for (int k = 0; k < MAX_JOBS; k++)
        job_free(&s->jobs[k]);
    close_conn(v, &s->client);
    close_conn(v, &s->up); /* stage 0 cancels this client's requests with the link */
    free(s);
    v->sessions[i] = NULL;
}

static void on_client(struct event_loop *loop, int fd, void *data, int mask);

static int client_buffered(void *data) {
    return wire_conn_buffered(&((struct session *)data)->client);
}

/* Adopts a handshaken client and opens its link to stage 0. */
static void adopt(struct vstage *v, struct wire_conn *conn) {
    int i = 0;
    while (i < MAX_SESSIONS && v->sessions[i])
        i++;
    struct session *s = i < MAX_SESSIONS ? calloc(1, sizeof *s) : NULL;
    if (!s) {
        wire_send_error(conn, STRATA_EBUSY, 0, "too many clients on this vision stage");
        wire_close(conn);
        return;
    }
    wire_conn_move(&s->client, conn);
    s->v = v;
    s->slot = i;
    s->up.fd = -1;
    s->id = ++v->next_id;
    s->backoff_ms = BACKOFF_MIN_MS;
    v->sessions[i] = s;
    if (event_add_file(v->loop, s->client.fd, EVENT_READ, on_client, client_buffered, s) < 0) {
        strata_log(STRATA_LOG_WARN, "closing %s: %s", s->client.peer, strata_last_error());
        session_close(v, i);
        return;
    }
    if (connect_up(v, s) < 0) {
        char why[600];
        snprintf(why, sizeof why, "vision stage: stage 0 unreachable: %s", strata_last_error());
        strata_log(STRATA_LOG_WARN, "client %u: %s", s->id, why);
        error_client(v, s, STRATA_ECLOSED, 0, why);
        session_close(v, i);
        return;
    }
    strata_log(STRATA_LOG_DEBUG, "client %u connected from %s", s->id, s->client.peer);
}

static void take_handoffs(struct vstage *v) {
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < v->num_pending; i++)
        adopt(v, &v->pending[i]);
    v->num_pending = 0;
    pthread_mutex_unlock(&v->lock);
}

/* A client frame that cannot be read (above --max-request-bytes, malformed): a connection
 * Error naming the reason, then the rest of what the client sent is read and dropped for a
 * moment (plaintext links), so closing does not reset the connection before the client has
 * read the Error. */
static void refuse_client(struct vstage *v, struct session *s, int rc) {
    char why[600], sink[65536];
    size_t limit =
        v->opt->max_request_bytes ? v->opt->max_request_bytes : VISION_DEFAULT_MAX_REQUEST_BYTES;
    snprintf(why, sizeof why, "vision stage: cannot take the request (--max-request-bytes %zu): %s",
             limit, strata_last_error());
    strata_log(STRATA_LOG_WARN, "client %u: %s", s->id, why);
    s->client.broken = 0; /* the receive side is out of step; sending still works */
    struct wire_error e = {.code = rc, .message = why, .nonce = 0};
    if (wire_build_error(&v->arena, &e) < 0 || /* blocking: after the queue, then the close */
        wire_send_frame(&s->client, wire_arena_frame(&v->arena), wire_arena_frame_len(&v->arena),
                        1000) < 0 ||
        s->client.ssl)
        return;
    shutdown(s->client.fd, SHUT_WR);
    int64_t deadline = cli_now_ms() + 1000;
    while (cli_now_ms() < deadline) {
        struct pollfd p = {.fd = s->client.fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1 && read(s->client.fd, sink, sizeof sink) <= 0) break;
    }
}

/* Reads one frame from a session's client (up = 0) or stage-0 link (up = 1). */
static void serve(struct vstage *v, int i, int up) {
    struct session *s = v->sessions[i];
    struct wire_conn *c = up ? &s->up : &s->client;
    const uint8_t *frame;
    size_t len;
    int rc = wire_recv_frame_nb(c, &frame, &len);
    if (rc == WIRE_RECV_PENDING) return; /* the rest of the frame has not arrived yet */
    if (rc < 0 && up) {
        up_down(v, s, rc == STRATA_ECLOSED ? "stage 0 closed the connection" : strata_last_error());
        return;
    }
    if (rc < 0) {
        if (rc != STRATA_ECLOSED) refuse_client(v, s, rc);
        session_close(v, i);
        return;
    }
    if (up)
        from_up(v, s, frame, len);
    else if (from_client(v, s, frame, len) < 0)
        session_close(v, i);
    if (v->sessions[i] && s->client.fd < 0) session_close(v, i);
}

/* Serves what a readable conn holds (up to a bound, so one busy peer cannot starve the
 * others; TLS records already decrypted count as readable) and flushes a client's queue
 * when the socket takes more. */
static void service(struct vstage *v, int i, int up, int mask) {
    for (int k = 0; k < 32 && (mask & EVENT_READ) && v->sessions[i]; k++) {
        struct wire_conn *c = up ? &v->sessions[i]->up : &v->sessions[i]->client;
        int fd = c->fd;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        serve(v, i, up);
        if (!v->sessions[i] || c->fd != fd || c->fd < 0) break;
        if (!wire_conn_buffered(c) && (poll(&p, 1, 0) != 1 || !(p.revents & POLLIN))) break;
    }
    struct session *s = v->sessions[i];
    if (!s || up) return;
    if ((mask & EVENT_WRITE) && wire_flush_nb(&s->client) < 0) session_close(v, i);
}

static void on_client(struct event_loop *loop, int fd, void *data, int mask) {
    struct session *s = data;
    (void)loop;
    if (s->client.fd == fd) service(s->v, s->slot, 0, mask);
}

static void on_up(struct event_loop *loop, int fd, void *data, int mask) {
    struct session *s = data;
    (void)loop;
    if (s->up.fd == fd) service(s->v, s->slot, 1, mask);
}

/* Handshaken clients from the acceptor, encoded requests from the encoder thread. */
static void on_wake(struct event_loop *loop, void *data) {
    (void)loop;
    take_handoffs(data);
    take_done(data);
}

/* Drops a client that stalls mid-frame or stops reading for longer than the I/O timeout. */
static int64_t stalled_timer(struct event_loop *loop, int64_t id, void *data) {
    struct vstage *v = data;
    int64_t now = cli_now_ms();
    (void)loop;
    (void)id;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = v->sessions[i];
        if (!s) continue;
        int64_t partial = wire_conn_partial_since(&s->client),
                unread = wire_conn_tx_waiting_since(&s->client);
        if ((partial && now - partial > io_timeout(v)) ||
            (unread && now - unread > io_timeout(v))) {
            strata_log(STRATA_LOG_INFO, "client %u dropped: %s for %d ms", s->id,
                       partial ? "stalled mid-frame" : "not reading", io_timeout(v));
            session_close(v, i);
        }
    }
    return STALLED_EVERY_MS;
}

/* Closes the sessions whose client link failed on a send (send_client). */
static int64_t reap_timer(struct event_loop *loop, int64_t id, void *data) {
    struct vstage *v = data;
    (void)loop;
    (void)id;
    v->reap_timer = 0;
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (v->sessions[i] && v->sessions[i]->client.fd < 0) session_close(v, i);
    return EVENT_TIMER_DONE;
}

/* Reconnects the sessions whose transfers wait for stage 0 once their backoff is over,
 * then runs again at the earliest next retry (at most LOOP_MAX_WAIT_MS away). */
static int64_t reconnect_timer(struct event_loop *loop, int64_t id, void *data) {
    struct vstage *v = data;
    int64_t next = LOOP_MAX_WAIT_MS, now;
    (void)loop;
    (void)id;
    v->in_reconnect = 1; /* reconnect_soon: this run computes its next time itself */
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (v->sessions[i]) reconnect(v, v->sessions[i]);
    v->in_reconnect = 0;
    now = cli_now_ms();
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = v->sessions[i];
        if (s && s->up.fd < 0 && has_jobs(s) && s->retry_ms - now < next)
            next = s->retry_ms > now ? s->retry_ms - now : 0;
    }
    v->reconnect_due = now + next;
    return next;
}

/* Makes the reconnect timer run by at_ms (a session's backoff ends, or its transfers wait
 * for a link that is down). */
static void reconnect_soon(struct vstage *v, int64_t at_ms) {
    if (v->in_reconnect || at_ms >= v->reconnect_due) return;
    event_del_timer(v->loop, v->reconnect_timer);
    v->reconnect_timer = event_add_timer_at(v->loop, at_ms, reconnect_timer, v);
    v->reconnect_due = at_ms;
    if (v->reconnect_timer < 0) /* out of memory: reconnecting stops; say so */
        strata_log(STRATA_LOG_ERROR, "reconnect timer: %s", strata_last_error());
}

/* One pass: a client with frames queued is watched for the socket taking more. */
static void loop_once(struct vstage *v) {
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = v->sessions[i];
        if (s && s->client.fd >= 0)
            event_modify_file(v->loop, s->client.fd,
                              EVENT_READ | (wire_conn_tx_pending(&s->client) ? EVENT_WRITE : 0));
    }
    if (event_loop_run_once(v->loop, LOOP_MAX_WAIT_MS) < 0)
        strata_log(STRATA_LOG_WARN, "%s", strata_last_error());
}

/* The loop, its wake callback and its timers. */
static int loop_setup(struct vstage *v) {
    int rc = event_loop_create(&v->loop, 2 * MAX_SESSIONS);
    if (rc < 0) return rc;
    event_loop_set_wake(v->loop, on_wake, v);
    v->reconnect_due = cli_now_ms() + LOOP_MAX_WAIT_MS;
    v->reconnect_timer = event_add_timer_at(v->loop, v->reconnect_due, reconnect_timer, v);
    if (v->reconnect_timer < 0) return (int)v->reconnect_timer;
    int64_t id = event_add_timer(v->loop, STALLED_EVERY_MS, stalled_timer, v);
    return id < 0 ? (int)id : 0;
}

static void hello_init(struct wire_hello *h, const struct vision_stage_options *opt,
                       enum wire_role role) {
    memset(h, 0, sizeof *h);
    h->version_major = WIRE_VERSION_MAJOR;
    h->version_minor = WIRE_VERSION_MINOR;
    h->has_fingerprint = 1;
    memcpy(h->fingerprint, opt->fingerprint, WIRE_FINGERPRINT_BYTES);
    /* To clients the vision stage is the pipeline's entry: stage 0 with no layers. */
    h->stage_index = role == WIRE_ROLE_VISION ? -1 : 0;
    h->role = role;
    snprintf(h->name, sizeof h->name, "strata-stage vision");
}

/* The encoder thread's "a task is done": the loop takes it on its next pass (on_wake). */
static void wake_loop(void *ctx) {
    event_loop_wake(((struct vstage *)ctx)->loop);
}

int vision_stage_run(struct vision_frontend *fe, const struct vision_stage_options *opt,
                     volatile sig_atomic_t *stop) {
    struct vstage *v = calloc(1, sizeof *v);
    int rc;
    if (!v) return strata_set_error(STRATA_ENOMEM, "out of memory");
    v->fe = fe;
    v->opt = opt;
    v->listener.fd = -1;
    pthread_mutex_init(&v->lock, NULL);
    hello_init(&v->self, opt, WIRE_ROLE_STAGE);
    hello_init(&v->self_up, opt, WIRE_ROLE_VISION);
    rc = wire_arena_init(&v->arena, 0);
    if (rc == 0) rc = wire_listen(&v->listener, opt->listen_host, opt->listen_port);
    if (rc < 0) goto done;
    strata_log(STRATA_LOG_INFO, "listening on %s:%d",
               opt->listen_host ? opt->listen_host : "127.0.0.1", v->listener.port);
    if (opt->port_file && (rc = cli_write_port_file(opt->port_file, v->listener.port)) < 0)
        goto done;
    if ((rc = loop_setup(v)) < 0) goto done;
    if (pthread_create(&v->acceptor, NULL, acceptor_main, v) != 0) {
        rc = strata_set_error(STRATA_EIO, "cannot start the acceptor thread");
        goto done;
    }
    v->acceptor_started = 1;
    if ((rc = vision_worker_start(&v->worker, v->fe, wake_loop, v)) < 0) goto done;
    while (!*stop)
        loop_once(v);
    rc = 0;
done:
    atomic_store(&v->acceptor_stop, 1);
    if (v->acceptor_started) pthread_join(v->acceptor, NULL);
    vision_worker_stop(v->worker); /* after the encode under way */
    wire_listener_close(&v->listener);
    for (int i = 0; i < v->num_pending; i++)
        wire_close(&v->pending[i]);
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (v->sessions[i]) session_close(v, i);
    event_loop_free(v->loop);
    wire_arena_free(&v->arena);
    pthread_mutex_destroy(&v->lock);
    free(v);
    return rc;
}
