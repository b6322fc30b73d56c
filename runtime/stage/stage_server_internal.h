/* Private to strata-stage's server: the state the event loop (stage_server.c) and the link
 * management (stage_server_link.c: the acceptor's and connector's threads, the checks of
 * who a peer is, taking a link down) share, by owner: the loop's links, each thread's state
 * and the handoffs between them. Not for other modules (use stage_server.h). */
#ifndef STRATA_RUNTIME_STAGE_STAGE_SERVER_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_SERVER_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/base/cli.h"
#include "runtime/base/event_loop.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_server.h"
#include "runtime/stage/vision_xfer.h"
#include "wire/transport.h"

#define MAX_CLIENTS 64
#define MAX_HANDOFF 64

struct handoff {
    struct wire_conn conn;
    struct wire_hello peer;
    int is_next; /* made by the connector: the link to the next stage */
};

struct server;

/* What a link's file event carries (event_add_file's data): which conn of which server,
 * and its role, so a callback serves its link without looking it up. */
struct link_ref {
    struct server *s;
    struct wire_conn *conn;
    enum stage_link link;
    int client; /* index into clients[] for STAGE_LINK_CLIENT, else -1 */
};

/* The loop-owned connections (fd -1 when absent) and what the loop knows of them. */
struct server_links {
    struct wire_conn prev, next;
    struct wire_conn clients[MAX_CLIENTS];
    uint32_t client_ids[MAX_CLIENTS];
    uint8_t client_vision[MAX_CLIENTS]; /* the client is a vision stage (Hello role Vision) */
    uint32_t next_client_id;
    struct link_ref refs[2 + MAX_CLIENTS]; /* prev, next, clients[i] */
    int64_t prev_rx_ms, next_rx_ms;        /* last frame received on each stage link */
    int64_t last_ping_ms;
    uint64_t ping_seq;
};

/* The acceptor thread's (stage_server_link.c): the loop only sets its flags. */
struct server_acceptor {
    pthread_t thread;
    int started;
    atomic_int stop;       /* set by the loop when it ends (the signal flag is not shared) */
    atomic_int refuse_new; /* set by the loop when it drains: accept nothing new */
};

/* The connector thread's (stage_server_link.c), which dials the next stage: the loop only
 * sets the flags. */
struct server_dialer {
    pthread_t thread;
    int started;
    atomic_int want_next; /* the loop has no next link: make one */
    atomic_int next_lost; /* the next link just dropped: retry soon (backoff from the start) */
    int connecting_fd;    /* under the server's lock: a connect in progress (-1: none) */
    int failures;
    char error[256]; /* the last reason the next hop failed (logged when it changes) */
};

/* Connections the two threads made, waiting for the loop to adopt them (under the lock). */
struct server_handoffs {
    struct handoff pending[MAX_HANDOFF];
    int count;
};

struct server {
    struct stage_core_info info; /* stage index, layer range, roles: the core's backend */
    struct stage_core *core;
    const struct stage_server_options *opt;
    volatile sig_atomic_t *stop;
    struct wire_listener listener;
    struct wire_hello self;
    int draining;
    struct event_loop *loop; /* the loop's thread; the acceptor and connector only wake it */
    pthread_mutex_t lock;    /* between the loop and the two threads: handoffs, connecting_fd */
    struct server_links links;
    struct server_acceptor acceptor;
    struct server_dialer dialer;
    struct server_handoffs handoffs;
    struct vision_rx *vision_rx; /* stage 0: vision transfers in progress */
    /* Recovery (stage 0; stage_recovery.c): what was last logged. */
    struct {
        int held;
        uint64_t replayed, recovered, kv_restored, kv_rows;
    } logged;
    /* Measured for stage 0's restore-or-replay rule (stage_recovery_kv.c): ns per row of
     * microbatches >= 8 rows (moving average) and bytes/s of sends >= 64 KiB on the next
     * link (the fastest recent one); 0 until measured. */
    struct {
        double row_ns, link_bps;
    } costs;
    /* --stage-stats: since the last line, microbatches and the time in them, in the sends
     * after them and waiting for the next frame (from the moment nothing was left to run). */
    struct stage_time_stats {
        int64_t since_ns, idle_from_ns;
        int64_t steps, compute_ns, send_ns, wait_ns;
        int64_t prompt_steps, prompt_rows, prompt_compute_ns; /* those with a prompt's rows */
    } time_stats;
    int kv_drop_warned;
};

/* stage_server_link.c, run on their own threads (arg: the server). */
void *stage_srv_acceptor_main(void *arg);
void *stage_srv_connector_main(void *arg);
/* The loop's side: adopts the connections the threads handed over (after a wake). */
void stage_srv_take_handoffs(struct server *s);
/* Registers a just adopted link (prev, next or a clients[] element) with the loop: its
 * frames are then served. A status when the loop refuses (the caller closes the conn). */
int stage_srv_watch(struct server *s, struct wire_conn *conn);
/* Unregisters a link from the loop and closes it. */
void stage_srv_close(struct server *s, struct wire_conn *conn);
/* Closes a link, tells the core (which fails what it carried) and, for the next link,
 * asks the connector for a new one. */
void stage_srv_link_down(struct server *s, enum stage_link link, uint32_t client_id,
                         struct wire_conn *conn, const char *reason);

#endif
