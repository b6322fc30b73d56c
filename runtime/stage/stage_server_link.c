/* strata-stage's links: making them and taking them down. The acceptor thread
 * (stage_accept.h) and the connector thread (the link to the next stage, re-made with
 * backoff) handshake off the loop's thread and hand finished connections over; the loop
 * adopts them here after checking who the peer is (a client or vision stage on stage 0
 * only; upstream only the stage and layer range that must precede this one), and takes
 * them down. Apart from stage_server.c (the event loop, frames and results) so that how a
 * link comes and goes has one home, and the two threads run only code of this file; what
 * it shares with the loop is in stage_server_internal.h. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_accept.h"
#include "runtime/stage/stage_server_internal.h"
#include "runtime/stage/stage_server_vision.h"
#include "wire/transport.h"

#define HANDSHAKE_TIMEOUT_MS 3000
#define CONNECT_TIMEOUT_MS 1000
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS                                                                             \
    500 /* a restarted neighbour is found within 0.5 s (the recovery goal: 1 s) */
#define CLIENT_MAX_FRAME ((size_t)64 << 20) /* a request: prompt ids + parameters */

static void hand_over(struct server *s, struct wire_conn *conn, const struct wire_hello *peer,
                      int is_next);

/* The acceptor thread hands each handshaken connection to the loop. */
static void deliver(void *ctx, struct wire_conn *conn, const struct wire_hello *peer) {
    hand_over(ctx, conn, peer, 0);
}

void *stage_srv_acceptor_main(void *arg) {
    struct server *s = arg;
    struct stage_accept_options o = {.listener = &s->listener,
                                     .tls = s->opt->tls,
                                     .key = s->opt->key,
                                     .self = s->self,
                                     .handshake_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    if (stage_accept_run(&o, deliver, s, &s->acceptor.stop, &s->acceptor.refuse_new) < 0)
        strata_log(STRATA_LOG_ERROR, "acceptor: %s", strata_last_error());
    return NULL;
}

static const char *link_name(enum stage_link link) {
    switch (link) {
    case STAGE_LINK_PREV: return "upstream";
    case STAGE_LINK_NEXT: return "downstream";
    case STAGE_LINK_CLIENT: return "client";
    default: return "local";
    }
}

void stage_srv_link_down(struct server *s, enum stage_link link, uint32_t client_id,
                         struct wire_conn *conn, const char *reason) {
    strata_log(link == STAGE_LINK_CLIENT ? STRATA_LOG_INFO : STRATA_LOG_WARN, "%s link %s lost: %s",
               link_name(link), conn->peer, reason);
    stage_srv_close(s, conn);
    stage_core_on_link_down(s->core, link, client_id, reason);
    if (link == STAGE_LINK_NEXT) {
        atomic_store(&s->dialer.next_lost, 1);
        atomic_store(&s->dialer.want_next, 1);
    }
}

/* Adopts a handshaken connection as upstream or client, or refuses it. */
static void adopt(struct server *s, struct handoff *h) {
    int want = (s->info.stage_index - 1 + s->info.num_stages) % s->info.num_stages;
    if (h->peer.role == WIRE_ROLE_CLIENT || h->peer.role == WIRE_ROLE_VISION) {
        int vision = h->peer.role == WIRE_ROLE_VISION;
        if (s->info.stage_index != 0) {
            wire_send_error(&h->conn, STRATA_EINVAL, 0, "clients connect to stage 0 only");
            wire_close(&h->conn);
            return;
        }
        for (int i = 0; i < MAX_CLIENTS; i++) {
            if (s->links.clients[i].fd < 0) {
                wire_conn_move(&s->links.clients[i], &h->conn);
                /* A vision stage's VisionBlock 0 carries a whole request's DeepStack. */
                s->links.clients[i].max_frame = vision ? STAGE_VISION_MAX_FRAME : CLIENT_MAX_FRAME;
                s->links.client_ids[i] = ++s->links.next_client_id;
                s->links.client_vision[i] = (uint8_t)vision;
                if (stage_srv_watch(s, &s->links.clients[i]) < 0) {
                    strata_log(STRATA_LOG_WARN, "closing %s: %s", s->links.clients[i].peer,
                               strata_last_error());
                    wire_close(&s->links.clients[i]);
                    return;
                }
                strata_log(STRATA_LOG_DEBUG, "%s %u connected from %s",
                           vision ? "vision stage" : "client", s->links.client_ids[i],
                           s->links.clients[i].peer);
                return;
            }
        }
        wire_send_error(&h->conn, STRATA_EBUSY, 0, "too many clients");
        wire_close(&h->conn);
        return;
    }
    if (s->info.num_stages < 2 || h->peer.stage_index != want ||
        h->peer.layer_end !=
            (s->info.stage_index == 0 ? s->info.num_layers : s->info.role.layer_start)) {
        char why[256];
        snprintf(why, sizeof why,
                 "stage %d expects upstream stage %d ending at layer %d, got stage %d with layers "
                 "[%d, %d)",
                 s->info.stage_index, want,
                 s->info.stage_index == 0 ? s->info.num_layers : s->info.role.layer_start,
                 h->peer.stage_index, h->peer.layer_start, h->peer.layer_end);
        strata_log(STRATA_LOG_WARN, "refused %s: %s", h->conn.peer, why);
        wire_send_error(&h->conn, STRATA_EINVAL, 0, why);
        wire_close(&h->conn);
        return;
    }
    if (s->links.prev.fd >= 0)
        stage_srv_link_down(s, STAGE_LINK_PREV, 0, &s->links.prev,
                            "replaced by a new upstream connection");
    char security[160];
    wire_tls_peer_describe(&h->conn, security, sizeof security);
    wire_conn_move(&s->links.prev, &h->conn);
    s->links.prev.max_frame = WIRE_DEFAULT_MAX_FRAME; /* authenticated: activations and KV blocks */
    s->links.prev_rx_ms = cli_now_ms();
    if (stage_srv_watch(s, &s->links.prev) < 0) {
        strata_log(STRATA_LOG_WARN, "closing upstream %s: %s", s->links.prev.peer,
                   strata_last_error());
        wire_close(&s->links.prev);
        return;
    }
    strata_log(STRATA_LOG_INFO, "upstream stage %d connected from %s (%s)", h->peer.stage_index,
               s->links.prev.peer, security);
}

/* One attempt at the next stage: connect, TLS, Hello, and the check that it is the stage
 * and layer range that must follow. 0 with *conn and *peer, or a status (logged, quietly
 * when it repeats). The socket is published in connecting_fd while the handshakes wait,
 * so a stopping loop can cut them short. */
static int connect_next(struct server *s, struct wire_conn *conn, struct wire_hello *peer) {
    const struct stage_server_options *o = s->opt;
    int port = o->next_port, want = (s->info.stage_index + 1) % s->info.num_stages, rc;
    memset(conn, 0, sizeof *conn); /* closed, for the failure path below */
    conn->fd = -1;
    if (o->next_port_file && cli_read_port_file(o->next_port_file, &port) < 0) port = -1;
    if (port <= 0) {
        rc = strata_set_error(STRATA_ENOTFOUND, "next stage port not known yet");
    } else {
        rc = wire_connect(conn, o->next_host, port, 0, CONNECT_TIMEOUT_MS);
        pthread_mutex_lock(&s->lock);
        s->dialer.connecting_fd = rc == 0 ? conn->fd : -1;
        pthread_mutex_unlock(&s->lock);
        if (rc == 0 && o->tls) rc = wire_tls_connect(conn, o->tls, HANDSHAKE_TIMEOUT_MS);
        if (rc == 0) rc = wire_handshake_client(peer, conn, &s->self, o->key, HANDSHAKE_TIMEOUT_MS);
        if (rc == 0 && (peer->stage_index != want ||
                        peer->layer_start != (want == 0 ? 0 : s->info.role.layer_end)))
            rc = strata_set_error(STRATA_EINVAL,
                                  "next hop is stage %d with layers [%d, %d), expected stage %d "
                                  "starting at layer %d",
                                  peer->stage_index, peer->layer_start, peer->layer_end, want,
                                  want == 0 ? 0 : s->info.role.layer_end);
        pthread_mutex_lock(&s->lock);
        s->dialer.connecting_fd = -1;
        pthread_mutex_unlock(&s->lock);
    }
    if (rc < 0) {
        wire_close(conn);
        s->dialer.failures++;
        int changed =
            strncmp(s->dialer.error, strata_last_error(), sizeof s->dialer.error - 1) != 0;
        snprintf(s->dialer.error, sizeof s->dialer.error, "%s", strata_last_error());
        strata_log(
            changed || s->dialer.failures == 1 || s->dialer.failures % 50 == 0 ? STRATA_LOG_INFO
                                                                               : STRATA_LOG_DEBUG,
            "connecting to the next stage (attempt %d): %s", s->dialer.failures, s->dialer.error);
        return rc;
    }
    s->dialer.failures = 0;
    s->dialer.error[0] = '\0';
    return 0;
}

/* Queues a connection for the loop and wakes it; closes it when the queue is full. */
static void hand_over(struct server *s, struct wire_conn *conn, const struct wire_hello *peer,
                      int is_next) {
    int taken = 0;
    pthread_mutex_lock(&s->lock);
    if (s->handoffs.count < MAX_HANDOFF) {
        wire_conn_move(&s->handoffs.pending[s->handoffs.count].conn, conn);
        s->handoffs.pending[s->handoffs.count].peer = *peer;
        s->handoffs.pending[s->handoffs.count++].is_next = is_next;
        taken = 1;
    }
    pthread_mutex_unlock(&s->lock);
    if (!taken) {
        strata_log(STRATA_LOG_WARN, "too many pending connections: closing %s", conn->peer);
        wire_close(conn);
    } else {
        event_loop_wake(s->loop);
    }
}

/* The connector thread (re)makes the link to the next stage whenever the loop has none,
 * with exponential backoff (50 ms .. 0.5 s, from the start again when a link drops), and
 * hands it to the loop like an accepted one. Why a thread: connect, TLS and Hello wait on
 * the next stage (up to 1 + 3 + 3 s when it is hung or its port is flooded); on the loop's
 * thread that wait froze every client of stage 0. */
void *stage_srv_connector_main(void *arg) {
    struct server *s = arg;
    int backoff = BACKOFF_MIN_MS;
    int64_t retry = 0;
    while (!atomic_load(&s->acceptor.stop)) {
        struct wire_conn conn;
        struct wire_hello peer;
        if (atomic_exchange(&s->dialer.next_lost, 0)) {
            backoff = BACKOFF_MIN_MS;
            retry = cli_now_ms() + backoff;
        }
        if (!atomic_load(&s->dialer.want_next) || cli_now_ms() < retry) {
            usleep(5000);
            continue;
        }
        if (connect_next(s, &conn, &peer) == 0) {
            atomic_store(&s->dialer.want_next, 0);
            hand_over(s, &conn, &peer, 1);
            backoff = BACKOFF_MIN_MS;
        } else {
            retry = cli_now_ms() + backoff;
            backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
        }
    }
    return NULL;
}

/* Takes the connector's link to the next stage. */
static void adopt_next(struct server *s, struct handoff *h) {
    char security[160];
    if (s->links.next.fd >= 0)
        stage_srv_close(s, &s->links.next); /* not expected: the connector waits */
    wire_tls_peer_describe(&h->conn, security, sizeof security);
    wire_conn_move(&s->links.next, &h->conn);
    s->links.next_rx_ms = cli_now_ms();
    if (stage_srv_watch(s, &s->links.next) < 0) {
        strata_log(STRATA_LOG_WARN, "closing downstream %s: %s", s->links.next.peer,
                   strata_last_error());
        wire_close(&s->links.next);
        atomic_store(&s->dialer.want_next, 1);
        return;
    }
    stage_core_set_next_link(s->core, s->links.next.peer);
    strata_log(STRATA_LOG_INFO, "connected to next stage %d at %s (%s)", h->peer.stage_index,
               s->links.next.peer, security);
}

void stage_srv_take_handoffs(struct server *s) {
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->handoffs.count; i++) {
        if (s->handoffs.pending[i].is_next)
            adopt_next(s, &s->handoffs.pending[i]);
        else
            adopt(s, &s->handoffs.pending[i]);
    }
    s->handoffs.count = 0;
    pthread_mutex_unlock(&s->lock);
}
