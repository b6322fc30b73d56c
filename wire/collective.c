/* Collectives over the framed TCP transport: a ring with one sender thread per rank (see
 * collective.h for the algorithms and why their reduction order is fixed). */
#include "wire/collective.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "wire/auth.h"
#include "wire/collective_internal.h"
#include "wire/message.h"
#include "wire/tls.h"

int64_t coll_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t coll_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds one completed operation to its counters (coll_stats). */
static void count_op(struct coll_op_stats *s, size_t n, uint64_t start_ns) {
    ++s->calls;
    s->floats += n;
    s->ns += coll_now_ns() - start_ns;
}

/* Sets the error "<prefix>: <the current error>" (the current message is copied first:
 * formatting a thread's error buffer into itself would garble it). */
static int wrap_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wrap_error(int code, const char *fmt, ...) {
    char cause[1024], prefix[512];
    snprintf(cause, sizeof cause, "%s", strata_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return strata_set_error(code, "%s: %s", prefix, cause);
}

int coll_fail(struct coll *c, int code, const char *what) {
    if (!c->broken) {
        c->broken = 1;
        c->error_code = code;
        snprintf(c->error, sizeof c->error, "collective group \"%s\" rank %d/%d: %s: %s", c->group,
                 c->rank, c->size, what, strata_last_error());
        /* Closing our links makes both neighbours fail at once instead of at their
         * timeout; the failure then travels around the ring. */
        if (c->next.fd >= 0 && c->next.open) shutdown(c->next.fd, SHUT_RDWR);
        if (c->prev.fd >= 0 && c->prev.open) shutdown(c->prev.fd, SHUT_RDWR);
    }
    return strata_set_error(c->error_code, "%s", c->error);
}

static int check_ready(struct coll *c, const char *what, size_t n) {
    if (!c) return strata_set_error(STRATA_EINVAL, "%s: null communicator", what);
    if (c->broken)
        return strata_set_error(c->error_code, "%s refused: the group failed earlier: %s", what,
                                c->error);
    if (n > ((size_t)1 << 40))
        return strata_set_error(STRATA_EINVAL, "%s of %zu floats is too large", what, n);
    return STRATA_OK;
}

/* ---- sender thread ---------------------------------------------------------------- */

static void *sender_main(void *arg) {
    struct coll *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head) break; /* stopping with nothing left */
        struct coll_item *it = c->head;
        c->head = it->next;
        if (!c->head) c->tail = NULL;
        int failed = c->send_error != 0;
        pthread_mutex_unlock(&c->mu);
        int rc = failed ? 0
                        : wire_send_frame(&c->next, wire_arena_frame(&it->arena),
                                          wire_arena_frame_len(&it->arena), c->timeout_ms);
        char msg[512];
        if (rc) {
            snprintf(msg, sizeof msg, "sending to rank %d (%s): %s", (c->rank + 1) % c->size,
                     c->next.peer, strata_last_error());
            /* wake the receiving thread, which may wait on the other link */
            if (c->prev.fd >= 0) shutdown(c->prev.fd, SHUT_RDWR);
        }
        wire_arena_free(&it->arena);
        free(it);
        pthread_mutex_lock(&c->mu);
        if (rc && !c->send_error) {
            c->send_error = rc;
            snprintf(c->send_msg, sizeof c->send_msg, "%s", msg);
        }
        --c->queued;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* The sender's failure, if any, as this thread's error. */
static int sender_status(struct coll *c) {
    pthread_mutex_lock(&c->mu);
    int rc = c->send_error;
    if (rc) strata_set_error(rc, "%s", c->send_msg);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Builds the frame of one chunk and queues it for the next rank. */
static int send_chunk(struct coll *c, enum coll_op op, int origin, const float *data, size_t off,
                      size_t len) {
    struct coll_item *it = calloc(1, sizeof *it);
    if (!it) return strata_set_error(STRATA_ENOMEM, "collective: out of memory");
    struct wire_activation m = {0};
    m.stage_from = c->rank;
    m.stage_to = (c->rank + 1) % c->size;
    m.step = c->seq;
    m.pos = off;
    m.nonce = ((uint64_t)op << 32) | (uint32_t)origin;
    m.hidden.defined = 1;
    m.hidden.dtype = WIRE_DTYPE_F32;
    m.hidden.codec = WIRE_CODEC_NONE;
    m.hidden.ndim = 1;
    m.hidden.shape[0] = (int64_t)len;
    m.hidden.data = data + off;
    m.hidden.nbytes = len * sizeof(float);
    int rc = wire_arena_init(&it->arena, len * sizeof(float) + 512);
    if (!rc) rc = wire_build_activation(&it->arena, &m);
    if (rc) {
        wire_arena_free(&it->arena);
        free(it);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = it;
    else
        c->head = it;
    c->tail = it;
    ++c->queued;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return STRATA_OK;
}

/* Waits until the sender has sent everything queued (or failed), before the deadline. */
static int drain(struct coll *c, int64_t deadline) {
    pthread_mutex_lock(&c->mu);
    int rc = STRATA_OK;
    while (c->queued > 0 && !c->send_error) {
        int64_t left = deadline - coll_now_ms();
        if (left <= 0) {
            rc = strata_set_error(STRATA_ETIMEOUT, "sending to rank %d (%s) did not finish",
                                  (c->rank + 1) % c->size, c->next.peer);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (left < 50 ? left : 50) * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    if (!rc && c->send_error) rc = strata_set_error(c->send_error, "%s", c->send_msg);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Receives the next chunk from the previous rank and checks it is the one expected;
 * *chunk points into the connection's buffer until the next receive. */
static int recv_chunk(struct coll *c, enum coll_op op, int origin, size_t off, size_t len,
                      int64_t deadline, const float **chunk) {
    const int prev = (c->rank + c->size - 1) % c->size;
    int64_t left = deadline - coll_now_ms();
    const uint8_t *frame;
    size_t flen;
    int rc = left <= 0 ? strata_set_error(STRATA_ETIMEOUT, "deadline passed")
                       : wire_recv_frame(&c->prev, &frame, &flen, (int)left);
    if (rc) {
        int sent = sender_status(c);
        if (sent) return sent;
        return wrap_error(rc, "receiving from rank %d (%s)", prev, c->prev.peer);
    }
    struct wire_activation m;
    if ((rc = wire_read_activation(&m, frame, flen))) return wrap_error(rc, "from rank %d", prev);
    const uint64_t want_nonce = ((uint64_t)op << 32) | (uint32_t)origin;
    if (m.stage_from != prev || m.stage_to != c->rank || m.step != c->seq ||
        m.nonce != want_nonce || m.pos != off || m.hidden.dtype != WIRE_DTYPE_F32 ||
        m.hidden.codec != WIRE_CODEC_NONE || m.hidden.ndim != 1 ||
        m.hidden.shape[0] != (int64_t)len)
        return strata_set_error(STRATA_EFORMAT,
                                "desync: rank %d sent op %u (origin %u) #%llu offset %llu of "
                                "%lld floats from rank %d to %d; expected op %d (origin %d) "
                                "#%llu offset %zu of %zu floats (do all ranks call the same "
                                "collectives in the same order with the same sizes?)",
                                prev, (unsigned)(m.nonce >> 32), (unsigned)(m.nonce & 0xffffffffu),
                                (unsigned long long)m.step, (unsigned long long)m.pos,
                                (long long)m.hidden.shape[0], m.stage_from, m.stage_to, op, origin,
                                (unsigned long long)c->seq, off, len);
    *chunk = m.hidden.data;
    return STRATA_OK;
}

static size_t chunk_len(size_t n, size_t off) {
    return n - off < COLL_TCP_CHUNK ? n - off : COLL_TCP_CHUNK;
}

/* The chain reduction and the result's trip around the ring (collective.h). */
static int tcp_allreduce(struct coll *c, float *data, size_t n, int64_t deadline) {
    const int N = c->size, r = c->rank, last = N - 1, next = (r + 1) % N;
    int rc = STRATA_OK;
    for (size_t off = 0; off < n && !rc; off += COLL_TCP_CHUNK) {
        const size_t len = chunk_len(n, off);
        if (r > 0) {
            const float *partial;
            if ((rc = recv_chunk(c, COLL_OP_PARTIAL, 0, off, len, deadline, &partial))) break;
            /* partial holds x0 + ... + x{r-1}; adding ours on the right keeps rank order */
            for (size_t i = 0; i < len; ++i)
                data[off + i] = partial[i] + data[off + i];
        }
        rc = send_chunk(c, r == last ? COLL_OP_RESULT : COLL_OP_PARTIAL, r == last ? last : 0, data,
                        off, len);
    }
    for (size_t off = 0; off < n && !rc && r != last; off += COLL_TCP_CHUNK) {
        const size_t len = chunk_len(n, off);
        const float *result;
        if ((rc = recv_chunk(c, COLL_OP_RESULT, last, off, len, deadline, &result))) break;
        memcpy(data + off, result, len * sizeof(float));
        if (next != last) rc = send_chunk(c, COLL_OP_RESULT, last, data, off, len);
    }
    return rc ? rc : drain(c, deadline);
}

static int tcp_allgather(struct coll *c, float *out, const float *in, size_t n, int64_t deadline) {
    const int N = c->size, r = c->rank, next = (r + 1) % N;
    if (out + (size_t)r * n != in) memmove(out + (size_t)r * n, in, n * sizeof(float));
    int rc = STRATA_OK;
    for (size_t off = 0; off < n && !rc; off += COLL_TCP_CHUNK)
        rc = send_chunk(c, COLL_OP_GATHER, r, out + (size_t)r * n, off, chunk_len(n, off));
    for (int k = 1; k < N && !rc; ++k) {
        const int origin = (r - k + N) % N;
        float *block = out + (size_t)origin * n;
        for (size_t off = 0; off < n && !rc; off += COLL_TCP_CHUNK) {
            const size_t len = chunk_len(n, off);
            const float *got;
            if ((rc = recv_chunk(c, COLL_OP_GATHER, origin, off, len, deadline, &got))) break;
            memcpy(block + off, got, len * sizeof(float));
            if (next != origin) rc = send_chunk(c, COLL_OP_GATHER, origin, block, off, len);
        }
    }
    return rc ? rc : drain(c, deadline);
}

static int tcp_broadcast(struct coll *c, float *data, size_t n, int root, int64_t deadline) {
    const int next = (c->rank + 1) % c->size;
    int rc = STRATA_OK;
    for (size_t off = 0; off < n && !rc; off += COLL_TCP_CHUNK) {
        const size_t len = chunk_len(n, off);
        if (c->rank != root) {
            const float *got;
            if ((rc = recv_chunk(c, COLL_OP_BCAST, root, off, len, deadline, &got))) break;
            memcpy(data + off, got, len * sizeof(float));
        }
        if (next != root) rc = send_chunk(c, COLL_OP_BCAST, root, data, off, len);
    }
    return rc ? rc : drain(c, deadline);
}

/* ---- public operations ------------------------------------------------------------ */

int coll_allreduce_sum(struct coll *c, float *data, size_t n) {
    int rc = check_ready(c, "all-reduce", n);
    if (rc || c->size == 1 || n == 0) return rc;
    if (!data) return strata_set_error(STRATA_EINVAL, "all-reduce: null data");
    const uint64_t start = coll_now_ns();
    rc = c->transport == COLL_SHM ? coll_shm_allreduce(c, data, n)
                                  : tcp_allreduce(c, data, n, coll_now_ms() + c->timeout_ms);
    ++c->seq;
    count_op(&c->stats.allreduce, n, start);
    return rc ? coll_fail(c, rc, "all-reduce") : STRATA_OK;
}

int coll_allgather(struct coll *c, float *out, const float *in, size_t n) {
    int rc = check_ready(c, "all-gather", n);
    if (rc || n == 0) return rc;
    if (!out || !in) return strata_set_error(STRATA_EINVAL, "all-gather: null buffer");
    if (c->size == 1) {
        if (out != in) memmove(out, in, n * sizeof(float));
        return STRATA_OK;
    }
    const uint64_t start = coll_now_ns();
    rc = c->transport == COLL_SHM ? coll_shm_allgather(c, out, in, n)
                                  : tcp_allgather(c, out, in, n, coll_now_ms() + c->timeout_ms);
    ++c->seq;
    count_op(&c->stats.allgather, n, start);
    return rc ? coll_fail(c, rc, "all-gather") : STRATA_OK;
}

int coll_broadcast(struct coll *c, float *data, size_t n, int root) {
    int rc = check_ready(c, "broadcast", n);
    if (rc) return rc;
    if (root < 0 || root >= c->size)
        return strata_set_error(STRATA_EINVAL, "broadcast: root %d is outside [0, %d)", root,
                                c->size);
    if (c->size == 1 || n == 0) return STRATA_OK;
    if (!data) return strata_set_error(STRATA_EINVAL, "broadcast: null data");
    const uint64_t start = coll_now_ns();
    rc = c->transport == COLL_SHM ? coll_shm_broadcast(c, data, n, root)
                                  : tcp_broadcast(c, data, n, root, coll_now_ms() + c->timeout_ms);
    ++c->seq;
    count_op(&c->stats.broadcast, n, start);
    return rc ? coll_fail(c, rc, "broadcast") : STRATA_OK;
}

int coll_set_timeout(struct coll *c, int timeout_ms) {
    if (!c || timeout_ms < 1)
        return strata_set_error(STRATA_EINVAL, "coll_set_timeout: %d ms", timeout_ms);
    pthread_mutex_lock(&c->mu); /* the sender thread reads it after taking an item */
    c->timeout_ms = timeout_ms;
    pthread_mutex_unlock(&c->mu);
    return STRATA_OK;
}

void coll_stats_get(const struct coll *c, struct coll_stats *out) {
    if (c)
        *out = c->stats;
    else
        memset(out, 0, sizeof *out);
}

int coll_timeout(const struct coll *c) {
    return c->timeout_ms;
}

enum coll_transport coll_transport_of(const struct coll *c) {
    return c->transport;
}
int coll_rank(const struct coll *c) {
    return c->rank;
}
int coll_size(const struct coll *c) {
    return c->size;
}

/* ---- opening the ring ------------------------------------------------------------- */

static void fill_hello(struct wire_hello *h, const struct coll *c, const struct coll_options *o) {
    memset(h, 0, sizeof *h);
    h->role = WIRE_ROLE_STAGE;
    h->stage_index = c->rank;
    h->layer_start = c->size;
    h->layer_end = c->size;
    if (o->fingerprint) {
        h->has_fingerprint = 1;
        memcpy(h->fingerprint, o->fingerprint, WIRE_FINGERPRINT_BYTES);
    }
    snprintf(h->name, sizeof h->name, "coll %s", c->group);
}

/* The peer on a ring link must be rank `want` of a group of the same name and size. */
static int check_peer(const struct coll *c, const struct wire_hello *self,
                      const struct wire_hello *peer, int want) {
    if (strcmp(peer->name, self->name) != 0)
        return strata_set_error(STRATA_EINVAL, "peer is \"%s\", not a rank of group \"%s\"",
                                peer->name, c->group);
    if (peer->stage_index != want || peer->layer_start != c->size)
        return strata_set_error(STRATA_EINVAL,
                                "peer says it is rank %d of %d; expected rank %d of %d",
                                (int)peer->stage_index, (int)peer->layer_start, want, c->size);
    return STRATA_OK;
}

static int link_security(struct wire_conn *conn, const struct coll_options *o, int server,
                         int64_t deadline) {
    if (!o->tls) return STRATA_OK;
    int left = (int)(deadline - coll_now_ms());
    if (left <= 0) return strata_set_error(STRATA_ETIMEOUT, "no time left for the TLS handshake");
    return server ? wire_tls_accept(conn, o->tls, left) : wire_tls_connect(conn, o->tls, left);
}

static int connect_next(struct coll *c, const struct coll_options *o, int64_t deadline) {
    const int next = (c->rank + 1) % c->size;
    const char *host = o->hosts && o->hosts[next] ? o->hosts[next] : WIRE_DEFAULT_HOST;
    int rc;
    for (;;) { /* the next rank may not listen yet: retry until the deadline */
        int64_t left = deadline - coll_now_ms();
        if (left <= 0)
            return wrap_error(STRATA_ETIMEOUT, "connecting to rank %d at %s:%d", next, host,
                              o->ports[next]);
        rc = wire_connect(&c->next, host, o->ports[next], 0, (int)left);
        if (rc == 0) break;
        wire_close(&c->next);
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL);
    }
    struct wire_hello self, peer;
    fill_hello(&self, c, o);
    if ((rc = link_security(&c->next, o, 0, deadline))) return rc;
    int left = (int)(deadline - coll_now_ms());
    if ((rc = wire_handshake_client(&peer, &c->next, &self, o->key, left > 0 ? left : 1)))
        return wrap_error(rc, "Hello with rank %d", next);
    return check_peer(c, &self, &peer, next);
}

static int accept_prev(struct coll *c, const struct coll_options *o, int64_t deadline) {
    const int prev = (c->rank + c->size - 1) % c->size;
    int left = (int)(deadline - coll_now_ms());
    int rc = left <= 0 ? strata_set_error(STRATA_ETIMEOUT, "no time left")
                       : wire_accept(&c->prev, &c->listener, 0, left);
    if (rc) return wrap_error(rc, "waiting for rank %d to connect", prev);
    if ((rc = link_security(&c->prev, o, 1, deadline))) return rc;
    struct wire_hello self, peer;
    fill_hello(&self, c, o);
    left = (int)(deadline - coll_now_ms());
    if ((rc = wire_handshake_server(&peer, &c->prev, &self, o->key, left > 0 ? left : 1)))
        return wrap_error(rc, "Hello from rank %d", prev);
    if ((rc = check_peer(c, &self, &peer, prev))) {
        char why[256];
        snprintf(why, sizeof why, "%s", strata_last_error());
        wire_send_error(&c->prev, rc, 0, why);
        return strata_set_error(rc, "%s", why);
    }
    return STRATA_OK;
}

static int check_options(const struct coll_options *o) {
    if (!o) return strata_set_error(STRATA_EINVAL, "collective: null options");
    if (o->size < 1 || o->size > COLL_MAX_RANKS || o->rank < 0 || o->rank >= o->size)
        return strata_set_error(STRATA_EINVAL,
                                "collective: rank %d of %d (need 0 <= rank < size <= %d)", o->rank,
                                o->size, COLL_MAX_RANKS);
    if (!o->group || !o->group[0] || strlen(o->group) > 48)
        return strata_set_error(STRATA_EINVAL, "collective: group name of 1 to 48 characters");
    if (o->timeout_ms < 0) return strata_set_error(STRATA_EINVAL, "collective: timeout < 0");
    return STRATA_OK;
}

/* A communicator with no links yet. */
static int coll_new(struct coll **out, const struct coll_options *o, enum coll_transport t) {
    *out = NULL;
    int rc = check_options(o);
    if (rc) return rc;
    struct coll *c = calloc(1, sizeof *c);
    if (!c) return strata_set_error(STRATA_ENOMEM, "collective: out of memory");
    c->transport = t;
    c->rank = o->rank;
    c->size = o->size;
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : COLL_DEFAULT_TIMEOUT_MS;
    snprintf(c->group, sizeof c->group, "%s", o->group);
    c->next.fd = c->prev.fd = c->listener.fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    *out = c;
    return STRATA_OK;
}

int coll_open_tcp(struct coll **out, const struct coll_options *o) {
    if (!out) return strata_set_error(STRATA_EINVAL, "coll_open_tcp: null output");
    *out = NULL;
    struct coll *c;
    int rc = coll_new(&c, o, COLL_TCP);
    if (rc) return rc;
    if (o->size > 1 && !o->ports) {
        coll_close(c);
        return strata_set_error(STRATA_EINVAL, "collective: TCP needs every rank's port");
    }
    if (o->listener) {
        c->listener = *o->listener;
        memset(o->listener, 0, sizeof *o->listener);
        o->listener->fd = -1;
    } else if (o->size > 1) {
        const char *host = o->listen_host                  ? o->listen_host
                           : o->hosts && o->hosts[o->rank] ? o->hosts[o->rank]
                                                           : WIRE_DEFAULT_HOST;
        rc = wire_listen(&c->listener, host, o->ports[o->rank]);
    }
    const int64_t deadline = coll_now_ms() + c->timeout_ms;
    if (!rc && o->size > 1) { /* even ranks connect first, odd ones accept first: no cycle */
        if (c->rank % 2 == 0) {
            rc = connect_next(c, o, deadline);
            if (!rc) rc = accept_prev(c, o, deadline);
        } else {
            rc = accept_prev(c, o, deadline);
            if (!rc) rc = connect_next(c, o, deadline);
        }
    }
    if (!rc && o->size > 1) {
        rc = pthread_create(&c->sender, NULL, sender_main, c)
                 ? strata_set_error(STRATA_ENOMEM, "collective: cannot start the sender thread")
                 : STRATA_OK;
        c->sender_started = rc == 0;
    }
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof msg, "opening collective group \"%s\" as rank %d of %d: %s", o->group,
                 o->rank, o->size, strata_last_error());
        coll_close(c);
        return strata_set_error(rc, "%s", msg);
    }
    *out = c;
    return STRATA_OK;
}

int coll_open_shm(struct coll **out, const struct coll_options *o) {
    if (!out) return strata_set_error(STRATA_EINVAL, "coll_open_shm: null output");
    *out = NULL;
    struct coll *c;
    int rc = coll_new(&c, o, COLL_SHM);
    if (rc) return rc;
    if (o->size > 1 && (rc = coll_shm_open(c, o))) {
        char msg[600];
        snprintf(msg, sizeof msg, "opening shared-memory group \"%s\" as rank %d of %d: %s",
                 o->group, o->rank, o->size, strata_last_error());
        coll_close(c);
        return strata_set_error(rc, "%s", msg);
    }
    *out = c;
    return STRATA_OK;
}

/* FNV-1a of the host name and the kernel's boot id: equal on every rank of one host. */
static uint64_t host_identity(void) {
    char id[512] = "";
    gethostname(id, 255);
    size_t used = strlen(id);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        used += fread(id + used, 1, sizeof id - used - 1, f);
        fclose(f);
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < used; ++i)
        h = (h ^ (uint8_t)id[i]) * 0x100000001b3ull;
    return h;
}

/* The identities of every rank (all-gathered as bit patterns in floats): all equal? */
static int all_on_this_host(struct coll *c, int *same) {
    float mine[2], *all = calloc((size_t)c->size * 2, sizeof *all);
    if (!all) return strata_set_error(STRATA_ENOMEM, "collective: out of memory");
    uint64_t id = host_identity();
    memcpy(mine, &id, sizeof id);
    int rc = coll_allgather(c, all, mine, 2);
    *same = 1;
    for (int q = 0; q < c->size && !rc; ++q)
        if (memcmp(all + 2 * q, mine, sizeof mine) != 0) *same = 0;
    free(all);
    return rc;
}

int coll_open(struct coll **out, const struct coll_options *o) {
    int rc = coll_open_tcp(out, o);
    if (rc || o->tcp_only || o->size == 1) return rc;
    struct coll *c = *out;
    int same = 0;
    if ((rc = all_on_this_host(c, &same)) || !same) goto done;
    uint32_t token[2] = {(uint32_t)getpid(), 0}; /* rank 0's pid and a random word */
    if (c->rank == 0 && getrandom(&token[1], sizeof token[1], 0) != sizeof token[1])
        token[1] = (uint32_t)coll_now_ms() ^ (uint32_t)(uintptr_t)c;
    float wire_token[2];
    memcpy(wire_token, token, sizeof token);
    if ((rc = coll_broadcast(c, wire_token, 2, 0))) goto done;
    memcpy(token, wire_token, sizeof token);
    char name[64];
    snprintf(name, sizeof name, "/strata-coll-%08x-%08x", token[0], token[1]);
    struct coll_options so = *o;
    so.shm_name = name;
    if ((rc = coll_shm_open(c, &so))) goto done;
    c->transport = COLL_SHM;
done:
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof msg, "choosing the transport of group \"%s\": %s", o->group,
                 strata_last_error());
        coll_close(c);
        *out = NULL;
        return strata_set_error(rc, "%s", msg);
    }
    memset(&c->stats, 0, sizeof c->stats); /* choosing the transport is not the group's work */
    return STRATA_OK;
}

void coll_close(struct coll *c) {
    if (!c) return;
    if (c->sender_started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = 1;
        if (c->broken) c->send_error = c->send_error ? c->send_error : STRATA_ECANCELED;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->sender, NULL);
    }
    while (c->head) {
        struct coll_item *it = c->head;
        c->head = it->next;
        wire_arena_free(&it->arena);
        free(it);
    }
    if (c->shm) coll_shm_close(c);
    wire_close(&c->next);
    wire_close(&c->prev);
    wire_listener_close(&c->listener);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
