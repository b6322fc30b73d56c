#include "runtime/strata_stage_probe.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/link_probe.h"
#include "wire/transport.h"

/* Each frame size's probing time. */
#define PROBE_SECONDS 2.0

/* The stage before this one probing it: accept its connection, echo until it closes. */
struct echo_job {
    struct wire_listener *listener;
    int wait_ms;
    struct wire_tls *tls;
    int rc;
    unsigned long echoed;
    char peer[64];
    char error[256];
};

static void *echo_main(void *arg) {
    struct echo_job *j = arg;
    struct wire_conn conn = {.fd = -1};
    j->rc = wire_accept(&conn, j->listener, WIRE_PROBE_MAX_FRAME, j->wait_ms);
    if (j->rc == 0 && j->tls) j->rc = wire_tls_accept(&conn, j->tls, 5000);
    if (j->rc == 0) j->rc = wire_probe_echo(&conn, 60000, &j->echoed);
    snprintf(j->peer, sizeof j->peer, "%s", conn.peer);
    if (j->rc < 0) snprintf(j->error, sizeof j->error, "%s", strata_last_error());
    wire_close(&conn);
    return NULL;
}

/* Connects to the next stage, waiting up to wait_ms for it to listen (its port file, its
 * port). */
static int connect_next(struct wire_conn *conn, const struct args *a, struct wire_tls *tls,
                        int wait_ms, int *port) {
    const int64_t deadline = cli_now_ms() + wait_ms;
    const char *host = a->next_host ? a->next_host : "127.0.0.1";
    int rc;
    for (;;) {
        *port = a->next_port;
        rc = a->next_port_file ? cli_read_port_file(a->next_port_file, port) : 0;
        if (rc == 0) rc = wire_connect(conn, host, *port, WIRE_PROBE_MAX_FRAME, 2000);
        if (rc == 0 || cli_now_ms() > deadline) break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    if (rc == 0 && tls) rc = wire_tls_connect(conn, tls, 5000);
    return rc;
}

int strata_stage_probe_links(const struct args *a, const char *listen_host, int listen_port,
                             struct wire_tls *tls, int hidden) {
    if (a->num_stages < 2) {
        fprintf(stderr, "strata-stage: --probe-links: one stage has no link to measure\n");
        return STRATA_EXIT_USAGE;
    }
    if (a->tp_rank > 0 || a->kvp_rank > 0) { /* only a group's leader holds the ring's links */
        fprintf(stderr, "strata-stage: --probe-links: run it on each stage's TP / KVP leader "
                        "(rank 0): the other ranks have no link to the next stage\n");
        return STRATA_EXIT_USAGE;
    }
    struct wire_listener listener = {.fd = -1};
    int rc = wire_listen(&listener, listen_host[0] ? listen_host : NULL, listen_port);
    if (rc == 0 && a->port_file) rc = cli_write_port_file(a->port_file, listener.port);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: --probe-links: %s\n", strata_last_error());
        wire_listener_close(&listener);
        return STRATA_EXIT_FAILURE;
    }
    /* the neighbours come up within --peer-timeout-ms (0: two minutes) */
    const int wait_ms = a->peer_timeout_ms > 0 ? a->peer_timeout_ms : 120000;
    struct echo_job echo = {.listener = &listener, .wait_ms = wait_ms, .tls = tls};
    pthread_t thread;
    if (pthread_create(&thread, NULL, echo_main, &echo) != 0) {
        fprintf(stderr, "strata-stage: --probe-links: cannot start the echo thread\n");
        wire_listener_close(&listener);
        return STRATA_EXIT_FAILURE;
    }
    /* a token (the latency: link_probe.h), a decode row, and prefill chunks of 8, 64 (the
     * default --chunk-size) and 256 rows */
    static const int rows[] = {0, 1, 8, 64, 256};
    struct wire_conn conn = {.fd = -1};
    struct wire_probe_result r;
    int port = 0;
    rc = connect_next(&conn, a, tls, wait_ms, &port);
    if (rc == 0) rc = wire_probe_measure(&conn, hidden, rows, 5, PROBE_SECONDS, 5000, &r);
    char error[256] = "";
    if (rc < 0) snprintf(error, sizeof error, "%s", strata_last_error());
    wire_close(&conn); /* the next stage's echo ends here */
    pthread_join(thread, NULL);
    wire_listener_close(&listener);
    const char *next = a->next_host ? a->next_host : "127.0.0.1";
    const int to = (a->stage_idx + 1) % a->num_stages;
    if (rc < 0) {
        fprintf(stderr, "strata-stage: --probe-links: the link to stage %d (%s:%d): %s\n", to, next,
                port, error);
        return STRATA_EXIT_FAILURE;
    }
    char source[512], json[4096];
    snprintf(
        source, sizeof source,
        "measured by strata-stage --probe-links: stage %d to stage %d (%s:%d)%s, one-way "
        "times of Activation frames of hidden %d, latency the token-sized frame's mean, bandwidth "
        "the medians' slope (gbps: gigabytes per second)",
        a->stage_idx, to, next, port, tls ? " over TLS 1.3" : "", hidden);
    if (wire_probe_format(&r, source, json, sizeof json) < 0) {
        fprintf(stderr, "strata-stage: --probe-links: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    FILE *f = fopen(a->probe_links, "w");
    if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f)) {
        fprintf(stderr, "strata-stage: --probe-links: cannot write %s\n", a->probe_links);
        return STRATA_EXIT_FAILURE;
    }
    printf("link to stage %d (%s:%d)%s: latency %.1f us, %.4f GB/s; one way, mean / median / "
           "worst: a token's frame (%.0f bytes) %.1f / %.1f / %.1f us, a decode row's (%.0f "
           "bytes) %.1f / %.1f / %.1f us; written to %s\n",
           to, next, port, tls ? " over TLS 1.3" : "", r.latency_us, r.gbps, r.pt[0].bytes,
           r.pt[0].mean_us, r.pt[0].p50_us, r.pt[0].max_us, r.pt[1].bytes, r.pt[1].mean_us,
           r.pt[1].p50_us, r.pt[1].max_us, a->probe_links);
    if (echo.rc < 0)
        fprintf(stderr, "strata-stage: --probe-links: the probe from the stage before (%s): %s\n",
                echo.peer, echo.error);
    else
        printf("echoed %lu frames of the probe from the stage before (%s)\n", echo.echoed,
               echo.peer);
    return echo.rc < 0 ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}
