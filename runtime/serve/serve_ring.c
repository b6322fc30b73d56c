/* The ring as last seen, and probes of its stages when it breaks (see serve_ring.h). */
#include "runtime/serve/serve_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/transport.h"

void serve_ring_init(struct serve_ring *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
}

void serve_ring_free(struct serve_ring *r) {
    pthread_mutex_destroy(&r->mu);
}

int serve_ring_parse_address(const char *address, char *host, size_t host_cap, int *port) {
    const char *colon = address ? strrchr(address, ':') : NULL;
    char *end;
    if (!colon || colon == address || (size_t)(colon - address) >= host_cap)
        return strata_set_error(STRATA_EINVAL, "'%s' is not host:port", address ? address : "");
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 1 || p > 65535)
        return strata_set_error(STRATA_EINVAL, "'%s' is not host:port", address);
    const char *h = address;
    size_t len = (size_t)(colon - address);
    if (len >= 2 && h[0] == '[' && h[len - 1] == ']') { /* [v6]:port */
        h++;
        len -= 2;
    }
    memcpy(host, h, len);
    host[len] = '\0';
    *port = (int)p;
    return 0;
}

/* A stage's state from a connect to `address`, after the describe failed with `why`. */
static void probe(const char *address, const char *why, struct serve_stage_status *st) {
    char host[64];
    int port;
    struct wire_conn conn;
    if (serve_ring_parse_address(address, host, sizeof host, &port) < 0) {
        st->state = SERVE_STAGE_UNKNOWN;
        snprintf(st->reason, sizeof st->reason, "its address is not known (%.400s)", why);
        return;
    }
    if (wire_connect(&conn, host, port, 0, SERVE_RING_PROBE_MS) == 0) {
        wire_close(&conn);
        st->state = SERVE_STAGE_UNKNOWN;
        snprintf(st->reason, sizeof st->reason,
                 "listening at %.64s; the ring is broken at another stage or link", address);
        return;
    }
    st->state = SERVE_STAGE_DOWN;
    snprintf(st->reason, sizeof st->reason, "%s", strata_last_error());
}

int serve_ring_describe(struct serve_ring *r, struct serve_engine *e, int timeout_ms,
                        struct client_describe *out,
                        struct serve_stage_status status[CLIENT_MAX_STAGES]) {
    char why[400], stage0[300];
    memset(status, 0, sizeof(struct serve_stage_status) * CLIENT_MAX_STAGES);
    int rc = serve_engine_describe(e, out, timeout_ms);
    pthread_mutex_lock(&r->mu);
    if (rc == 0) {
        r->last = *out;
        r->have_last = 1;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    snprintf(why, sizeof why, "%s", strata_last_error());
    if (r->have_last)
        *out = r->last;
    else
        out->num_stages = 0;
    pthread_mutex_unlock(&r->mu);
    /* Stage 0 is where the front connects; each later stage is where the one before it
     * dialled. Probed outside the lock: a silent host costs SERVE_RING_PROBE_MS each. */
    snprintf(stage0, sizeof stage0, "%s:%d", e->host, e->port);
    for (int i = 0; i < out->num_stages; i++)
        probe(i == 0 ? stage0 : out->stages[i - 1].next, why, &status[i]);
    return strata_set_error(rc, "%s", why);
}
