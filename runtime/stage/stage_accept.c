/* Concurrent, bounded handshakes for a stage's listener, on an event loop
 * (runtime/base/event_loop.h: a file event per pending handshake, a timer per deadline); see
 * stage_accept.h for why one thread and for the limits. */
#include "runtime/stage/stage_accept.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "runtime/base/cli.h"
#include "runtime/base/event_loop.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"

#define SUMMARY_EVERY_MS 10000
#define HANDSHAKE_SEND_TIMEOUT_MS 500 /* a Hello into a fresh socket's empty send buffer */
#define ACCEPTS_PER_WAKE 128
#define DEFER_ACCEPT_S 1 /* how long the kernel holds a silent TLS connection (see below) */
/* A pending handshake's time to finish before a newcomer with less progress may take its
 * place (see may_replace). */
#define GRACE_MS 250
#define STOP_CHECK_MS 100 /* how long a pass may wait before the stop flags are read again */

/* ---- per-address accounting ---- */

int stage_addr_table_init(struct stage_addr_table *t, int capacity, int fail_burst,
                          double fail_per_s) {
    memset(t, 0, sizeof *t);
    t->entries = calloc((size_t)capacity, sizeof *t->entries);
    if (!t->entries) return strata_set_error(STRATA_ENOMEM, "accept: out of memory");
    t->capacity = capacity;
    t->fail_burst = fail_burst;
    t->fail_per_s = fail_per_s;
    return 0;
}

void stage_addr_table_free(struct stage_addr_table *t) {
    if (!t) return;
    free(t->entries);
    memset(t, 0, sizeof *t);
}

/* "host:port" -> "host" (IPv6 peers are written without brackets: the last ':' is the
 * port's). */
static void addr_of(char *out, const char *peer) {
    const char *colon = strrchr(peer, ':');
    size_t n = colon ? (size_t)(colon - peer) : strlen(peer);
    if (n >= STAGE_ADDR_LEN) n = STAGE_ADDR_LEN - 1;
    memcpy(out, peer, n);
    out[n] = '\0';
}

struct stage_addr_entry *stage_addr_lookup(struct stage_addr_table *t, const char *peer,
                                           int64_t now) {
    char addr[STAGE_ADDR_LEN];
    struct stage_addr_entry *reuse = NULL;
    addr_of(addr, peer);
    for (int i = 0; i < t->capacity; i++) {
        struct stage_addr_entry *e = &t->entries[i];
        if (e->addr[0] && strcmp(e->addr, addr) == 0) {
            e->used_ms = now;
            return e;
        }
        if (e->handshaking == 0 &&
            (!reuse || !e->addr[0] || (reuse->addr[0] && e->used_ms < reuse->used_ms)))
            reuse = e;
    }
    if (!reuse) return NULL;
    memset(reuse, 0, sizeof *reuse);
    snprintf(reuse->addr, sizeof reuse->addr, "%s", addr);
    reuse->tokens = t->fail_burst;
    reuse->refill_ms = reuse->used_ms = now;
    return reuse;
}

static void refill(struct stage_addr_table *t, struct stage_addr_entry *e, int64_t now) {
    if (now > e->refill_ms) {
        e->tokens += (double)(now - e->refill_ms) * t->fail_per_s / 1000.0;
        if (e->tokens > t->fail_burst) e->tokens = t->fail_burst;
    }
    e->refill_ms = now;
}

int stage_addr_allowed(struct stage_addr_table *t, struct stage_addr_entry *e, int64_t now) {
    refill(t, e, now);
    return e->tokens >= 1.0;
}

void stage_addr_failed(struct stage_addr_table *t, struct stage_addr_entry *e, int64_t now) {
    refill(t, e, now);
    e->tokens = e->tokens >= 1.0 ? e->tokens - 1.0 : 0.0;
    e->failed++;
}

/* ---- the handshake table ---- */

enum hs_state { HS_FREE = 0, HS_TLS, HS_HELLO };

struct pending {
    enum hs_state state;
    short events; /* what the handshake waits for (POLLIN / POLLOUT, wire_tls_step's) */
    struct wire_conn conn;
    struct wire_handshake hs;
    int64_t started_ms, deadline_ms;
    int64_t timer;  /* its deadline's timer on the loop (0: none) */
    uint64_t order; /* admission order: "oldest" without the ties of a millisecond clock */
    struct stage_addr_entry *addr;
    struct acceptor *acceptor; /* the file event's and the timer's data */
};

struct acceptor {
    struct stage_accept_options o; /* with defaults filled in */
    struct stage_addr_table table;
    struct pending *slots; /* [o.max_handshakes] */
    int active;
    struct event_loop *loop;
    int listening;     /* the listener's fd is registered on the loop */
    int accept_due;    /* the listener had connections waiting: admit them after the pass */
    int64_t accept_at; /* the timer that admits them (0: none) */
    stage_accept_deliver deliver;
    void *ctx;
    atomic_int *closing; /* close_listener: a draining stage completes no new handshake */
    uint64_t timed_out, replaced, turned_away; /* since the last summary */
    uint64_t admitted;                         /* connections admitted so far */
    int64_t summary_ms;
};

/* The loop's mask for what a handshake waits for. */
static int loop_mask(short events) {
    int m = (events & POLLOUT) ? EVENT_WRITE : 0;
    return m | ((events & POLLIN) || !events ? EVENT_READ : 0);
}

static void release(struct acceptor *a, struct pending *p, int close_conn) {
    if (p->conn.fd >= 0) event_del_file(a->loop, p->conn.fd);
    if (p->timer) event_del_timer(a->loop, p->timer);
    if (close_conn) wire_close(&p->conn);
    if (p->addr) p->addr->handshaking--;
    memset(p, 0, sizeof *p);
    p->conn.fd = -1;
    a->active--;
}

/* Logs a refused handshake; counts it against the address unless the peer only went away
 * or ran out of time: an idle, trickling or closed connection proves no key wrong. What
 * TLS or the Hello refused (a wrong binder, proof, certificate or frame) counts even when
 * the peer has closed its side since (a half-closed guesser still reads the verdict). */
static void refuse(struct acceptor *a, struct pending *p, int rc, int64_t now) {
    int quiet = rc == STRATA_ETIMEOUT || rc == STRATA_ECLOSED;
    if (quiet) {
        strata_log(STRATA_LOG_DEBUG, "connection from %s ended before its handshake: %s",
                   p->conn.peer, strata_last_error());
    } else {
        stage_addr_failed(&a->table, p->addr, now);
        strata_log(STRATA_LOG_WARN, "refused connection from %s: %s", p->conn.peer,
                   strata_last_error());
    }
    release(a, p, 1);
}

/* Advances one handshake as far as its bytes allow; what it waits for next is what the loop
 * watches its fd for. */
static void advance(struct acceptor *a, struct pending *p, int64_t now) {
    for (;;) {
        int rc;
        if (p->state == HS_TLS) {
            rc = wire_tls_step(&p->conn, a->o.tls, &p->events);
            if (rc == WIRE_TLS_PENDING) {
                event_modify_file(a->loop, p->conn.fd, loop_mask(p->events));
                return;
            }
            if (rc == 0)
                rc = wire_handshake_server_start(&p->hs, &p->conn, &a->o.self, a->o.key,
                                                 HANDSHAKE_SEND_TIMEOUT_MS);
            if (rc < 0) {
                refuse(a, p, rc, now);
                return;
            }
            p->state = HS_HELLO;
            p->events = POLLIN;
            continue;
        }
        const uint8_t *frame;
        size_t len;
        struct wire_hello peer;
        rc = wire_recv_frame_nb(&p->conn, &frame, &len);
        if (rc == WIRE_RECV_PENDING) {
            p->events = POLLIN;
            event_modify_file(a->loop, p->conn.fd, EVENT_READ);
            return;
        }
        if (rc == 0 && atomic_load(a->closing)) { /* draining since the handshake began */
            release(a, p, 1);
            return;
        }
        if (rc == 0)
            rc = wire_handshake_server_finish(&p->hs, &peer, &p->conn, frame, len,
                                              HANDSHAKE_SEND_TIMEOUT_MS);
        if (rc < 0) {
            refuse(a, p, rc, now);
            return;
        }
        /* the taker owns the conn now: off this loop first, the fd stays open */
        event_del_file(a->loop, p->conn.fd);
        a->deliver(a->ctx, &p->conn, &peer);
        p->conn.fd = -1;
        release(a, p, 0);
        return;
    }
}

/* A pending handshake's socket is ready. */
static void on_handshake(struct event_loop *loop, int fd, void *data, int mask) {
    struct pending *p = data;
    (void)loop, (void)fd, (void)mask;
    if (p->state != HS_FREE) advance(p->acceptor, p, cli_now_ms());
}

/* How far a pending handshake has come (wire_tls_progress's scale; the Hello after TLS
 * counts as done with TLS). A plaintext Hello is one frame: some of it, or nothing. */
static int progress(const struct acceptor *a, const struct pending *p) {
    if (p->state == HS_HELLO && a->o.tls) return WIRE_TLS_DONE;
    if (p->state == HS_HELLO)
        return p->conn.rx_prefix_have || p->conn.rx_have ? WIRE_TLS_BYTES : WIRE_TLS_NOTHING;
    return (int)wire_tls_progress(&p->conn);
}

/* The pending handshake to drop for a newcomer, of one address or of all (addr NULL): the
 * one that has come least far, the oldest of those. Why progress first: a reconnect flood
 * holds sockets that never send a byte, while a real peer's ClientHello is usually in the
 * socket by the time it is accepted, and the peer answers within a round trip; dropping by
 * age alone evicted real peers mid-handshake whenever a flood outpaced them. Within a level
 * the oldest is the one most likely stalling (a real peer finishes in milliseconds). */
static struct pending *victim(struct acceptor *a, const struct stage_addr_entry *addr) {
    struct pending *best = NULL;
    int best_level = 0;
    for (int i = 0; i < a->o.max_handshakes; i++) {
        struct pending *p = &a->slots[i];
        if (p->state == HS_FREE || (addr && p->addr != addr)) continue;
        int level = progress(a, p);
        if (!best || level < best_level || (level == best_level && p->order < best->order)) {
            best = p;
            best_level = level;
        }
    }
    return best;
}

static void summarize_drops(struct stage_addr_entry *e, int64_t now) {
    if (e->summary_ms && now - e->summary_ms < SUMMARY_EVERY_MS) return;
    strata_log(STRATA_LOG_WARN,
               "rate-limiting %s: %llu failed handshakes, %llu connections closed unanswered "
               "since the last such line (failures allowed: a burst, then a few per second)",
               e->addr, (unsigned long long)e->failed, (unsigned long long)e->dropped);
    e->failed = e->dropped = 0;
    e->summary_ms = now;
}

/* The dropped handshakes' summary line, at most every SUMMARY_EVERY_MS. */
static void summarize_table(struct acceptor *a, int64_t now) {
    if (!(a->timed_out || a->replaced || a->turned_away) || now - a->summary_ms < SUMMARY_EVERY_MS)
        return;
    strata_log(STRATA_LOG_INFO,
               "handshakes dropped: %llu past their %d ms deadline, %llu replaced by newer "
               "connections as far along, or further, or after %d ms; %llu new connections "
               "turned away (at most %d at once, %d per address)",
               (unsigned long long)a->timed_out, a->o.handshake_timeout_ms,
               (unsigned long long)a->replaced, GRACE_MS, (unsigned long long)a->turned_away,
               a->o.max_handshakes, a->o.max_per_address);
    a->timed_out = a->replaced = a->turned_away = 0;
    a->summary_ms = now;
}

/* How far a fresh connection has come before any work on it, on progress()'s scale, from
 * the bytes waiting on its socket: nothing, some, or (TLS) a whole first record, which a
 * real peer's ClientHello is: it sends it as soon as it is connected. */
static int arrival_level(const struct acceptor *a, const struct wire_conn *conn) {
    uint8_t head[5];
    ssize_t n = recv(conn->fd, head, sizeof head, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return WIRE_TLS_NOTHING;
    if (!a->o.tls || n < (ssize_t)sizeof head || head[0] != 0x16) return WIRE_TLS_BYTES;
    size_t record = sizeof head + ((size_t)head[3] << 8 | head[4]);
    uint8_t *all = malloc(record);
    ssize_t have = all ? recv(conn->fd, all, record, MSG_PEEK | MSG_DONTWAIT) : 0;
    free(all);
    return have == (ssize_t)record ? WIRE_TLS_ANSWERING : WIRE_TLS_BYTES;
}

/* Whether a newcomer at `level` may take the place of pending handshake p (the least far
 * along, the oldest of those): one that has come no further than the newcomer, or one
 * further along that has had its grace. Why the grace: without it a silent newcomer could
 * take the place of a real peer mid-handshake; a peer further along that has not finished
 * after GRACE_MS is more likely stalling than slow. A plaintext newcomer cannot have sent
 * anything yet (the server's Hello comes first), so there nothing tells it from a flood and
 * the least far along goes. */
static int may_replace(const struct acceptor *a, const struct pending *p, int level, int64_t now) {
    return !a->o.tls || progress(a, p) <= level || now - p->started_ms >= GRACE_MS;
}

/* A pending handshake's deadline: dropped, whatever it sends (a silent or trickling peer). */
static int64_t on_deadline(struct event_loop *loop, int64_t id, void *data) {
    struct pending *p = data;
    struct acceptor *a = p->acceptor;
    (void)loop, (void)id;
    p->timer = 0; /* this one ends here */
    strata_log(STRATA_LOG_DEBUG, "handshake with %s timed out after %d ms", p->conn.peer,
               a->o.handshake_timeout_ms);
    a->timed_out++;
    release(a, p, 1);
    summarize_table(a, cli_now_ms());
    return EVENT_TIMER_DONE;
}

/* Takes one accepted connection into the table (or refuses it by the limits). */
static void admit(struct acceptor *a, struct wire_conn *conn, int64_t now) {
    struct stage_addr_entry *e = stage_addr_lookup(&a->table, conn->peer, now);
    struct pending *p = NULL;
    if (e && !stage_addr_allowed(&a->table, e, now)) {
        e->dropped++;
        summarize_drops(e, now);
        wire_close(conn);
        return;
    }
    int level = arrival_level(a, conn);
    if (e && e->handshaking >= a->o.max_per_address) p = victim(a, e);
    if (!p && a->active >= a->o.max_handshakes) p = victim(a, NULL);
    if (p && !may_replace(a, p, level, now)) {
        a->turned_away++;
        wire_close(conn);
        return;
    }
    if (p) {
        a->replaced++;
        release(a, p, 1);
    }
    if (!e) e = stage_addr_lookup(&a->table, conn->peer, now); /* a slot freed above */
    for (int i = 0; !p && i < a->o.max_handshakes; i++)
        if (a->slots[i].state == HS_FREE) p = &a->slots[i];
    if (!e || !p) {
        wire_close(conn);
        return;
    }
    wire_conn_move(&p->conn, conn);
    p->acceptor = a;
    p->addr = e;
    e->handshaking++;
    a->active++;
    p->started_ms = now;
    p->order = ++a->admitted;
    p->deadline_ms = now + a->o.handshake_timeout_ms;
    p->state = a->o.tls ? HS_TLS : HS_HELLO;
    int rc = event_add_file(a->loop, p->conn.fd, EVENT_READ, on_handshake, NULL, p);
    if (rc == 0) {
        int64_t t = event_add_timer_at(a->loop, p->deadline_ms, on_deadline, p);
        rc = t < 0 ? (int)t : 0;
        p->timer = t > 0 ? t : 0;
    }
    if (rc == 0)
        rc = a->o.tls ? wire_tls_start(&p->conn, a->o.tls, 1)
                      : wire_handshake_server_start(&p->hs, &p->conn, &a->o.self, a->o.key,
                                                    HANDSHAKE_SEND_TIMEOUT_MS);
    if (rc < 0)
        refuse(a, p, rc, now);
    else
        advance(a, p, now);
}

/* Admits what the listener holds, after the pass that saw it: the handshakes that pass
 * served have moved up by the bytes their peers sent (see victim) before a batch of
 * newcomers is admitted against them. */
static int64_t on_accept_due(struct event_loop *loop, int64_t id, void *data) {
    struct acceptor *a = data;
    (void)loop, (void)id;
    a->accept_at = 0;
    a->accept_due = 0;
    int64_t now = cli_now_ms();
    for (int k = 0; a->listening && k < ACCEPTS_PER_WAKE; k++) {
        struct wire_conn conn;
        int rc = wire_accept(&conn, a->o.listener, WIRE_HANDSHAKE_MAX_FRAME, 0);
        if (rc == STRATA_ETIMEOUT) break;
        if (rc < 0) {
            strata_log(STRATA_LOG_WARN, "accept failed: %s", strata_last_error());
            break; /* e.g. out of descriptors: wait for the listener again rather than spin */
        }
        admit(a, &conn, now);
    }
    summarize_table(a, now);
    return EVENT_TIMER_DONE;
}

static void on_listener(struct event_loop *loop, int fd, void *data, int mask) {
    struct acceptor *a = data;
    (void)fd, (void)mask;
    if (a->accept_due) return;
    int64_t t = event_add_timer(loop, 0, on_accept_due, a);
    if (t > 0) {
        a->accept_due = 1;
        a->accept_at = t;
    }
}

static void drop_all(struct acceptor *a) {
    for (int i = 0; a->slots && i < a->o.max_handshakes; i++)
        if (a->slots[i].state != HS_FREE) release(a, &a->slots[i], 1);
}

static void stop_listening(struct acceptor *a) {
    if (!a->listening) return;
    event_del_file(a->loop, a->o.listener->fd);
    if (a->accept_at) event_del_timer(a->loop, a->accept_at);
    a->accept_at = 0;
    a->accept_due = 0;
    a->listening = 0;
}

static void acceptor_free(struct acceptor *a) {
    drop_all(a);
    stop_listening(a);
    stage_addr_table_free(&a->table);
    free(a->slots);
    event_loop_free(a->loop);
}

static int acceptor_init(struct acceptor *a, const struct stage_accept_options *opt) {
    memset(a, 0, sizeof *a);
    a->o = *opt;
    if (!a->o.handshake_timeout_ms) a->o.handshake_timeout_ms = 3000;
    if (!a->o.max_handshakes) a->o.max_handshakes = 256;
    if (!a->o.max_per_address) a->o.max_per_address = 32;
    if (!a->o.fail_burst) a->o.fail_burst = 10;
    if (a->o.fail_per_s <= 0) a->o.fail_per_s = 2;
    a->slots = calloc((size_t)a->o.max_handshakes, sizeof *a->slots);
    if (!a->slots || stage_addr_table_init(&a->table, 2 * a->o.max_handshakes, a->o.fail_burst,
                                           a->o.fail_per_s) < 0)
        return strata_set_error(STRATA_ENOMEM, "accept: out of memory");
    for (int i = 0; i < a->o.max_handshakes; i++)
        a->slots[i].conn.fd = -1;
    int rc = event_loop_create(&a->loop, a->o.max_handshakes + 1);
    if (rc < 0) return rc;
    if (a->o.listener->fd >= 0) {
        rc = event_add_file(a->loop, a->o.listener->fd, EVENT_READ, on_listener, NULL, a);
        if (rc < 0) return rc;
        a->listening = 1;
    }
    /* TLS: the client speaks first, so the kernel may hold a connection until its first
     * bytes arrive (TCP_DEFER_ACCEPT): a reconnect flood of silent connections then reaches
     * the table only after a second of silence, and a real peer, whose ClientHello is
     * waiting when it is accepted, takes the place of such a one (may_replace). Only a
     * second: a peer without TLS waits silently for a Hello too, and should still hear the
     * close of the handshake deadline within its own timeout. A plaintext Hello starts
     * with the server's, so plaintext listeners accept at once. */
    int defer_s = DEFER_ACCEPT_S;
    if (a->o.tls && a->o.listener->fd >= 0 &&
        setsockopt(a->o.listener->fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof defer_s) < 0)
        strata_log(STRATA_LOG_WARN,
                   "accept: TCP_DEFER_ACCEPT: %s (silent connections reach the handshake table)",
                   strerror(errno));
    return 0;
}

int stage_accept_run(const struct stage_accept_options *opt, stage_accept_deliver deliver,
                     void *ctx, atomic_int *stop, atomic_int *close_listener) {
    struct acceptor a;
    int rc = acceptor_init(&a, opt);
    a.deliver = deliver;
    a.ctx = ctx;
    a.closing = close_listener;
    while (rc == 0 && !atomic_load(stop)) {
        if (atomic_load(close_listener) && a.o.listener->fd >= 0) {
            stop_listening(&a);
            wire_listener_close(a.o.listener);
            drop_all(&a);
            strata_log(STRATA_LOG_INFO, "stopped accepting connections");
        }
        /* the flags are set by other threads (and signal handlers): a pass waits at most
         * STOP_CHECK_MS for them */
        if (event_loop_run_once(a.loop, STOP_CHECK_MS) < 0)
            strata_log(STRATA_LOG_WARN, "accept: %s", strata_last_error());
    }
    acceptor_free(&a);
    return rc;
}
