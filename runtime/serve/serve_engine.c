/* Shared stage-0 connection with a dispatching reader thread (see serve_engine.h). */
#include "runtime/serve/serve_engine.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/log.h"
#include "runtime/base/status.h"

int serve_engine_init(struct serve_engine *e, const char *host, int port, struct wire_tls *tls,
                      const struct wire_auth_key *hello_key) {
    memset(e, 0, sizeof *e);
    snprintf(e->host, sizeof e->host, "%s", host);
    e->port = port;
    e->tls = tls;
    e->has_key = hello_key != NULL;
    if (hello_key) e->key = *hello_key;
    e->connect_timeout_ms = 3000;
    e->client.conn.fd = -1;
    /* Top bit clear, so nonces never wrap to the reserved 0. */
    e->next_nonce = (((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 8)) & (UINT64_MAX >> 1);
    if (pthread_mutex_init(&e->mu, NULL) != 0)
        return strata_set_error(STRATA_ENOMEM, "serve: cannot create a mutex");
    return 0;
}

static struct serve_job *find_job(struct serve_engine *e, uint64_t nonce) {
    for (struct serve_job *j = e->jobs; j; j = j->next)
        if (j->nonce == nonce) return j;
    return NULL;
}

static void fail_job(struct serve_job *j, int code, const char *message) {
    if (j->done) return;
    j->done = 1;
    j->error_code = code;
    snprintf(j->error, sizeof j->error, "%s", message);
    pthread_cond_broadcast(&j->cond);
}

static void end_describe(struct serve_describe_wait *w, int code, const char *message) {
    w->done = 1;
    w->error_code = code;
    if (code) snprintf(w->error, sizeof w->error, "%s", message);
    pthread_cond_broadcast(&w->cond);
}

/* Under the lock: a describe's answer or error; 1 when the event was one. */
static int apply_describe(struct serve_engine *e, const struct request_event *ev) {
    struct serve_describe_wait *w = e->describes;
    while (w && w->nonce != ev->nonce)
        w = w->next;
    if (!w) return ev->kind == REQUEST_EVENT_DESCRIBE; /* gave up waiting: dropped */
    if (w->done) return 1;
    if (ev->kind == REQUEST_EVENT_DESCRIBE)
        end_describe(w, client_describe_read(w->out, ev->frame, ev->frame_len),
                     strata_last_error());
    else
        end_describe(w, ev->code < 0 ? ev->code : STRATA_EPEER, ev->message);
    return 1;
}

/* Under the lock: one event to its job (events of released jobs are dropped). */
static void apply_event(struct serve_engine *e, const struct request_event *ev) {
    if (apply_describe(e, ev)) return;
    struct serve_job *j = find_job(e, ev->nonce);
    if (!j || j->done) return;
    if (ev->kind == REQUEST_EVENT_ERROR) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", strata_status_name(ev->code), ev->message);
        fail_job(j, ev->code, msg);
        return;
    }
    if (ev->step != (uint64_t)j->n_tokens || j->n_tokens >= j->cap) {
        fail_job(j, STRATA_EFORMAT, "stage 0 sent a token out of order");
        return;
    }
    j->tokens[j->n_tokens++] = ev->token;
    j->cached_tokens = ev->cached_tokens;
    j->accepted_tokens = ev->accepted_tokens;
    j->rejected_tokens = ev->rejected_tokens;
    if (ev->prompt_tokens > 0) j->prompt_tokens = ev->prompt_tokens;
    if (ev->finish != WIRE_FINISH_NONE) {
        j->done = 1;
        j->finish = ev->finish;
    }
    pthread_cond_broadcast(&j->cond);
}

/* Under the lock: the connection is gone; every request on it fails. */
static void drop_connection(struct serve_engine *e, const char *why) {
    for (struct serve_job *j = e->jobs; j; j = j->next)
        fail_job(j, STRATA_EPEER, why);
    for (struct serve_describe_wait *w = e->describes; w; w = w->next)
        if (!w->done) end_describe(w, STRATA_EPEER, why);
    if (e->connected) strata_log(STRATA_LOG_WARN, "stage 0 connection lost: %s", why);
    e->connected = 0;
    client_close(&e->client);
}

/* Waits, without the lock, until stage 0 has sent something (or hung up). */
static int wait_readable(int fd, int timeout_ms) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) > 0;
}

/* Reads events until the connection fails or the engine stops. Only this thread receives,
 * and it receives under the lock that submits and cancels send under, once poll() says a
 * frame is arriving: a receive never runs beside a send, which a TLS connection could not
 * take from two threads, and the lock is held only while a frame is read. */
static void *reader_main(void *arg) {
    struct serve_engine *e = arg;
    for (;;) {
        struct request_event ev;
        /* TLS may hold a decrypted record already, which poll() cannot see. */
        pthread_mutex_lock(&e->mu);
        int buffered = wire_conn_buffered(&e->client.conn);
        pthread_mutex_unlock(&e->mu);
        int readable = buffered || wait_readable(e->client.conn.fd, 200), rc = STRATA_ETIMEOUT;
        pthread_mutex_lock(&e->mu);
        if (!e->stopping && readable) rc = client_next_event(&e->client, &ev, 5000);
        if (e->stopping) {
            drop_connection(e, "the server is stopping");
        } else if (rc == STRATA_ETIMEOUT) {
            pthread_mutex_unlock(&e->mu);
            continue;
        } else if (rc < 0) {
            drop_connection(e, strata_last_error());
        } else if (ev.kind == REQUEST_EVENT_CONNECTION_ERROR) {
            drop_connection(e, ev.message);
        } else {
            apply_event(e, &ev);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        return NULL;
    }
}

/* Under the lock: connects (after reaping the last connection's reader) and starts a reader. */
static int ensure_connected(struct serve_engine *e) {
    if (e->connected) return 0;
    if (e->reader_running) {
        /* The reader cleared `connected` and is returning; it takes the lock no more. */
        pthread_join(e->reader, NULL);
        e->reader_running = 0;
    }
    int rc = client_connect_tls(&e->client, e->host, e->port, e->tls, e->has_key ? &e->key : NULL,
                                e->connect_timeout_ms);
    if (rc < 0) {
        client_close(&e->client);
        return rc;
    }
    if (pthread_create(&e->reader, NULL, reader_main, e) != 0) {
        client_close(&e->client);
        return strata_set_error(STRATA_ENOMEM, "serve: cannot start the reader thread");
    }
    e->reader_running = e->connected = 1;
    strata_log(STRATA_LOG_INFO, "connected to stage 0 at %s:%d", e->host, e->port);
    return 0;
}

int serve_engine_submit(struct serve_engine *e, struct serve_job *job,
                        const struct stage_request *req) {
    struct stage_request r = *req;
    memset(job, 0, sizeof *job);
    job->cap = req->max_tokens;
    job->tokens = calloc((size_t)job->cap, sizeof(int32_t));
    if (!job->tokens) return strata_set_error(STRATA_ENOMEM, "serve: no memory for tokens");
    pthread_cond_init(&job->cond, NULL);
    pthread_mutex_lock(&e->mu);
    int rc =
        e->stopping ? strata_set_error(STRATA_ECLOSED, "serve: stopping") : ensure_connected(e);
    if (rc == 0) {
        r.nonce = job->nonce = ++e->next_nonce;
        rc = client_submit(&e->client, &r);
    }
    if (rc == 0) {
        job->next = e->jobs;
        e->jobs = job;
        job->registered = 1;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc < 0) { /* never registered: serve_engine_release has nothing to take out */
        pthread_cond_destroy(&job->cond);
        free(job->tokens);
        job->tokens = NULL;
    }
    return rc;
}

static struct timespec deadline_after(int timeout_ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

int serve_engine_wait(struct serve_engine *e, struct serve_job *job, int seen, int *done,
                      int timeout_ms) {
    struct timespec deadline = deadline_after(timeout_ms);
    pthread_mutex_lock(&e->mu);
    int timed_out = 0;
    while (!job->done && job->n_tokens <= seen && !timed_out)
        timed_out = pthread_cond_timedwait(&job->cond, &e->mu, &deadline) != 0;
    int n = job->n_tokens;
    *done = job->done;
    pthread_mutex_unlock(&e->mu);
    if (n <= seen && !*done)
        return strata_set_error(STRATA_ETIMEOUT, "no answer from the pipeline in %d ms",
                                timeout_ms);
    return n;
}

void serve_engine_release(struct serve_engine *e, struct serve_job *job) {
    pthread_mutex_lock(&e->mu);
    if (job->registered) {
        for (struct serve_job **p = &e->jobs; *p; p = &(*p)->next)
            if (*p == job) {
                *p = job->next;
                break;
            }
        if (!job->done && e->connected && client_cancel(&e->client, job->nonce) < 0)
            strata_log(STRATA_LOG_WARN, "cancel of request %llu failed: %s",
                       (unsigned long long)job->nonce, strata_last_error());
        pthread_cond_destroy(&job->cond);
        job->registered = 0;
    }
    pthread_mutex_unlock(&e->mu);
    free(job->tokens);
    job->tokens = NULL;
}

int serve_engine_describe(struct serve_engine *e, struct client_describe *out, int timeout_ms) {
    struct serve_describe_wait w = {.out = out};
    struct timespec deadline = deadline_after(timeout_ms);
    pthread_cond_init(&w.cond, NULL);
    pthread_mutex_lock(&e->mu);
    int rc =
        e->stopping ? strata_set_error(STRATA_ECLOSED, "serve: stopping") : ensure_connected(e);
    if (rc == 0) {
        w.nonce = ++e->next_nonce;
        rc = client_describe_send(&e->client, w.nonce);
    }
    if (rc == 0) {
        w.next = e->describes;
        e->describes = &w;
        int timed_out = 0;
        while (!w.done && !timed_out)
            timed_out = pthread_cond_timedwait(&w.cond, &e->mu, &deadline) != 0;
        for (struct serve_describe_wait **p = &e->describes; *p; p = &(*p)->next)
            if (*p == &w) {
                *p = w.next;
                break;
            }
        if (!w.done)
            rc = strata_set_error(STRATA_ETIMEOUT, "no describe answer from stage 0 in %d ms",
                                  timeout_ms);
        else if (w.error_code)
            rc = strata_set_error(w.error_code, "%s", w.error);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&w.cond);
    return rc;
}

int serve_engine_ping(struct serve_engine *e, int timeout_ms) {
    struct strata_client c;
    int rc =
        client_connect_tls(&c, e->host, e->port, e->tls, e->has_key ? &e->key : NULL, timeout_ms);
    client_close(&c);
    return rc;
}

void serve_engine_shutdown(struct serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    int running = e->reader_running;
    pthread_mutex_unlock(&e->mu);
    if (running) pthread_join(e->reader, NULL);
    client_close(&e->client);
    wire_auth_key_clear(&e->key);
    pthread_mutex_destroy(&e->mu);
}
