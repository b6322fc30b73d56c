/* strata-stage's event loop: acceptor thread + event loop (runtime/base/event_loop.h)
 * around the stage core.
 * Why threads for accepting and connecting: handshakes wait on the peer (up to 3 s each
 * for a silent one), and two stages that connect to each other (the ring with S = 2, or
 * any restart) must answer each other while they wait. The acceptor thread runs every
 * pending handshake concurrently under deadlines and per-address limits (stage_accept.h);
 * the connector thread makes the link to the next stage; both hand finished connections
 * to the loop, which never waits on a handshake. The loop reads every connection without
 * blocking (wire_recv_frame_nb): a peer that stops mid-frame keeps its partial frame in
 * its own buffer and holds no one else up, and is dropped when the frame is not complete
 * within io_timeout_ms. See stage_server.h for the connection model and the drain.
 * This file owns the loop's thread: a file event per link, frames in and out, results,
 * the timers (keepalive, stalled peers, recovery, describe, vision transfers: each on its
 * own cadence rather than on every pass), the drain. Making, checking and adopting links
 * (the two threads' side) is stage_server_link.c; the state both share is
 * stage_server_internal.h. */
#include "runtime/stage/stage_server.h"

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
#include "runtime/stage/stage_server_internal.h"
#include "runtime/stage/stage_server_vision.h"
#include "wire/collective.h"
#include "wire/transport.h"

#define CLIENT_MAX_QUEUED ((size_t)1 << 20) /* ~10,000 token frames a client has not read */
/* The last stage's link to stage 0 is queued, never waited on: with blocking sends all round
 * the ring, stages that each wait for the next to read (KV blocks of MBs going both to
 * stage 0 and down from it) wait forever. One link that never blocks breaks every cycle.
 * Room for a largest frame (a KV block) and the tokens behind it. */
#define RING_MAX_QUEUED (2 * WIRE_DEFAULT_MAX_FRAME)
/* The loop waits at most this long: *stop is set by a signal handler that may run on
 * another thread (the acceptor, the connector), and then no poll() of this one ends. */
#define LOOP_MAX_WAIT_MS 100
/* Timer cadences. Recovery and describe keep the core's view of the links and of its
 * deadlines fresh, and a replay should start as soon as the ring is back: short. Stalled
 * peers and idle vision transfers are measured in seconds. */
#define RECOVERY_EVERY_MS 10
#define DESCRIBE_EVERY_MS 10
#define STALLED_EVERY_MS 50
#define VISION_EXPIRE_EVERY_MS 100

void stage_log_setup(int stage_index, enum stage_log_level level) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "stage %d", stage_index);
    strata_log_setup(prefix, (enum strata_log_level)level);
}

/* Whether frames to `link` are queued (wire_send_frame_nb) rather than waited for. */
static int queued_link(const struct server *s, enum stage_link link) {
    return link == STAGE_LINK_CLIENT || (link == STAGE_LINK_NEXT && s->info.num_stages > 1 &&
                                         s->info.stage_index == s->info.num_stages - 1);
}

/* A moving average (1/4 weight to the new sample). */
static void measured(double *avg, double sample) {
    *avg = *avg > 0 ? 0.75 * *avg + 0.25 * sample : sample;
}

/* Sends every frame the core queued; a failed send takes that link down. */
static void flush(struct server *s) {
    struct stage_frame f;
    while (stage_core_pop_frame(s->core, &f)) {
        struct wire_conn *conn = NULL;
        uint32_t cid = 0;
        int timeout = s->opt->io_timeout_ms ? s->opt->io_timeout_ms : 5000;
        if (f.link == STAGE_LINK_LOCAL) {
            if (!s->opt->recv_kv || !s->opt->kv_out_path) {
                if (!s->kv_drop_warned++) /* once: with --send-kv on every stage, each has them */
                    strata_log(STRATA_LOG_WARN, "not writing the KV blocks addressed to this "
                                                "stage (start with --recv-kv --kv-out)");
            } else if (cli_write_file_atomic(s->opt->kv_out_path, f.data, f.len) < 0) {
                strata_log(STRATA_LOG_ERROR, "--kv-out: %s", strata_last_error());
            } else {
                strata_log(STRATA_LOG_INFO, "wrote a %zu-byte KV block to %s", f.len,
                           s->opt->kv_out_path);
            }
        } else if (f.link == STAGE_LINK_PREV) {
            conn = &s->links.prev;
        } else if (f.link == STAGE_LINK_NEXT) {
            conn = &s->links.next;
        } else {
            for (int i = 0; i < MAX_CLIENTS; i++)
                if (s->links.clients[i].fd >= 0 && s->links.client_ids[i] == f.client_id)
                    conn = &s->links.clients[i], cid = f.client_id;
        }
        if (conn && conn->fd >= 0) {
            /* To a client: queued, never waited for (a client that stops reading holds
             * no one up; past CLIENT_MAX_QUEUED it is dropped). */
            int64_t t0 = cli_now_ns();
            int src = !queued_link(s, f.link)
                          ? wire_send_frame(conn, f.data, f.len, timeout)
                          : wire_send_frame_nb(conn, f.data, f.len,
                                               f.link == STAGE_LINK_CLIENT ? CLIENT_MAX_QUEUED
                                                                           : RING_MAX_QUEUED);
            if (src == 0 && f.link == STAGE_LINK_NEXT && f.len >= (64u << 10)) {
                /* The fastest recent send (decaying): a send that waited for a busy peer
                 * to read is slow through no fault of the link. */
                double bps = (double)f.len * 1e9 / (double)(cli_now_ns() - t0 + 1);
                s->costs.link_bps = bps > 0.9 * s->costs.link_bps ? bps : 0.9 * s->costs.link_bps;
            }
            if (src < 0) {
                char why[1024];
                snprintf(why, sizeof why, "send failed: %s", strata_last_error());
                stage_srv_link_down(s, f.link, cid, conn, why);
            }
        } else if (f.link == STAGE_LINK_NEXT) {
            stage_core_on_link_down(s->core, STAGE_LINK_NEXT, 0, "next stage is not connected");
        }
    }
}

/* A TP / KVP leader's collective counters so far (stage_server_options.group). */
static void log_group_stats(const struct coll *group) {
    struct coll_stats st;
    coll_stats_get(group, &st);
    strata_log(STRATA_LOG_INFO,
               "group collectives: all-reduce %llu calls %llu floats %.3f ms, all-gather %llu "
               "calls %llu floats %.3f ms, broadcast %llu calls %llu floats %.3f ms",
               (unsigned long long)st.allreduce.calls, (unsigned long long)st.allreduce.floats,
               (double)st.allreduce.ns / 1e6, (unsigned long long)st.allgather.calls,
               (unsigned long long)st.allgather.floats, (double)st.allgather.ns / 1e6,
               (unsigned long long)st.broadcast.calls, (unsigned long long)st.broadcast.floats,
               (double)st.broadcast.ns / 1e6);
}

static void drain_results(struct server *s) {
    struct stage_result r;
    while (stage_core_pop_result(s->core, &r)) {
        if (r.finish == STAGE_FINISH_ERROR) {
            strata_log(STRATA_LOG_ERROR, "request %llu failed (%s): %s",
                       (unsigned long long)r.nonce, strata_status_name(r.status), r.message);
        } else if (r.finish == STAGE_FINISH_CANCELLED) {
            strata_log(STRATA_LOG_INFO, "request %llu cancelled: %s", (unsigned long long)r.nonce,
                       r.message);
        } else {
            char drafts[96] = "";
            if (r.drafted)
                snprintf(drafts, sizeof drafts, ", %d of %d draft tokens accepted", r.accepted,
                         r.drafted);
            strata_log(STRATA_LOG_INFO, "request %llu finished (%s): prompt %d, %d tokens%s",
                       (unsigned long long)r.nonce,
                       r.finish == STAGE_FINISH_STOP ? "stop" : "length", r.prompt_len, r.n_tokens,
                       drafts);
            if (s->opt->group) log_group_stats(s->opt->group);
            if (s->opt->out_path && r.logits) {
                if (stage_write_out(s->opt->out_path, &r) < 0)
                    strata_log(STRATA_LOG_ERROR, "--out: %s", strata_last_error());
                else
                    strata_log(STRATA_LOG_INFO, "wrote %s", s->opt->out_path);
            }
        }
        stage_result_free(&r);
    }
}

/* An Error frame to a peer: queued without waiting on a client link, else sent with the
 * transport's short timeout. Best effort (the caller may be about to close). */
static void reply_error(struct wire_conn *conn, enum stage_link link, int code, uint64_t nonce,
                        const char *why) {
    struct wire_arena arena;
    struct wire_error err = {code, why, nonce};
    if (link != STAGE_LINK_CLIENT) {
        wire_send_error(conn, code, nonce, why);
        return;
    }
    if (wire_arena_init(&arena, 1024) == 0 && wire_build_error(&arena, &err) == 0)
        wire_send_frame_nb(conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                           CLIENT_MAX_QUEUED);
    wire_arena_free(&arena);
}

/* Frames the driver answers itself on a client link, before the core sees them: control
 * frames other than Cancel and Describe (Ping, Drain, Shutdown are between stages; a client asking
 * gets an immediate Error rather than silence), and, while draining, new Requests on any
 * link. Returns 1 when the frame was answered here. */
static int intercept(struct server *s, struct wire_conn *conn, enum stage_link link,
                     const uint8_t *frame, size_t len) {
    enum wire_kind kind;
    char why[160];
    if (link != STAGE_LINK_CLIENT && !s->draining) return 0; /* stage frames: the core's */
    if (wire_verify(&kind, NULL, frame, len) < 0) return 0;  /* the core reports it */
    if (kind == WIRE_KIND_CONTROL && link == STAGE_LINK_CLIENT) {
        struct wire_control msg;
        if (wire_read_control(&msg, frame, len) < 0 || msg.kind == WIRE_CONTROL_CANCEL ||
            msg.kind == WIRE_CONTROL_DESCRIBE)
            return 0;
        snprintf(why, sizeof why,
                 "stage %d: control frame %d is not accepted from clients (only Cancel, Describe)",
                 s->info.stage_index, (int)msg.kind);
        reply_error(conn, link, STRATA_EINVAL, msg.nonce, why);
        return 1;
    }
    if (kind == WIRE_KIND_REQUEST && s->draining && link != STAGE_LINK_NEXT) {
        struct wire_request msg;
        if (wire_read_request(&msg, frame, len) < 0 || msg.nonce == 0) return 0;
        snprintf(why, sizeof why, "stage %d is shutting down (draining): request refused",
                 s->info.stage_index);
        reply_error(conn, link, STRATA_EBUSY, msg.nonce, why);
        strata_log(STRATA_LOG_INFO, "refused request %llu: draining",
                   (unsigned long long)msg.nonce);
        return 1;
    }
    return 0;
}

/* Feeds one received frame to the core (or answers it: intercept). 0, or -1 when the
 * link was taken down. */
static int feed(struct server *s, struct wire_conn *conn, enum stage_link link, uint32_t cid,
                const uint8_t *frame, size_t len) {
    if (link == STAGE_LINK_PREV)
        s->links.prev_rx_ms = cli_now_ms();
    else if (link == STAGE_LINK_NEXT)
        s->links.next_rx_ms = cli_now_ms();
    if (intercept(s, conn, link, frame, len)) return 0;
    int rc;
    /* A vision stage's link (a client link: its conn is an element of s->links.clients). */
    if (link == STAGE_LINK_CLIENT && s->links.client_vision[conn - s->links.clients] &&
        s->vision_rx)
        rc = stage_vision_on_frame(s->vision_rx, s->core, conn, cid, frame, len, CLIENT_MAX_QUEUED);
    else
        rc = stage_core_on_frame(s->core, link, cid, frame, len);
    if (rc < 0) {
        char why[1024];
        snprintf(why, sizeof why, "bad frame: %s", strata_last_error());
        reply_error(conn, link, rc, 0, why);
        if (link == STAGE_LINK_CLIENT) wire_flush_nb(conn); /* one more try before the close */
        stage_srv_link_down(s, link, cid, conn, why);
        return -1;
    }
    return 0;
}

/* Serves the frames already complete on a readable connection, without waiting for more
 * (up to a bound, so one busy peer cannot starve the others): the next microbatch sees
 * everything that arrived, and a partial frame just stays in the conn's buffer. */
static void serve_ready(struct server *s, struct wire_conn *conn, enum stage_link link,
                        uint32_t cid) {
    for (int i = 0; i < 32; i++) {
        const uint8_t *frame;
        size_t len;
        int rc = wire_recv_frame_nb(conn, &frame, &len);
        if (rc == WIRE_RECV_PENDING) return;
        if (rc < 0) {
            char why[1024];
            snprintf(why, sizeof why, "%s",
                     rc == STRATA_ECLOSED && !wire_conn_partial_since(conn)
                         ? "peer closed the connection"
                         : strata_last_error());
            stage_srv_link_down(s, link, cid, conn, why);
            return;
        }
        if (feed(s, conn, link, cid, frame, len) < 0 || conn->fd < 0) return;
    }
}

/* A peer that started a frame and has not completed it within io_timeout_ms is dropped
 * (its partial frame never held anyone else up; this frees its buffer and slot). */
static void drop_stalled(struct server *s) {
    int64_t now = cli_now_ms(), limit = s->opt->io_timeout_ms ? s->opt->io_timeout_ms : 5000;
    char why[160];
    struct wire_conn *links[2] = {&s->links.prev, &s->links.next};
    for (int i = 0; i < 2 + MAX_CLIENTS; i++) {
        struct wire_conn *c = i < 2 ? links[i] : &s->links.clients[i - 2];
        int64_t since = c->fd >= 0 ? wire_conn_partial_since(c) : 0;
        int64_t unread = c->fd >= 0 ? wire_conn_tx_waiting_since(c) : 0;
        if (unread && now - unread > limit) {
            snprintf(why, sizeof why, "not reading: %zu bytes queued for %lld ms",
                     wire_conn_tx_pending(c), (long long)(now - unread));
            if (i < 2)
                stage_srv_link_down(s, i == 0 ? STAGE_LINK_PREV : STAGE_LINK_NEXT, 0, c, why);
            else
                stage_srv_link_down(s, STAGE_LINK_CLIENT, s->links.client_ids[i - 2], c, why);
            continue;
        }
        if (!since || now - since <= limit) continue;
        snprintf(why, sizeof why, "a frame stalled: %zu of %zu bytes in %lld ms",
                 c->rx_need ? c->rx_have : c->rx_prefix_have,
                 c->rx_need ? c->rx_need : (size_t)WIRE_FRAME_PREFIX_BYTES,
                 (long long)(now - since));
        if (i < 2)
            stage_srv_link_down(s, i == 0 ? STAGE_LINK_PREV : STAGE_LINK_NEXT, 0, c, why);
        else
            stage_srv_link_down(s, STAGE_LINK_CLIENT, s->links.client_ids[i - 2], c, why);
    }
}

/* Dead-peer detection for peers that stop answering without closing (hung process, lost
 * network): every quarter of --peer-timeout-ms a Ping goes out on both stage links (the
 * peer's core answers Pong); a link that delivered nothing for the whole timeout is taken
 * down, which fails its requests like a closed connection. The timeout must exceed the
 * longest microbatch, since a computing stage answers only between microbatches. */
static void keepalive(struct server *s) {
    int64_t now = cli_now_ms(), timeout = s->opt->peer_timeout_ms;
    struct wire_control ping = {.kind = WIRE_CONTROL_PING};
    struct wire_arena arena;
    char why[128];
    if (timeout <= 0) return;
    if (s->links.prev.fd >= 0 && now - s->links.prev_rx_ms > timeout) {
        snprintf(why, sizeof why, "no frame for %lld ms (peer hung or unreachable)",
                 (long long)(now - s->links.prev_rx_ms));
        stage_srv_link_down(s, STAGE_LINK_PREV, 0, &s->links.prev, why);
    }
    if (s->links.next.fd >= 0 && now - s->links.next_rx_ms > timeout) {
        snprintf(why, sizeof why, "no frame for %lld ms (peer hung or unreachable)",
                 (long long)(now - s->links.next_rx_ms));
        stage_srv_link_down(s, STAGE_LINK_NEXT, 0, &s->links.next, why);
    }
    if (now - s->links.last_ping_ms < timeout / 4 || wire_arena_init(&arena, 256) < 0) return;
    s->links.last_ping_ms = now;
    ping.seq = ++s->links.ping_seq;
    if (wire_build_control(&arena, &ping) == 0) {
        if (s->links.prev.fd >= 0 && wire_send_frame(&s->links.prev, wire_arena_frame(&arena),
                                                     wire_arena_frame_len(&arena), 1000) < 0)
            stage_srv_link_down(s, STAGE_LINK_PREV, 0, &s->links.prev, "ping failed");
        if (s->links.next.fd >= 0 &&
            (queued_link(s, STAGE_LINK_NEXT)
                 ? wire_send_frame_nb(&s->links.next, wire_arena_frame(&arena),
                                      wire_arena_frame_len(&arena), RING_MAX_QUEUED)
                 : wire_send_frame(&s->links.next, wire_arena_frame(&arena),
                                   wire_arena_frame_len(&arena), 1000)) < 0)
            stage_srv_link_down(s, STAGE_LINK_NEXT, 0, &s->links.next, "ping failed");
    }
    wire_arena_free(&arena);
}

/* Stage 0: drives in-flight recovery (stage_core_recovery_tick: expiry, the ring Reset,
 * the replay) and logs its transitions - the hold, the replay, the first token after it
 * (./strata bench recovery reads these lines' times). */
static void recovery_tick(struct server *s) {
    struct stage_core_stats st;
    int held;
    if (s->info.stage_index != 0) { /* a replay's KV copies restored here */
        stage_core_get_stats(s->core, &st);
        if (st.kv_restored > s->logged.kv_restored)
            strata_log(STRATA_LOG_INFO, "restored %llu request(s) from their KV copies",
                       (unsigned long long)(st.kv_restored - s->logged.kv_restored));
        s->logged.kv_restored = st.kv_restored;
        return;
    }
    if (s->info.num_stages < 2) return;
    held = stage_core_recovery_tick(s->core, cli_now_ms(),
                                    s->links.prev.fd >= 0 && s->links.next.fd >= 0);
    stage_core_get_stats(s->core, &st);
    if (held > 0 && s->logged.held == 0)
        strata_log(STRATA_LOG_WARN,
                   "ring broken: holding %d request(s) for the ring to re-form (up to "
                   "--recovery-timeout-ms)",
                   held);
    if (st.replayed > s->logged.replayed)
        strata_log(STRATA_LOG_INFO,
                   "ring re-formed: replaying %llu request(s), %llu from KV copies (%llu prefill "
                   "rows restored, not recomputed)",
                   (unsigned long long)(st.replayed - s->logged.replayed),
                   (unsigned long long)(st.kv_restored - s->logged.kv_restored),
                   (unsigned long long)(st.kv_rows_saved - s->logged.kv_rows));
    if (st.recovered > s->logged.recovered)
        strata_log(STRATA_LOG_INFO,
                   "recovered: %llu request(s) got their first token after the replay",
                   (unsigned long long)(st.recovered - s->logged.recovered));
    s->logged.held = held;
    s->logged.replayed = st.replayed;
    s->logged.recovered = st.recovered;
    s->logged.kv_restored = st.kv_restored;
    s->logged.kv_rows = st.kv_rows_saved;
}

/* The link's file event: queued frames go out when the socket takes more, frames in are
 * served. TLS may hold decrypted bytes that poll() cannot see: the loop asks
 * link_buffered, and fires EVENT_READ for them without waiting. */
static void on_link(struct event_loop *loop, int fd, void *data, int mask) {
    struct link_ref *r = data;
    struct server *s = r->s;
    struct wire_conn *c = r->conn;
    uint32_t cid = r->client >= 0 ? s->links.client_ids[r->client] : 0;
    (void)loop;
    if ((mask & EVENT_WRITE) && c->fd == fd && wire_flush_nb(c) < 0) {
        char why[1024];
        snprintf(why, sizeof why, "send failed: %s", strata_last_error());
        stage_srv_link_down(s, r->link, cid, c, why);
    }
    if (!(mask & EVENT_READ)) return;
    if (c->fd == fd) serve_ready(s, c, r->link, cid);
    flush(s);
}

static int link_buffered(void *data) {
    return wire_conn_buffered(((struct link_ref *)data)->conn);
}

static struct link_ref *ref_of(struct server *s, struct wire_conn *conn) {
    if (conn == &s->links.prev) return &s->links.refs[0];
    if (conn == &s->links.next) return &s->links.refs[1];
    return &s->links.refs[2 + (conn - s->links.clients)];
}

int stage_srv_watch(struct server *s, struct wire_conn *conn) {
    return event_add_file(s->loop, conn->fd, EVENT_READ, on_link, link_buffered, ref_of(s, conn));
}

void stage_srv_close(struct server *s, struct wire_conn *conn) {
    if (conn->fd >= 0) event_del_file(s->loop, conn->fd); /* ENOTFOUND: never watched */
    if (conn == &s->links.next) stage_core_set_next_link(s->core, NULL);
    wire_close(conn);
}

/* Links with frames queued are watched for the socket taking more. */
static void watch_writes(struct server *s) {
    for (int i = 0; i < 2 + MAX_CLIENTS; i++) {
        struct wire_conn *c = s->links.refs[i].conn;
        if (c->fd >= 0)
            event_modify_file(s->loop, c->fd,
                              EVENT_READ | (wire_conn_tx_pending(c) ? EVENT_WRITE : 0));
    }
}

/* The acceptor or connector handed connections over. */
static void on_wake(struct event_loop *loop, void *data) {
    struct server *s = data;
    (void)loop;
    stage_srv_take_handoffs(s);
    flush(s);
}

static int64_t keepalive_timer(struct event_loop *loop, int64_t id, void *data) {
    struct server *s = data;
    int64_t timeout = s->opt->peer_timeout_ms;
    (void)loop;
    (void)id;
    keepalive(s);
    flush(s);
    /* A tenth of the timeout: pings and the dead-peer check stay close to their times. */
    return timeout / 10 < 1 ? 1 : timeout / 10 > 100 ? 100 : timeout / 10;
}

static int64_t stalled_timer(struct event_loop *loop, int64_t id, void *data) {
    (void)loop;
    (void)id;
    drop_stalled(data);
    flush(data);
    return STALLED_EVERY_MS;
}

static int64_t recovery_timer(struct event_loop *loop, int64_t id, void *data) {
    (void)loop;
    (void)id;
    recovery_tick(data);
    flush(data);
    return RECOVERY_EVERY_MS;
}

/* Ring describe (stage_describe.c): bounded by the dead-peer timeout, twice over, since
 * it crosses every stage, each answering between microbatches. */
static int64_t describe_timer(struct event_loop *loop, int64_t id, void *data) {
    struct server *s = data;
    (void)loop;
    (void)id;
    stage_core_describe_tick(
        s->core, cli_now_ms(), s->links.prev.fd < 0,
        s->links.next.fd<0, s->opt->peer_timeout_ms> 0 ? 2 * s->opt->peer_timeout_ms : 10000);
    flush(s);
    return DESCRIBE_EVERY_MS;
}

static int64_t vision_expire_timer(struct event_loop *loop, int64_t id, void *data) {
    struct server *s = data;
    (void)loop;
    (void)id;
    if (vision_rx_expire(s->vision_rx, cli_now_ms()) > 0)
        strata_log(STRATA_LOG_WARN, "dropped idle vision transfers (no block for %d s)",
                   VISION_RX_DEFAULT_IDLE_MS / 1000);
    return VISION_EXPIRE_EVERY_MS;
}

/* The loop and its timers; links are registered as they are adopted. */
static int loop_setup(struct server *s) {
    int rc = event_loop_create(&s->loop, 2 + MAX_CLIENTS);
    if (rc < 0) return rc;
    for (int i = 0; i < 2 + MAX_CLIENTS; i++)
        s->links.refs[i] = (struct link_ref){.s = s,
                                             .conn = i == 0   ? &s->links.prev
                                                     : i == 1 ? &s->links.next
                                                              : &s->links.clients[i - 2],
                                             .link = i == 0   ? STAGE_LINK_PREV
                                                     : i == 1 ? STAGE_LINK_NEXT
                                                              : STAGE_LINK_CLIENT,
                                             .client = i < 2 ? -1 : i - 2};
    event_loop_set_wake(s->loop, on_wake, s);
    int64_t ids[5] = {
        s->opt->peer_timeout_ms > 0 ? event_add_timer(s->loop, 0, keepalive_timer, s) : 1,
        event_add_timer(s->loop, STALLED_EVERY_MS, stalled_timer, s),
        event_add_timer(s->loop, 0, recovery_timer, s),
        event_add_timer(s->loop, 0, describe_timer, s),
        s->vision_rx ? event_add_timer(s->loop, VISION_EXPIRE_EVERY_MS, vision_expire_timer, s)
                     : 1};
    for (int i = 0; i < 5; i++)
        if (ids[i] < 0) return (int)ids[i];
    return 0;
}

/* --stage-stats: a line a second while the stage works, and one when it has been idle for
 * STATS_IDLE_NS after work, so each burst of work (a benchmark's request) ends with its own
 * line; a line covers from its first microbatch to its last (see stage_server_internal.h).
 * Microbatches with rows of a prompt (or of drafts: an item of more than one row) are also
 * counted apart from those of decode rows only: a prefill chunk and a decode step cost
 * differently, and the performance model prices each (strata-plan --predict's
 * prefill_ms_chunk and decode_ms_batch1). */
#define STATS_IDLE_NS 500000000LL
static void time_stats(struct server *s, int stepped, uint64_t prompt_step_rows, int64_t t_step,
                       int64_t t_sent, int64_t t_end) {
    struct stage_time_stats *t = &s->time_stats;
    if (stepped) {
        if (!t->since_ns) t->since_ns = t_step;
        if (t->idle_from_ns) t->wait_ns += t_step - t->idle_from_ns;
        t->idle_from_ns = 0;
        t->steps++;
        t->compute_ns += t_sent - t_step;
        t->send_ns += t_end - t_sent;
        if (prompt_step_rows) {
            t->prompt_steps++;
            t->prompt_rows += (int64_t)prompt_step_rows;
            t->prompt_compute_ns += t_sent - t_step;
        }
        if (!stage_core_has_work(s->core)) t->idle_from_ns = t_end;
    }
    if (!s->opt->stage_stats || !t->steps) return;
    int idle = !stepped && t->idle_from_ns && t_end - t->idle_from_ns >= STATS_IDLE_NS;
    if (!idle && (!stepped || t_end - t->since_ns < 1000000000LL)) return;
    int64_t until = idle ? t->idle_from_ns : t_end;
    const double n = (double)t->steps, np = (double)t->prompt_steps, nd = n - np;
    strata_log(STRATA_LOG_INFO,
               "stage stats: %lld microbatches in %.2f s; per microbatch: compute %.0f us, "
               "send %.0f us, wait for the next frame %.0f us; with prompt rows %lld (%.0f rows, "
               "%.0f us each), decode only %lld (%.0f us each)",
               (long long)t->steps, (double)(until - t->since_ns) / 1e9, t->compute_ns / n / 1e3,
               t->send_ns / n / 1e3, t->wait_ns / n / 1e3, (long long)t->prompt_steps,
               np > 0 ? (double)t->prompt_rows / np : 0,
               np > 0 ? (double)t->prompt_compute_ns / np / 1e3 : 0,
               (long long)(t->steps - t->prompt_steps),
               nd > 0 ? (double)(t->compute_ns - t->prompt_compute_ns) / nd / 1e3 : 0);
    int64_t idle_from = idle ? 0 : t->idle_from_ns; /* an idle gap is no wait for a frame */
    memset(t, 0, sizeof *t);
    t->since_ns = idle ? 0 : t_end;
    t->idle_from_ns = idle_from;
}

/* One pass: the file events and timers due, then a microbatch when there is work. */
static void loop_once(struct server *s) {
    watch_writes(s);
    if (event_loop_run_once(s->loop, stage_core_has_work(s->core) ? 0 : LOOP_MAX_WAIT_MS) < 0)
        strata_log(STRATA_LOG_WARN, "%s", strata_last_error());
    int stepped = stage_core_has_work(s->core);
    int64_t t_step = cli_now_ns(), t_sent = t_step;
    uint64_t prompt_step_rows = 0; /* the microbatch's rows, where some were a prompt's */
    if (stepped) {
        if (s->opt->step_delay_ms > 0) usleep((useconds_t)s->opt->step_delay_ms * 1000);
        struct stage_core_stats st;
        uint64_t rows, prompt;
        int64_t t0 = cli_now_ns();
        stage_core_get_stats(s->core, &st);
        rows = st.rows;
        prompt = st.attn_prefill_rows;
        if (stage_core_step(s->core) < 0)
            strata_log(STRATA_LOG_ERROR, "microbatch failed: %s", strata_last_error());
        stage_core_get_stats(s->core, &st);
        if (st.attn_prefill_rows > prompt) prompt_step_rows = st.rows - rows;
        if (st.rows - rows >= 8) {
            measured(&s->costs.row_ns, (double)(cli_now_ns() - t0) / (double)(st.rows - rows));
            stage_core_set_recovery_costs(s->core, s->costs.row_ns, s->costs.link_bps);
        }
        /* Nothing queued: what comes next is another stage's step (parked before the sends,
         * around which the next stage's wake-up may preempt this one). */
        if (!stage_core_has_work(s->core)) stage_core_idle(s->core);
        t_sent = cli_now_ns();
    }
    flush(s);
    drain_results(s);
    time_stats(s, stepped, prompt_step_rows, t_step, t_sent, cli_now_ns());
}

/* SIGTERM (the first stop): accept nothing new (the listener closes; new Requests are
 * refused with an Error naming the drain), serve the requests in flight to their end, for
 * at most drain_timeout_ms, then return. A second signal (*stop >= 2) ends it at once.
 * What is still in flight at the deadline fails like a closed link. */
static void drain(struct server *s) {
    struct stage_core_stats st;
    int64_t start = cli_now_ms(), deadline = start + s->opt->drain_timeout_ms;
    stage_core_get_stats(s->core, &st);
    atomic_store(&s->acceptor.refuse_new, 1);
    if (st.active_requests == 0 || s->opt->drain_timeout_ms <= 0) return;
    s->draining = 1;
    strata_log(STRATA_LOG_INFO,
               "draining: %d requests in flight (up to %d ms; a second signal "
               "stops at once)",
               st.active_requests, s->opt->drain_timeout_ms);
    while (*s->stop < 2 && st.active_requests > 0 && cli_now_ms() < deadline) {
        loop_once(s);
        stage_core_get_stats(s->core, &st);
    }
    if (st.active_requests > 0) {
        strata_log(STRATA_LOG_WARN, "drain ended with %d requests in flight (%s)",
                   st.active_requests, *s->stop >= 2 ? "second signal" : "--drain-timeout-ms");
        char why[128];
        snprintf(why, sizeof why, "stage %d shut down before the request ended (%s)",
                 s->info.stage_index, *s->stop >= 2 ? "second signal" : "--drain-timeout-ms");
        stage_core_on_link_down(s->core, STAGE_LINK_PREV, 0, why);
        stage_core_fail_held(s->core, why); /* stage 0 is going: nothing to replay them */
        flush(s);
        drain_results(s);
    } else {
        strata_log(STRATA_LOG_INFO, "drained in %lld ms", (long long)(cli_now_ms() - start));
    }
}

int stage_server_run(struct stage_core *core, const struct stage_server_options *opt,
                     volatile sig_atomic_t *stop) {
    struct server *s = calloc(1, sizeof *s);
    int rc;
    if (!s) return strata_set_error(STRATA_ENOMEM, "out of memory");
    s->core = core;
    s->opt = opt;
    s->stop = stop;
    s->listener.fd = -1;
    s->links.prev.fd = s->links.next.fd = -1;
    for (int i = 0; i < MAX_CLIENTS; i++)
        s->links.clients[i].fd = -1;
    s->dialer.connecting_fd = -1;
    pthread_mutex_init(&s->lock, NULL);
    s->self.version_major = WIRE_VERSION_MAJOR;
    s->self.version_minor = WIRE_VERSION_MINOR;
    s->self.has_fingerprint = 1;
    memcpy(s->self.fingerprint, opt->fingerprint, WIRE_FINGERPRINT_BYTES);
    /* The Hello announces the range the backend computes (stage_core_get_info). */
    stage_core_get_info(core, &s->info);
    atomic_store(&s->dialer.want_next, s->info.num_stages > 1);
    s->self.stage_index = s->info.stage_index;
    s->self.layer_start = s->info.role.layer_start;
    s->self.layer_end = s->info.role.layer_end;
    s->self.role = WIRE_ROLE_STAGE;
    snprintf(s->self.name, sizeof s->self.name, "strata-stage %d", s->info.stage_index);
    int vrc = s->info.stage_index == 0 ? vision_rx_init(&s->vision_rx, 0, 0, 0) : 0;
    rc = vrc == 0 ? wire_listen(&s->listener, opt->listen_host, opt->listen_port) : vrc;
    if (vrc == 0 && rc < 0 && opt->standby) { /* the primary holds the port: wait for it */
        strata_log(STRATA_LOG_INFO, "standby: port %d is taken (%s); waiting to take it over",
                   opt->listen_port, strata_last_error());
        while (rc < 0 && !*stop) {
            usleep(20 * 1000);
            rc = wire_listen(&s->listener, opt->listen_host, opt->listen_port);
        }
        if (rc == 0) strata_log(STRATA_LOG_WARN, "standby: took over port %d", opt->listen_port);
    }
    if (rc < 0) goto done;
    strata_log(STRATA_LOG_INFO, "listening on %s:%d",
               opt->listen_host ? opt->listen_host : "127.0.0.1", s->listener.port);
    if (opt->port_file) {
        rc = cli_write_port_file(opt->port_file, s->listener.port);
        if (rc < 0) goto done;
    }
    if ((rc = loop_setup(s)) < 0) goto done;
    if (pthread_create(&s->acceptor.thread, NULL, stage_srv_acceptor_main, s) != 0) {
        rc = strata_set_error(STRATA_EIO, "cannot start the acceptor thread");
        goto done;
    }
    s->acceptor.started = 1;
    if (s->info.num_stages > 1) {
        if (pthread_create(&s->dialer.thread, NULL, stage_srv_connector_main, s) != 0) {
            rc = strata_set_error(STRATA_EIO, "cannot start the connector thread");
            goto done;
        }
        s->dialer.started = 1;
    }
    while (!*stop)
        loop_once(s);
    drain(s);
    rc = 0;
done:
    atomic_store(&s->acceptor.stop, 1);
    pthread_mutex_lock(&s->lock); /* cut a handshake with the next stage short */
    if (s->dialer.connecting_fd >= 0) shutdown(s->dialer.connecting_fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->lock);
    if (s->dialer.started) pthread_join(s->dialer.thread, NULL);
    if (s->acceptor.started) pthread_join(s->acceptor.thread, NULL);
    wire_listener_close(&s->listener);
    for (int i = 0; i < s->handoffs.count; i++)
        wire_close(&s->handoffs.pending[i].conn);
    wire_close(&s->links.prev);
    wire_close(&s->links.next);
    for (int i = 0; i < MAX_CLIENTS; i++)
        wire_close(&s->links.clients[i]);
    event_loop_free(s->loop);
    pthread_mutex_destroy(&s->lock);
    vision_rx_free(s->vision_rx);
    free(s);
    return rc;
}
