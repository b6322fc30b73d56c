#include "wire/link_probe.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/codec.h"
#include "wire/message.h"

/* An Activation frame of `rows` hidden states [rows, H] of x; rows 0: the token-sized frame,
 * [1, 1] (one packet, as a decode step's returning token). */
static int build_rows(struct wire_arena *arena, const float *x, int rows, int H) {
    if (rows == 0) rows = H = 1;
    struct wire_activation msg;
    memset(&msg, 0, sizeof msg);
    msg.stage_from = 0;
    msg.stage_to = 1;
    msg.nonce = 1;
    msg.hidden = (struct wire_tensor){.defined = 1,
                                      .dtype = WIRE_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {rows, H},
                                      .codec = WIRE_CODEC_NONE,
                                      .data = x,
                                      .nbytes = sizeof(float) * (size_t)rows * (size_t)H};
    return wire_build_activation(arena, &msg);
}

int wire_probe_echo(struct wire_conn *conn, int idle_ms, unsigned long *echoed) {
    int rc = 0;
    *echoed = 0;
    while (rc == 0) {
        const uint8_t *frame;
        size_t len;
        struct wire_activation msg;
        if ((rc = wire_recv_frame(conn, &frame, &len, idle_ms)) < 0) break;
        if ((rc = wire_read_activation(&msg, frame, len)) < 0) break;
        if ((rc = wire_send_frame(conn, frame, len, idle_ms)) == 0) (*echoed)++;
    }
    return rc == STRATA_ECLOSED ? STRATA_OK : rc; /* the prober closing ends a probe */
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_us(void) {
    return (double)cli_now_ns() * 1e-3;
}

static int measure_size(struct wire_conn *conn, struct wire_arena *arena, const float *x, int rows,
                        int H, double seconds, int max_trips, struct wire_probe_point *pt) {
    double *t = malloc(sizeof(double) * (size_t)max_trips);
    if (!t) return strata_set_error(STRATA_ENOMEM, "out of memory");
    int rc = build_rows(arena, x, rows, H), n = 0;
    const double start = now_us();
    for (int i = 0; rc == 0 && n < max_trips; i++) {
        const uint8_t *frame;
        size_t len;
        const double t0 = now_us();
        rc = wire_send_frame(conn, wire_arena_frame(arena), wire_arena_frame_len(arena), 60000);
        if (rc == 0) rc = wire_recv_frame(conn, &frame, &len, 60000);
        if (rc == 0 && len != wire_arena_frame_len(arena))
            rc =
                strata_set_error(STRATA_EFORMAT, "link probe: the echo of a %zu-byte frame has %zu",
                                 wire_arena_frame_len(arena), len);
        if (rc < 0) break;
        if (i >= 3) t[n++] = (now_us() - t0) / 2;
        if (n >= 5 && now_us() - start > seconds * 1e6) break;
    }
    if (rc == 0) {
        double sum = 0;
        qsort(t, (size_t)n, sizeof(double), compare_double);
        for (int i = 0; i < n; i++)
            sum += t[i];
        *pt = (struct wire_probe_point){.rows = rows,
                                        .bytes = (double)wire_arena_frame_len(arena),
                                        .mean_us = sum / n,
                                        .p50_us = t[n / 2],
                                        .max_us = t[n - 1],
                                        .trips = n};
    }
    free(t);
    return rc;
}

/* Bandwidth from the least-squares slope of the *median* one-way time on bytes over every size
 * (the large frames decide it): a stall is a message's, not a byte's, and on a lossy link the
 * few that land in one size or another would tilt a slope of means anywhere, even below zero.
 * Latency from the smallest frame's *mean* less its bytes at that bandwidth: what the smallest
 * hop pays over a long run, its stalls included. The token-sized frame is the smallest where
 * it was probed, and the means by size (the points the report carries) price each hop by its
 * own frame (perf_model.h): over a 1 ms link losing 1% of its packets, token-sized frames
 * took 3.0 ms one way on average and one-row frames (4 KB) 5.0-7.7 (both 1.05 at the median),
 * so a decode ring of a row out and a token back is not two row-sized hops. */
void wire_probe_fit(struct wire_probe_result *r) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int small = 0, large = 0;
    for (int i = 0; i < r->n; i++) {
        const struct wire_probe_point *p = &r->pt[i];
        sx += p->bytes;
        sy += p->p50_us;
        sxx += p->bytes * p->bytes;
        sxy += p->bytes * p->p50_us;
        if (p->bytes < r->pt[small].bytes) small = i;
        if (p->bytes > r->pt[large].bytes) large = i;
    }
    const double den = r->n * sxx - sx * sx;
    double slope = den > 0 ? (r->n * sxy - sx * sy) / den : 0; /* us per byte */
    /* Larger frames no slower (a fast link, its bytes lost in the wake-ups' noise: on loopback
     * 16 KB frames once took 4.9 us at the median against 10.5 for 448 bytes): the largest
     * frame's bytes over its whole median time, a bandwidth the link has at least. A hosts
     * file refuses "gbps": 0. */
    if (!(slope > 0) && r->pt[large].p50_us > 0) slope = r->pt[large].p50_us / r->pt[large].bytes;
    r->gbps = slope > 0 ? 1e-3 / slope : 0; /* bytes per us = MB/s; / 1e3 = GB/s */
    r->latency_us = fmax(0, r->pt[small].mean_us - (slope > 0 ? slope * r->pt[small].bytes : 0));
}

int wire_probe_measure(struct wire_conn *conn, int hidden, const int *rows, int n_sizes,
                       double seconds, int max_trips, struct wire_probe_result *out) {
    memset(out, 0, sizeof *out);
    if (n_sizes < 2 || n_sizes > WIRE_PROBE_MAX_SIZES || hidden < 1 || max_trips < 5)
        return strata_set_error(STRATA_EINVAL, "link probe: %d sizes, hidden %d, %d trips", n_sizes,
                                hidden, max_trips);
    int max_rows = 0;
    for (int i = 0; i < n_sizes; i++) {
        if (rows[i] < 0 || (double)rows[i] * hidden * 4 > (double)(WIRE_PROBE_MAX_FRAME - 4096))
            return strata_set_error(STRATA_EINVAL,
                                    "link probe: %d rows of %d floats do not fit a frame", rows[i],
                                    hidden);
        if (rows[i] > max_rows) max_rows = rows[i];
    }
    const size_t floats = (size_t)(max_rows > 0 ? max_rows : 1) * (size_t)hidden; /* rows 0: 1 */
    float *x = malloc(sizeof(float) * floats);
    struct wire_arena arena;
    if (!x) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (size_t i = 0; i < floats; i++)
        x[i] = (float)((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;
    int rc = wire_arena_init(&arena, 0);
    for (int i = 0; rc == 0 && i < n_sizes; i++)
        rc = measure_size(conn, &arena, x, rows[i], hidden, seconds, max_trips, &out->pt[i]);
    if (rc == 0) {
        out->n = n_sizes;
        wire_probe_fit(out);
    }
    wire_arena_free(&arena);
    free(x);
    return rc;
}

int wire_probe_format(const struct wire_probe_result *r, const char *source, char *buf,
                      size_t cap) {
    int len = snprintf(buf, cap,
                       "{\"latency_us\": %.1f, \"gbps\": %.4f, \"source\": \"%s\", "
                       "\"points\": [",
                       r->latency_us, r->gbps, source);
    for (int i = 0; i < r->n && len > 0 && (size_t)len < cap; i++)
        len +=
            snprintf(buf + len, cap - (size_t)len,
                     "%s{\"bytes\": %.0f, \"mean_us\": %.1f, \"p50_us\": %.1f, \"max_us\": %.1f, "
                     "\"round_trips\": %d}",
                     i ? ", " : "", r->pt[i].bytes, r->pt[i].mean_us, r->pt[i].p50_us,
                     r->pt[i].max_us, r->pt[i].trips);
    if (len > 0 && (size_t)len < cap) len += snprintf(buf + len, cap - (size_t)len, "]}");
    if (len < 0 || (size_t)len >= cap)
        return strata_set_error(STRATA_ERANGE, "link probe: the report does not fit");
    return STRATA_OK;
}

int wire_probe_parse_rows(const char *list, int *rows, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || end == tok || v < 0 || v > 65536 || *n == WIRE_PROBE_MAX_SIZES) return -1;
        rows[(*n)++] = (int)v;
    }
    return *n >= 2 ? 0 : -1;
}
