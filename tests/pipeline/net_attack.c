/* net_attack: the outsider of the stages' attack table, as a test tool. Each mode does one
 * thing an attacker does to a stage's port and prints what it saw as `key value` lines
 * for tests/pipeline/pipeline_attack_test.sh to judge:
 *
 *   idle     --count N [--hold-s S]   opens N TCP connections and sends nothing
 *   trickle  --count N [--hold-s S]   N connections sending 1 byte per second
 *   reconnect --count N [--addresses A] [--hold-s S]
 *                                     N connections sending nothing, each reopened the moment
 *                                     the stage drops it, spread over A source addresses
 *                                     (127.0.1.1 .. 127.0.1.A; without --addresses all from
 *                                     --src or 127.0.0.1): "reconnects" when it ends
 *   authidle --count N [--hold-s S]   N clients that complete the handshake (--key-file) and
 *                                     then send nothing: "holding" those the stage kept,
 *                                     "refused" those it turned away (an Error or a close
 *                                     within 0.1 s: the client cap)
 *   bigframe                          announces a 1 GiB frame before any handshake, then
 *                                     waits: "closed_after_ms" when the stage hangs up
 *   partial                           handshakes as a client, sends 5 bytes of a frame and
 *                                     stalls for --hold-s
 *   wrongkey --seconds S              TLS-PSK handshakes with the key in --key-file (a wrong
 *                                     one) in a loop: "attempts" and "refused_by_tls" (the
 *                                     stage ran the handshake and said no) vs "dropped"
 *   control                           handshakes as a client, sends Control Drain and Ping:
 *                                     "reply_ms" until the first frame, "reply_kind" its kind
 *   describe                          a Control Describe (ring describe) sent raw, before any
 *                                     handshake: "noauth_closed_after_ms" (-1: still open),
 *                                     "noauth_answered" 0/1; then with the key (--key-file):
 *                                     "auth_stages" N, or "auth_error" with the message
 *
 * --src ADDR binds the local address (127.0.0.2 .. on loopback: another "host"). Connection
 * modes print "holding N" once their sockets are open, then keep them until --hold-s ends or
 * the tool is killed. Exit 0 when the mode ran, 2 for a bad command line, 1 on a failure to
 * run the mode itself. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/client.h"
#include "wire/wire.h"

struct opts {
    const char *mode, *src, *key_file;
    int port, count, hold_s, seconds, insecure, addresses;
};

/* A TCP connection to the stage from `src` (NULL: the default address); non-blocking ones
 * return while the connect is still under way. */
static int tcp_open_from(const struct opts *o, const char *src, int nonblocking) {
    struct sockaddr_in to = {0}, from = {0};
    int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    if (src) {
        from.sin_family = AF_INET;
        inet_pton(AF_INET, src, &from.sin_addr);
        if (bind(fd, (struct sockaddr *)&from, sizeof from) < 0) goto fail;
    }
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)o->port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0 &&
        !(nonblocking && errno == EINPROGRESS))
        goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

static int tcp_open(const struct opts *o) {
    return tcp_open_from(o, o->src, 0);
}

/* idle / trickle: N sockets, optionally one byte per second each. */
static int run_hold(const struct opts *o, int trickle) {
    int *fds = calloc((size_t)o->count, sizeof *fds), open_n = 0;
    if (!fds) return 1;
    for (int i = 0; i < o->count; i++) {
        fds[i] = tcp_open(o);
        if (fds[i] >= 0) open_n++;
    }
    printf("holding %d\n", open_n);
    fflush(stdout);
    int64_t end = cli_now_ms() + (int64_t)o->hold_s * 1000;
    while (cli_now_ms() < end) {
        sleep(1);
        for (int i = 0; trickle && i < o->count; i++)
            if (fds[i] >= 0 && send(fds[i], "\x16", 1, MSG_NOSIGNAL) != 1) {
                close(fds[i]);
                fds[i] = -1;
            }
    }
    for (int i = 0; i < o->count; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    return 0;
}

static volatile sig_atomic_t stop_now; /* SIGTERM / SIGINT: end the mode and report */

static void on_stop(int sig) {
    (void)sig;
    stop_now = 1;
}

/* reconnect: N silent connections, each reopened as soon as the stage closes it (what a
 * flood of reconnecting clients, or a buggy client in a loop, looks like to the acceptor). */
static int run_reconnect(const struct opts *o) {
    int n = o->count;
    int *fds = calloc((size_t)n, sizeof *fds);
    struct pollfd *p = calloc((size_t)n, sizeof *p);
    char(*src)[32] = calloc((size_t)n, sizeof *src);
    long long reconnects = 0;
    if (!fds || !p || !src) return 1;
    for (int i = 0; i < n; i++) {
        if (o->addresses > 0)
            snprintf(src[i], sizeof src[i], "127.0.1.%d", 1 + i % o->addresses);
        else
            snprintf(src[i], sizeof src[i], "%s", o->src ? o->src : "127.0.0.1");
        fds[i] = tcp_open_from(o, src[i], 1);
    }
    printf("holding %d\n", n);
    fflush(stdout);
    int64_t end = cli_now_ms() + (int64_t)o->hold_s * 1000;
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    while (cli_now_ms() < end && !stop_now) {
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){fds[i], POLLIN, 0};
        if (poll(p, (nfds_t)n, 100) < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            char buf[4096];
            int dead = fds[i] < 0;
            if (!dead && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = recv(fds[i], buf, sizeof buf, 0);
                dead = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR);
            }
            if (!dead) continue;
            if (fds[i] >= 0) close(fds[i]);
            fds[i] = tcp_open_from(o, src[i], 1);
            reconnects++;
        }
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    printf("reconnects %lld\n", reconnects);
    free(fds);
    free(p);
    free(src);
    return 0;
}

/* Waits up to ms for the peer to close; returns the ms it took or -1. */
static int64_t wait_close(int fd, int ms) {
    int64_t start = cli_now_ms();
    char buf[4096];
    while (cli_now_ms() - start < ms) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) return cli_now_ms() - start;
        }
    }
    return -1;
}

static int run_bigframe(const struct opts *o) {
    const uint8_t prefix[4] = {0, 0, 0, 0x40}; /* 1 GiB, little-endian */
    int fd = tcp_open(o);
    if (fd < 0) return 1;
    if (send(fd, prefix, 4, MSG_NOSIGNAL) != 4 || send(fd, "abcdefgh", 8, MSG_NOSIGNAL) != 8) {
        close(fd);
        return 1;
    }
    printf("holding 1\n");
    fflush(stdout);
    printf("closed_after_ms %lld\n", (long long)wait_close(fd, o->hold_s * 1000));
    close(fd);
    return 0;
}

static int client_open(struct strata_client *c, const struct opts *o, struct wire_tls **tls,
                       struct wire_auth_key *key) {
    struct wire_security sec;
    struct wire_security_flags f = {NULL, NULL, NULL, o->insecure, key};
    if (wire_auth_key_load(key, o->key_file, NULL) < 0 || wire_security_setup(&sec, &f) < 0) {
        fprintf(stderr, "net_attack: %s\n", strata_last_error());
        return -1;
    }
    *tls = sec.tls;
    if (client_connect_tls(c, "127.0.0.1", o->port, sec.tls, sec.hello_key, 3000) < 0) {
        fprintf(stderr, "net_attack: %s\n", strata_last_error());
        return -1;
    }
    return 0;
}

static int run_partial(const struct opts *o) {
    struct strata_client c;
    struct wire_tls *tls = NULL;
    struct wire_auth_key key;
    const uint8_t partial[5] = {100, 0, 0, 0, 1}; /* a 100-byte frame's prefix + 1 byte */
    if (client_open(&c, o, &tls, &key) < 0) return 1;
    /* Over TLS the same stall one layer down: 5 bytes of an application-data record. */
    const uint8_t record[5] = {0x17, 0x03, 0x03, 0x00, 0x40};
    if (send(c.conn.fd, c.conn.ssl ? record : partial, 5, MSG_NOSIGNAL) != 5) return 1;
    printf("holding 1\n");
    fflush(stdout);
    sleep((unsigned)o->hold_s);
    client_close(&c);
    wire_tls_free(tls);
    return 0;
}

static int run_authidle(const struct opts *o) {
    struct strata_client *c = calloc((size_t)o->count, sizeof *c);
    struct wire_tls **tls = calloc((size_t)o->count, sizeof *tls);
    struct wire_auth_key key;
    int held = 0, refused = 0, failed = 0;
    if (!c || !tls) return 1;
    for (int i = 0; i < o->count; i++) {
        c[i].conn.fd = -1;
        if (client_open(&c[i], o, &tls[i], &key) < 0) {
            failed++;
            client_close(&c[i]);
            c[i].conn.fd = -1;
            continue;
        }
        /* Turned away after the handshake: an Error frame, then the close. */
        struct pollfd p = {c[i].conn.fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0) {
            refused++;
            client_close(&c[i]);
            c[i].conn.fd = -1;
        } else {
            held++;
        }
    }
    printf("refused %d\nfailed %d\nholding %d\n", refused, failed, held);
    fflush(stdout);
    int64_t end = cli_now_ms() + (int64_t)o->hold_s * 1000;
    signal(SIGTERM, on_stop);
    while (cli_now_ms() < end && !stop_now)
        usleep(100000);
    for (int i = 0; i < o->count; i++) {
        if (c[i].conn.fd >= 0) client_close(&c[i]);
        wire_tls_free(tls[i]);
    }
    free(c);
    free(tls);
    return 0;
}

static int run_control(const struct opts *o) {
    struct strata_client c;
    struct wire_tls *tls = NULL;
    struct wire_auth_key key;
    struct wire_arena arena;
    const uint8_t *frame;
    size_t len;
    enum wire_kind kind;
    if (client_open(&c, o, &tls, &key) < 0 || wire_arena_init(&arena, 256) < 0) return 1;
    enum wire_control_kind kinds[2] = {WIRE_CONTROL_DRAIN, WIRE_CONTROL_PING};
    for (int i = 0; i < 2; i++) {
        struct wire_control msg = {.kind = kinds[i], .nonce = 0, .seq = 7};
        int64_t start = cli_now_ms();
        if (wire_build_control(&arena, &msg) < 0 ||
            wire_send_frame(&c.conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena), 1000) <
                0) {
            printf("send_failed %s\n", strata_last_error());
            break;
        }
        int rc = wire_recv_frame(&c.conn, &frame, &len, o->hold_s * 1000);
        if (rc < 0) {
            printf("reply_ms -1\nreply_kind none (%s)\n", strata_last_error());
            break;
        }
        wire_verify(&kind, NULL, frame, len);
        printf("reply_ms %lld\nreply_kind %s\n", (long long)(cli_now_ms() - start),
               wire_kind_name(kind));
        if (kind == WIRE_KIND_ERROR) {
            struct wire_error err;
            if (wire_read_error(&err, frame, len) == 0) printf("reply_error %s\n", err.message);
        }
    }
    wire_arena_free(&arena);
    client_close(&c);
    wire_tls_free(tls);
    return 0;
}

/* describe: a Describe with no handshake must get no answer (the stage closes the connection
 * as for any frame before the Hello); the same with the key lists the stages. */
static int run_describe(const struct opts *o) {
    struct wire_arena arena;
    struct wire_control msg = {.kind = WIRE_CONTROL_DESCRIBE, .nonce = 99};
    uint8_t prefix[4], buf[4096];
    int fd = tcp_open(o), answered = 0;
    if (fd < 0 || wire_arena_init(&arena, 256) < 0 || wire_build_control(&arena, &msg) < 0)
        return 1;
    uint32_t n = (uint32_t)wire_arena_frame_len(&arena);
    for (int i = 0; i < 4; i++)
        prefix[i] = (uint8_t)(n >> (8 * i));
    int64_t start = cli_now_ms(), closed = -1;
    if (send(fd, prefix, 4, MSG_NOSIGNAL) == 4) send(fd, wire_arena_frame(&arena), n, MSG_NOSIGNAL);
    wire_arena_free(&arena);
    while (cli_now_ms() - start < (int64_t)o->hold_s * 1000) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) {
            closed = cli_now_ms() - start;
            break;
        }
        /* A Describe answer would be a length-prefixed Control frame naming the stages. */
        if (r > 8 && memmem(buf, (size_t)r, "STRA", 4)) answered = 1;
    }
    close(fd);
    printf("noauth_closed_after_ms %lld\nnoauth_answered %d\n", (long long)closed, answered);
    struct strata_client c;
    struct wire_tls *tls = NULL;
    struct wire_auth_key key;
    static struct client_describe d;
    if (client_open(&c, o, &tls, &key) < 0) return 1;
    if (client_describe(&c, &d, o->hold_s * 1000) == 0)
        printf("auth_stages %d\n", d.num_stages);
    else
        printf("auth_error %s\n", strata_last_error());
    client_close(&c);
    wire_tls_free(tls);
    return 0;
}

/* wrongkey: how often the stage runs a full TLS handshake for this address. */
static int run_wrongkey(const struct opts *o) {
    struct wire_auth_key key;
    struct wire_tls *tls = NULL;
    long attempts = 0, refused_by_tls = 0, dropped = 0, accepted = 0;
    if (wire_auth_key_load(&key, o->key_file, NULL) < 0 ||
        wire_tls_new(&tls, &(struct wire_tls_options){.psk = &key}) < 0) {
        fprintf(stderr, "net_attack: %s\n", strata_last_error());
        return 1;
    }
    int64_t end = cli_now_ms() + (int64_t)o->seconds * 1000;
    while (cli_now_ms() < end) {
        struct wire_conn conn;
        memset(&conn, 0, sizeof conn);
        int fd = tcp_open(o);
        attempts++;
        if (fd < 0) {
            dropped++;
            continue;
        }
        conn.fd = fd;
        conn.open = 1;
        conn.max_frame = 4096;
        snprintf(conn.peer, sizeof conn.peer, "stage");
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); /* as wire_connect's */
        int rc = wire_tls_connect(&conn, tls, 2000);
        if (rc == 0) {
            /* TLS 1.3: the server checks the client's binder before answering, so a wrong
             * key's refusal comes as an alert (or a close) on the first read. */
            const uint8_t *frame;
            size_t len;
            rc = wire_recv_frame(&conn, &frame, &len, 2000);
            if (rc == 0) accepted++;
        }
        /* An alert means the stage ran the handshake and refused the key; a close before
         * any answer means it dropped the connection unanswered (rate-limited). */
        if (rc != 0 && strstr(strata_last_error(), "alert"))
            refused_by_tls++;
        else if (rc != 0)
            dropped++;
        if (rc != 0 && attempts == 1) printf("first_error %s\n", strata_last_error());
        wire_close(&conn);
    }
    printf("attempts %ld\nrefused_by_tls %ld\ndropped %ld\naccepted %ld\nseconds %d\n", attempts,
           refused_by_tls, dropped, accepted, o->seconds);
    wire_tls_free(tls);
    return 0;
}

int main(int argc, char **argv) {
    static const struct option longs[] = {{"port", 1, 0, 'p'},      {"count", 1, 0, 'n'},
                                          {"hold-s", 1, 0, 'h'},    {"seconds", 1, 0, 's'},
                                          {"src", 1, 0, 'S'},       {"key-file", 1, 0, 'k'},
                                          {"insecure", 0, 0, 'i'},  {"help", 0, 0, 'H'},
                                          {"addresses", 1, 0, 'a'}, {0, 0, 0, 0}};
    struct opts o = {.count = 1, .hold_s = 10, .seconds = 3};
    struct rlimit rl;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'p': o.port = atoi(optarg); break;
        case 'n': o.count = atoi(optarg); break;
        case 'h': o.hold_s = atoi(optarg); break;
        case 's': o.seconds = atoi(optarg); break;
        case 'S': o.src = optarg; break;
        case 'k': o.key_file = optarg; break;
        case 'i': o.insecure = 1; break;
        case 'a': o.addresses = atoi(optarg); break;
        case 'H':
            printf("usage: net_attack MODE --port P [--count N] [--hold-s S] [--seconds S] "
                   "[--src ADDR] [--addresses A] [--key-file F | --insecure]\n"
                   "modes: idle trickle reconnect authidle bigframe partial wrongkey control "
                   "describe\n");
            return 0;
        default: return 2;
        }
    }
    if (optind + 1 != argc || o.port <= 0 || o.count < 1) {
        fprintf(stderr, "usage: net_attack MODE --port P ... (--help)\n");
        return 2;
    }
    o.mode = argv[optind];
    signal(SIGPIPE, SIG_IGN);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (!strcmp(o.mode, "idle")) return run_hold(&o, 0);
    if (!strcmp(o.mode, "trickle")) return run_hold(&o, 1);
    if (!strcmp(o.mode, "reconnect")) return run_reconnect(&o);
    if (!strcmp(o.mode, "authidle")) return run_authidle(&o);
    if (!strcmp(o.mode, "bigframe")) return run_bigframe(&o);
    if (!strcmp(o.mode, "partial")) return run_partial(&o);
    if (!strcmp(o.mode, "wrongkey")) return run_wrongkey(&o);
    if (!strcmp(o.mode, "control")) return run_control(&o);
    if (!strcmp(o.mode, "describe")) return run_describe(&o);
    fprintf(stderr, "net_attack: unknown mode %s\n", o.mode);
    return 2;
}
