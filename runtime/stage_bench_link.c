/* strata-stage-bench's link measurements (runtime/stage_bench.h):
 *   hop         per-hop latency of one decode hidden state [1, H]: two threads ping-pong a
 *               real Activation frame over a TCP loopback connection (build, length-prefixed
 *               send, receive, verify + read, decode to f32 on each side); one hop = RTT / 2.
 *   probe-link  a link between any two boxes as the stages' frames cross it
 *               (wire/link_probe.h): one side listens and echoes, the other measures and
 *               prints the hosts file's "link" object for strata-plan --hosts. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage_bench.h"
#include "wire/auth.h"
#include "wire/codec.h"
#include "wire/link_probe.h"
#include "wire/message.h"
#include "wire/tls.h"
#include "wire/transport.h"

static double now_us(void) {
    return (double)cli_now_ns() * 1e-3;
}

struct hop_side {
    struct wire_conn conn;
    struct wire_arena arena;
    float *out; /* [H] what this side sends */
    float *in;  /* [H] what it received, decoded */
    int hidden;
    int iters;
    int status;
    struct wire_tls *tls; /* server side: the TLS handshake runs on the echo thread */
};

/* One hop: build the activation of a decode row, send it; the peer receives, verifies,
 * reads and decodes it into its buffer. */
static int send_hidden(struct hop_side *s, uint64_t step) {
    struct wire_activation msg;
    memset(&msg, 0, sizeof msg);
    msg.stage_from = 0;
    msg.stage_to = 1;
    msg.step = step;
    msg.pos = step;
    msg.nonce = 1;
    msg.hidden = (struct wire_tensor){.defined = 1,
                                      .dtype = WIRE_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {1, s->hidden},
                                      .codec = WIRE_CODEC_NONE,
                                      .data = s->out,
                                      .nbytes = sizeof(float) * (size_t)s->hidden};
    int rc = wire_build_activation(&s->arena, &msg);
    if (rc == 0)
        rc = wire_send_frame(&s->conn, wire_arena_frame(&s->arena), wire_arena_frame_len(&s->arena),
                             5000);
    return rc;
}

static int recv_hidden(struct hop_side *s, uint64_t step) {
    const uint8_t *frame;
    size_t len;
    struct wire_activation msg;
    int rc = wire_recv_frame(&s->conn, &frame, &len, 5000);
    if (rc == 0) rc = wire_read_activation(&msg, frame, len);
    if (rc == 0 && (msg.step != step || msg.hidden.shape[1] != s->hidden))
        rc = strata_set_error(STRATA_EFORMAT, "hop bench: frame out of order");
    if (rc == 0) rc = wire_tensor_decode_f32(s->in, &msg.hidden);
    return rc;
}

static void *echo_main(void *arg) {
    struct hop_side *s = arg;
    if (s->tls) s->status = wire_tls_accept(&s->conn, s->tls, 2000);
    for (int i = 0; i < s->iters && s->status == 0; i++) {
        s->status = recv_hidden(s, (uint64_t)i);
        if (s->status == 0) {
            memcpy(s->out, s->in, sizeof(float) * (size_t)s->hidden);
            s->status = send_hidden(s, (uint64_t)i);
        }
    }
    return NULL;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* hop's flags: 0, or the usage exit code after printing the usage line. */
static int hop_args(int argc, char **argv, int *H, int *iters, int *psk) {
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden"))
            *H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            *iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tls") &&
                 (!strcmp(argv[i + 1], "psk") || !strcmp(argv[i + 1], "off")))
            *psk = !strcmp(argv[i + 1], "psk");
        else {
            fprintf(stderr,
                    "usage: strata-stage-bench hop [--hidden H] [--iters N] [--tls psk|off]\n");
            return STRATA_EXIT_USAGE;
        }
    }
    if (*H < 1 || *iters < 10) {
        fprintf(stderr, "usage: strata-stage-bench hop [--hidden H >= 1] [--iters N >= 10]\n");
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

int stage_bench_hop(int argc, char **argv) {
    int H = 4096, iters = 5000, warmup = 500, rc = 0, psk = 0;
    struct wire_listener listener = {.fd = -1};
    struct hop_side a, b;
    pthread_t echo;
    double *one_way;
    if (hop_args(argc, argv, &H, &iters, &psk)) return STRATA_EXIT_USAGE;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.conn.fd = b.conn.fd = -1;
    a.hidden = b.hidden = H;
    b.iters = iters + warmup;
    one_way = malloc(sizeof(double) * (size_t)iters);
    a.out = malloc(sizeof(float) * (size_t)H);
    a.in = malloc(sizeof(float) * (size_t)H);
    b.out = malloc(sizeof(float) * (size_t)H);
    b.in = malloc(sizeof(float) * (size_t)H);
    if (!one_way || !a.out || !a.in || !b.out || !b.in) return STRATA_EXIT_FAILURE;
    for (int i = 0; i < H; i++)
        a.out[i] = (float)((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;
    if ((rc = wire_arena_init(&a.arena, 0)) < 0 || (rc = wire_arena_init(&b.arena, 0)) < 0 ||
        (rc = wire_listen(&listener, NULL, 0)) < 0 ||
        (rc = wire_connect(&a.conn, NULL, listener.port, 0, 2000)) < 0 ||
        (rc = wire_accept(&b.conn, &listener, 0, 2000)) < 0)
        goto done;
    if (psk) { /* TLS 1.3 with an external PSK, as strata-stage --auth-key-file runs it */
        struct wire_auth_key key = {.len = 32};
        memset(key.bytes, 'k', key.len);
        rc = wire_tls_new(&b.tls, &(struct wire_tls_options){.psk = &key});
        if (rc < 0) goto done;
    }
    if (pthread_create(&echo, NULL, echo_main, &b) != 0) {
        rc = strata_set_error(STRATA_EIO, "cannot start the echo thread");
        goto done;
    }
    if (psk) rc = wire_tls_connect(&a.conn, b.tls, 2000); /* one context serves both sides */
    for (int i = 0; i < iters + warmup && rc == 0; i++) {
        double t0 = now_us();
        rc = send_hidden(&a, (uint64_t)i);
        if (rc == 0) rc = recv_hidden(&a, (uint64_t)i);
        if (i >= warmup) one_way[i - warmup] = (now_us() - t0) / 2;
    }
    pthread_join(echo, NULL);
    if (rc == 0 && b.status != 0) rc = b.status;
    if (rc == 0 && memcmp(a.in, a.out, sizeof(float) * (size_t)H) != 0)
        rc = strata_set_error(STRATA_EFORMAT, "hop bench: hidden state changed in transit");
    if (rc == 0) {
        qsort(one_way, (size_t)iters, sizeof(double), compare_double);
        printf(
            "per-hop latency%s, decode hidden state [1, %d] f32 (%zu bytes), %d hops: p50 %.1f us, "
            "p99 %.1f us (goal p50 <= 60 us)\n",
            psk ? " over TLS 1.3 (PSK)" : "", H, sizeof(float) * (size_t)H, iters,
            one_way[iters / 2], one_way[(size_t)(iters * 0.99)]);
    }
done:
    if (rc < 0) fprintf(stderr, "strata-stage-bench hop: %s\n", strata_last_error());
    wire_close(&a.conn);
    wire_close(&b.conn);
    wire_tls_free(b.tls);
    wire_listener_close(&listener);
    wire_arena_free(&a.arena);
    wire_arena_free(&b.arena);
    free(one_way);
    free(a.out);
    free(a.in);
    free(b.out);
    free(b.in);
    return rc < 0 ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}

/* ---------------------------------------------------------------- probe-link */

/* The listening side: echoes every frame of each connection until its peer closes. */
static int probe_listen(const char *bind, int port, const char *port_file, struct wire_tls *tls,
                        int once) {
    struct wire_listener listener = {.fd = -1};
    int rc = wire_listen(&listener, bind, port);
    if (rc < 0) return rc;
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%d\n", listener.port) < 0 || fclose(f)) {
            wire_listener_close(&listener);
            return strata_set_error(STRATA_EIO, "cannot write %s", port_file);
        }
    }
    fprintf(stderr, "probe-link: listening on %s:%d%s\n", bind ? bind : "127.0.0.1", listener.port,
            tls ? " (TLS 1.3 PSK)" : "");
    do {
        struct wire_conn conn = {.fd = -1};
        unsigned long echoed = 0;
        rc = wire_accept(&conn, &listener, WIRE_PROBE_MAX_FRAME, -1);
        if (rc < 0) break; /* the listener itself failed: nothing more will come */
        if (tls) rc = wire_tls_accept(&conn, tls, 5000);
        if (rc == 0) rc = wire_probe_echo(&conn, 60000, &echoed);
        if (rc < 0)
            fprintf(stderr, "probe-link: %s: %s\n", conn.peer[0] ? conn.peer : "connection",
                    strata_last_error());
        else
            fprintf(stderr, "probe-link: %s: %lu frames echoed\n", conn.peer, echoed);
        wire_close(&conn);
        if (!once) rc = 0; /* one bad prober does not stop the listener */
    } while (!once);
    wire_listener_close(&listener);
    return rc;
}

static int probe_connect(const char *host, int port, struct wire_tls *tls, int H, const int *rows,
                         int nsizes, double seconds, int max_trips, const char *out) {
    struct wire_conn conn = {.fd = -1};
    struct wire_probe_result r;
    int rc = wire_connect(&conn, host, port, WIRE_PROBE_MAX_FRAME, 5000);
    if (rc == 0 && tls) rc = wire_tls_connect(&conn, tls, 5000);
    if (rc == 0) rc = wire_probe_measure(&conn, H, rows, nsizes, seconds, max_trips, &r);
    wire_close(&conn);
    if (rc < 0) return rc;
    printf("probe-link to %s:%d%s, Activation frames of [rows, %d] f32 (rows 0: one float, a\n"
           "token's size), one way = round trip / 2:\n",
           host, port, tls ? " over TLS 1.3 (PSK)" : " (plaintext)", H);
    printf("%8s %12s %7s %12s %12s %12s\n", "rows", "bytes", "trips", "mean us", "p50 us",
           "max us");
    for (int i = 0; i < r.n; i++)
        printf("%8d %12.0f %7d %12.1f %12.1f %12.1f\n", r.pt[i].rows, r.pt[i].bytes, r.pt[i].trips,
               r.pt[i].mean_us, r.pt[i].p50_us, r.pt[i].max_us);
    char source[512], json[4096];
    snprintf(source, sizeof source,
             "measured by strata-stage-bench probe-link to %s:%d%s: one-way times of "
             "Activation frames, latency the smallest frame's mean, bandwidth the medians' "
             "slope (gbps: gigabytes per second)",
             host, port, tls ? " over TLS 1.3 PSK" : "");
    if ((rc = wire_probe_format(&r, source, json, sizeof json)) < 0) return rc;
    printf("link: %s\n", json);
    if (r.gbps <= 0)
        printf("(the larger frames were not slower: no bandwidth could be fitted; probe with "
               "larger --rows)\n");
    if (out) {
        FILE *f = fopen(out, "w");
        if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f))
            return strata_set_error(STRATA_EIO, "cannot write %s", out);
    }
    return r.gbps > 0 ? STRATA_OK : strata_set_error(STRATA_ERANGE, "no bandwidth could be fitted");
}

static const char probe_usage[] =
    "usage: strata-stage-bench probe-link --listen [--bind ADDR] [--port P] [--port-file F]\n"
    "                                     [--auth-key-file K] [--once]\n"
    "       strata-stage-bench probe-link --connect HOST:PORT [--auth-key-file K] [--hidden H]\n"
    "                                     [--rows LIST] [--seconds S] [--max-trips N] [--out F]\n"
    "Measures a link as the stages' frames cross it: run --listen on one box (it echoes), then\n"
    "--connect from the other. Frames of [rows, H] f32 (H default 4096; rows default\n"
    "0,1,16,128,1024, 0 being a token-sized frame), each size for about S seconds (default 1;\n"
    "5 to N round trips, default 2000); prints the mean, median and worst one-way time per\n"
    "size and the hosts file's \"link\" object (latency_us: the smallest frame's mean, what a\n"
    "decode hop stalls like on a lossy link; gbps in gigabytes per second: from the medians),\n"
    "also\n"
    "written to F. --auth-key-file: TLS 1.3 with that pre-shared key on both sides, as\n"
    "strata-stage runs it.\n";

int stage_bench_probe_link(int argc, char **argv) {
    const char *connect_to = NULL, *bind = NULL, *port_file = NULL, *key_file = NULL, *out = NULL;
    int listen = 0, once = 0, port = 0, H = 4096, max_trips = 2000, nsizes = 5;
    int rows[WIRE_PROBE_MAX_SIZES] = {0, 1, 16, 128, 1024};
    double seconds = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--listen"))
            listen = 1;
        else if (!strcmp(a, "--once"))
            once = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(probe_usage, stdout);
            return STRATA_EXIT_OK;
        } else if (!v)
            bad = 1;
        else {
            i++;
            if (!strcmp(a, "--connect"))
                connect_to = v;
            else if (!strcmp(a, "--bind"))
                bind = v;
            else if (!strcmp(a, "--port"))
                bad = cli_parse_int(v, 0, 65535, &port) < 0;
            else if (!strcmp(a, "--port-file"))
                port_file = v;
            else if (!strcmp(a, "--auth-key-file"))
                key_file = v;
            else if (!strcmp(a, "--out"))
                out = v;
            else if (!strcmp(a, "--hidden"))
                bad = cli_parse_int(v, 1, 65536, &H) < 0;
            else if (!strcmp(a, "--max-trips"))
                bad = cli_parse_int(v, 5, 1000000, &max_trips) < 0;
            else if (!strcmp(a, "--seconds"))
                bad = !((seconds = atof(v)) > 0 && seconds <= 600);
            else if (!strcmp(a, "--rows"))
                bad = wire_probe_parse_rows(v, rows, &nsizes) < 0;
            else
                bad = 1;
        }
        if (bad) {
            fprintf(stderr, "strata-stage-bench probe-link: bad option %s%s%s\n%s", a, v ? " " : "",
                    v ? v : "", probe_usage);
            return STRATA_EXIT_USAGE;
        }
    }
    char host[256];
    int cport = 0;
    if (listen == !!connect_to) {
        fprintf(stderr, "strata-stage-bench probe-link: one of --listen and --connect\n%s",
                probe_usage);
        return STRATA_EXIT_USAGE;
    }
    if (connect_to) {
        const char *colon = strrchr(connect_to, ':');
        if (!colon || colon == connect_to || (size_t)(colon - connect_to) >= sizeof host ||
            cli_parse_int(colon + 1, 1, 65535, &cport) < 0) {
            fprintf(stderr, "strata-stage-bench probe-link: --connect HOST:PORT, not '%s'\n",
                    connect_to);
            return STRATA_EXIT_USAGE;
        }
        snprintf(host, sizeof host, "%.*s", (int)(colon - connect_to), connect_to);
        /* a host name or address: it goes into the report's JSON as it is */
        if (strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:[]") !=
            strlen(host)) {
            fprintf(stderr, "strata-stage-bench probe-link: '%s' is not a host name or address\n",
                    host);
            return STRATA_EXIT_USAGE;
        }
    }
    for (int i = 0; i < nsizes; i++)
        if ((double)rows[i] * H * 4 > (double)(WIRE_PROBE_MAX_FRAME - 4096)) {
            fprintf(stderr, "strata-stage-bench probe-link: %d rows of %d floats exceed a frame\n",
                    rows[i], H);
            return STRATA_EXIT_USAGE;
        }
    struct wire_auth_key key = {0};
    struct wire_tls *tls = NULL;
    int rc = 0;
    if (key_file) {
        if ((rc = wire_auth_key_load(&key, key_file, NULL)) == 0 && key.len == 0)
            rc = strata_set_error(STRATA_EINVAL, "%s: no key", key_file);
        if (rc == 0) rc = wire_tls_new(&tls, &(struct wire_tls_options){.psk = &key});
    }
    if (rc == 0)
        rc = listen ? probe_listen(bind, port, port_file, tls, once)
                    : probe_connect(host, cport, tls, H, rows, nsizes, seconds, max_trips, out);
    wire_tls_free(tls);
    wire_auth_key_clear(&key);
    if (rc < 0) {
        fprintf(stderr, "strata-stage-bench probe-link: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}
