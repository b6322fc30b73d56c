/* Loopback tests of the framed transport and the Hello handshake: large and trickled
 * frames, max-frame refusal before allocation, read/connect timeouts, refused connects,
 * peer closes, HMAC authentication (success, wrong key, missing key, fingerprint
 * mismatch), the Error frame sent on a protocol violation, the non-blocking receive
 * (partial frames kept per conn, buffers growing with the bytes that came), the queued
 * non-blocking send (in order with blocking sends, refused past its limit) and the 2 KiB
 * cap on frames before authentication. Fast enough to run under
 * ASan in the default test pass. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/wire.h"

#define TIMEOUT_MS 5000

/* A plain blocking socket connected to 127.0.0.1:port, for sending hand-made bytes. */
static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    return fd;
}

static void raw_send(int fd, const void *bytes, size_t n) {
    assert_int_equal(send(fd, bytes, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* ---- echo server on a thread ---- */

struct echo_server {
    struct wire_listener listener;
    pthread_t thread;
    int frames; /* frames echoed */
    int result; /* status of the last receive */
};

static void *echo_main(void *arg) {
    struct echo_server *s = arg;
    struct wire_conn conn;
    s->result = wire_accept(&conn, &s->listener, 64u << 20, TIMEOUT_MS);
    while (!s->result) {
        const uint8_t *frame;
        size_t len;
        s->result = wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS);
        if (s->result) break;
        s->result = wire_send_frame(&conn, frame, len, TIMEOUT_MS);
        s->frames++;
    }
    wire_close(&conn);
    return NULL;
}

static void large_frames_echo_intact(void **state) {
    (void)state;
    struct echo_server server = {0};
    assert_int_equal(wire_listen(&server.listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&server.thread, NULL, echo_main, &server), 0);
    struct wire_conn conn;
    assert_int_equal(wire_connect(&conn, "127.0.0.1", server.listener.port, 64u << 20, TIMEOUT_MS),
                     0);
    const size_t sizes[] = {1, 7, 4096, 3u << 20, 24u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        uint8_t *payload = malloc(sizes[i]);
        for (size_t j = 0; j < sizes[i]; ++j)
            payload[j] = (uint8_t)(j * 31 + i);
        assert_int_equal(wire_send_frame(&conn, payload, sizes[i], TIMEOUT_MS), 0);
        const uint8_t *got;
        size_t len;
        assert_int_equal(wire_recv_frame(&conn, &got, &len, TIMEOUT_MS), 0);
        assert_int_equal(len, sizes[i]);
        assert_memory_equal(got, payload, len);
        assert_int_equal((uintptr_t)got % 64, 0);
        free(payload);
    }
    wire_close(&conn);
    pthread_join(server.thread, NULL);
    assert_int_equal(server.frames, 5);
    assert_int_equal(server.result, STRATA_ECLOSED); /* our close ends the echo loop cleanly */
    wire_listener_close(&server.listener);
}

struct trickle {
    int fd;
    const uint8_t *bytes;
    size_t n;
};

/* Sends one byte per millisecond so the receiver sees many short reads. */
static void *trickle_main(void *arg) {
    struct trickle *t = arg;
    for (size_t i = 0; i < t->n; ++i) {
        if (send(t->fd, t->bytes + i, 1, MSG_NOSIGNAL) != 1) break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return NULL;
}

static void trickled_frame_is_reassembled(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 0, TIMEOUT_MS), 0);
    uint8_t bytes[4 + 40] = {40, 0, 0, 0};
    for (int i = 0; i < 40; ++i)
        bytes[4 + i] = (uint8_t)(100 + i);
    struct trickle trickle = {fd, bytes, sizeof bytes};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, trickle_main, &trickle), 0);
    const uint8_t *frame;
    size_t len;
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), 0);
    pthread_join(thread, NULL);
    assert_int_equal(len, 40);
    assert_memory_equal(frame, bytes + 4, 40);
    close(fd);
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), STRATA_ECLOSED);
    wire_close(&conn);
    wire_listener_close(&listener);
}

static void oversized_frame_refused_before_allocation(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 1u << 20, TIMEOUT_MS), 0);
    const uint8_t prefix[4] = {0x00, 0x00, 0x00, 0x80}; /* 2 GiB */
    raw_send(fd, prefix, 4);
    const uint8_t *frame;
    size_t len;
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), STRATA_EFORMAT);
    assert_non_null(
        strstr(strata_last_error(), "announced a frame of 2147483648 bytes (allowed 1..1048576)"));
    assert_int_equal(conn.rx_cap, 0); /* nothing was allocated */
    assert_true(conn.broken);
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), STRATA_ECLOSED);
    /* The sender side refuses too. */
    assert_int_equal(wire_send_frame(&conn, prefix, 0, TIMEOUT_MS), STRATA_ECLOSED);
    close(fd);
    wire_close(&conn);
    wire_listener_close(&listener);
}

static void read_timeout_then_recovery(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 0, TIMEOUT_MS), 0);
    const uint8_t *frame;
    size_t len;
    int64_t start = cli_now_ms();
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, 150), STRATA_ETIMEOUT);
    int64_t waited = cli_now_ms() - start;
    assert_true(waited >= 140 && waited < 2000);
    assert_false(conn.broken); /* nothing was read: the connection is still usable */
    const uint8_t bytes[6] = {2, 0, 0, 0, 'o', 'k'};
    raw_send(fd, bytes, 6);
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), 0);
    assert_memory_equal(frame, "ok", 2);
    /* Half a frame, then silence: a timeout now breaks the connection. */
    raw_send(fd, bytes, 5);
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, 100), STRATA_ETIMEOUT);
    assert_true(conn.broken);
    close(fd);
    wire_close(&conn);
    wire_listener_close(&listener);
}

static void write_timeout_when_peer_stops_reading(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn sender, receiver;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    assert_int_equal(wire_connect(&sender, NULL, listener.port, 0, TIMEOUT_MS), 0);
    assert_int_equal(wire_accept(&receiver, &listener, 0, TIMEOUT_MS), 0);
    size_t size = 64u << 20; /* far beyond loopback socket buffers; the receiver never reads */
    uint8_t *payload = calloc(size, 1);
    assert_non_null(payload);
    int64_t start = cli_now_ms();
    assert_int_equal(wire_send_frame(&sender, payload, size, 300), STRATA_ETIMEOUT);
    int64_t waited = cli_now_ms() - start;
    assert_true(waited >= 290 && waited < 5000);
    assert_true(sender.broken); /* part of a frame went out: the stream cannot be resumed */
    free(payload);
    wire_close(&sender);
    wire_close(&receiver);
    wire_listener_close(&listener);
}

static void peer_close_mid_frame_is_reported(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 0, TIMEOUT_MS), 0);
    const uint8_t bytes[7] = {10, 0, 0, 0, 1, 2, 3};
    raw_send(fd, bytes, sizeof bytes);
    close(fd);
    const uint8_t *frame;
    size_t len;
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), STRATA_ECLOSED);
    assert_non_null(strstr(strata_last_error(), "3 bytes into a 10-byte frame"));
    wire_close(&conn);
    wire_listener_close(&listener);
}

static void connect_refused_and_timeout(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int port = listener.port;
    wire_listener_close(&listener);
    assert_int_equal(wire_connect(&conn, NULL, port, 0, TIMEOUT_MS), STRATA_EIO);
    assert_non_null(strstr(strata_last_error(), "refused"));
    wire_close(&conn);

    /* A listener with a full accept queue drops new SYNs, so connect must time out (unless
     * the host answers overflow with a reset instead: tcp_abort_on_overflow). */
    FILE *sysctl = fopen("/proc/sys/net/ipv4/tcp_abort_on_overflow", "r");
    int abort_on_overflow = 0;
    if (sysctl) {
        if (fscanf(sysctl, "%d", &abort_on_overflow) != 1) abort_on_overflow = 0;
        fclose(sysctl);
    }
    if (abort_on_overflow) {
        printf("connect timeout part skipped: tcp_abort_on_overflow is set on this host\n");
        return;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    socklen_t addr_len = sizeof addr;
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(fd, 0), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &addr_len), 0);
    struct wire_conn queued[8];
    int timed_out = -1;
    for (int i = 0; i < 8 && timed_out < 0; ++i) {
        int64_t start = cli_now_ms();
        int rc = wire_connect(&queued[i], NULL, ntohs(addr.sin_port), 0, 200);
        if (rc == STRATA_ETIMEOUT) {
            int64_t waited = cli_now_ms() - start;
            assert_true(waited >= 190 && waited < 3000);
            timed_out = i;
        } else {
            assert_int_equal(rc, 0);
        }
    }
    assert_true(timed_out > 0);
    for (int i = 0; i <= timed_out; ++i)
        wire_close(&queued[i]);
    close(fd);
}

/* ---- handshake ---- */

struct handshake_server {
    struct wire_listener listener;
    pthread_t thread;
    struct wire_auth_key key;
    struct wire_hello self, peer;
    int result;
};

static void *handshake_main(void *arg) {
    struct handshake_server *s = arg;
    struct wire_conn conn;
    s->result = wire_accept(&conn, &s->listener, 0, TIMEOUT_MS);
    if (!s->result)
        s->result = wire_handshake_server(&s->peer, &conn, &s->self, &s->key, TIMEOUT_MS);
    wire_close(&conn);
    return NULL;
}

static void make_key(struct wire_auth_key *key, const char *text) {
    memset(key, 0, sizeof *key);
    key->len = strlen(text);
    memcpy(key->bytes, text, key->len);
}

static void make_hello(struct wire_hello *h, int stage, uint8_t fingerprint_byte) {
    memset(h, 0, sizeof *h);
    h->stage_index = stage;
    h->layer_start = stage * 4;
    h->layer_end = stage * 4 + 4;
    h->role = WIRE_ROLE_STAGE;
    h->has_fingerprint = 1;
    memset(h->fingerprint, fingerprint_byte, sizeof h->fingerprint);
    snprintf(h->name, sizeof h->name, "stage-%d", stage);
}

/* Runs a handshake; returns the client status and leaves the server's in server->result. */
static int run_handshake(struct handshake_server *server, const char *server_key,
                         const char *client_key, uint8_t client_fingerprint,
                         struct wire_hello *client_peer) {
    memset(server, 0, sizeof *server);
    if (server_key) make_key(&server->key, server_key);
    make_hello(&server->self, 1, 0xab);
    assert_int_equal(wire_listen(&server->listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&server->thread, NULL, handshake_main, server), 0);
    struct wire_auth_key key;
    struct wire_hello self;
    struct wire_conn conn;
    memset(&key, 0, sizeof key);
    if (client_key) make_key(&key, client_key);
    make_hello(&self, 0, client_fingerprint);
    int rc = wire_connect(&conn, NULL, server->listener.port, 0, TIMEOUT_MS);
    if (!rc) rc = wire_handshake_client(client_peer, &conn, &self, &key, TIMEOUT_MS);
    wire_close(&conn);
    pthread_join(server->thread, NULL);
    wire_listener_close(&server->listener);
    return rc;
}

static void handshake_with_shared_key_succeeds(void **state) {
    (void)state;
    struct handshake_server server;
    struct wire_hello peer;
    assert_int_equal(run_handshake(&server, "correct horse battery staple",
                                   "correct horse battery staple", 0xab, &peer),
                     0);
    assert_int_equal(server.result, 0);
    assert_int_equal(peer.stage_index, 1);
    assert_int_equal(peer.role, WIRE_ROLE_SERVER);
    assert_string_equal(peer.name, "stage-1");
    assert_int_equal(server.peer.stage_index, 0);
    assert_int_equal(server.peer.layer_end, 4);
    assert_string_equal(server.peer.name, "stage-0");
    /* Without keys on both sides the same exchange runs unauthenticated. */
    assert_int_equal(run_handshake(&server, NULL, NULL, 0xab, &peer), 0);
    assert_int_equal(server.result, 0);
}

static void handshake_refuses_wrong_or_missing_key(void **state) {
    (void)state;
    struct handshake_server server;
    struct wire_hello peer;
    assert_int_equal(run_handshake(&server, "correct horse battery staple",
                                   "incorrect horse battery", 0xab, &peer),
                     STRATA_EPEER);
    assert_non_null(strstr(strata_last_error(), "wrong key"));
    assert_int_equal(server.result, STRATA_EAUTH);
    assert_int_equal(run_handshake(&server, "correct horse battery staple", NULL, 0xab, &peer),
                     STRATA_EPEER);
    assert_non_null(strstr(strata_last_error(), "no auth proof"));
    assert_int_equal(server.result, STRATA_EAUTH);
    assert_int_equal(run_handshake(&server, NULL, "correct horse battery staple", 0xab, &peer),
                     STRATA_EPEER);
    assert_int_equal(server.result, STRATA_EAUTH);
    assert_int_equal(run_handshake(&server, "correct horse battery staple",
                                   "correct horse battery staple", 0xcd, &peer),
                     STRATA_EPEER);
    assert_non_null(strstr(strata_last_error(), "model fingerprint differs"));
    assert_int_equal(server.result, STRATA_EINVAL);
}

static void protocol_violation_gets_error_frame(void **state) {
    (void)state;
    struct handshake_server server;
    memset(&server, 0, sizeof server);
    make_key(&server.key, "correct horse battery staple");
    make_hello(&server.self, 1, 0xab);
    assert_int_equal(wire_listen(&server.listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&server.thread, NULL, handshake_main, &server), 0);
    struct wire_conn conn;
    assert_int_equal(wire_connect(&conn, NULL, server.listener.port, 0, TIMEOUT_MS), 0);
    const uint8_t *frame;
    size_t len;
    struct wire_hello hello;
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), 0);
    assert_int_equal(wire_read_hello(&hello, frame, len), 0);
    assert_true(hello.has_challenge);
    uint8_t garbage[64] __attribute__((aligned(8)));
    memset(garbage, 0x41, sizeof garbage);
    assert_int_equal(wire_send_frame(&conn, garbage, sizeof garbage, TIMEOUT_MS), 0);
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), 0);
    struct wire_error err;
    assert_int_equal(wire_read_error(&err, frame, len), 0);
    assert_int_equal(err.code, STRATA_EFORMAT);
    assert_non_null(strstr(err.message, "not a Strata frame"));
    assert_int_equal(wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS), STRATA_ECLOSED);
    wire_close(&conn);
    pthread_join(server.thread, NULL);
    assert_int_equal(server.result, STRATA_EFORMAT);
    wire_listener_close(&server.listener);
}

/* wire_recv_frame_nb: a frame arriving in pieces is kept in the conn between calls, never
 * waited for; the buffer grows with the bytes that arrived, not with the announced length. */
static void nonblocking_receive_keeps_partial_frames(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    const uint8_t *frame;
    size_t len;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 0, TIMEOUT_MS), 0);
    int64_t start = cli_now_ms();
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), WIRE_RECV_PENDING);
    assert_true(cli_now_ms() - start < 100); /* nothing there: returns at once */
    assert_int_equal(wire_conn_partial_since(&conn), 0);
    uint8_t bytes[4 + 100] = {100, 0, 0, 0};
    for (int i = 0; i < 100; ++i)
        bytes[4 + i] = (uint8_t)(7 * i);
    raw_send(fd, bytes, 2); /* half a prefix */
    usleep(20000);
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), WIRE_RECV_PENDING);
    assert_true(wire_conn_partial_since(&conn) > 0);
    raw_send(fd, bytes + 2, 12); /* the rest of the prefix and 10 bytes */
    usleep(20000);
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), WIRE_RECV_PENDING);
    assert_int_equal(conn.rx_have, 10);
    raw_send(fd, bytes + 14, sizeof bytes - 14);
    usleep(20000);
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), 0);
    assert_int_equal(len, 100);
    assert_memory_equal(frame, bytes + 4, 100);
    assert_int_equal(wire_conn_partial_since(&conn), 0);
    /* 512 MiB announced (allowed: max_frame is 1 GiB), 1000 bytes sent: 64 KiB held. */
    const uint8_t big[4] = {0, 0, 0, 0x20};
    uint8_t some[1000];
    memset(some, 0x5a, sizeof some);
    raw_send(fd, big, 4);
    raw_send(fd, some, sizeof some);
    usleep(20000);
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), WIRE_RECV_PENDING);
    assert_int_equal(conn.rx_have, 1000);
    assert_true(conn.rx_cap <= (64u << 10));
    close(fd);
    usleep(20000);
    assert_int_equal(wire_recv_frame_nb(&conn, &frame, &len), STRATA_ECLOSED);
    assert_non_null(strstr(strata_last_error(), "1000 bytes into a 536870912-byte frame"));
    wire_close(&conn);
    wire_listener_close(&listener);
}

/* Before the handshake is through, a peer is held to WIRE_HANDSHAKE_MAX_FRAME on both
 * sides, whatever the conn allows afterwards: a 1 GiB announcement allocates nothing. */
static void handshake_frames_capped_before_authentication(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn conn;
    struct wire_hello self, peer;
    struct wire_auth_key key;
    const uint8_t gib[4] = {0, 0, 0, 0x40};
    make_key(&key, "correct horse battery staple");
    make_hello(&self, 1, 0xab);
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    /* Server side: the client announces 1 GiB instead of its Hello. */
    int fd = raw_connect(listener.port);
    assert_int_equal(wire_accept(&conn, &listener, 0, TIMEOUT_MS), 0);
    assert_int_equal(conn.max_frame, WIRE_DEFAULT_MAX_FRAME);
    raw_send(fd, gib, 4);
    assert_int_equal(wire_handshake_server(&peer, &conn, &self, &key, TIMEOUT_MS), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "announced a frame of 1073741824 bytes (allowed "
                                                "1..2048)"));
    assert_int_equal(conn.rx_cap, 0);
    assert_int_equal(conn.max_frame, WIRE_DEFAULT_MAX_FRAME); /* restored */
    wire_close(&conn);
    close(fd);
    /* Client side: the "server" announces 1 GiB instead of its Hello. */
    struct wire_conn client, server_side;
    assert_int_equal(wire_connect(&client, NULL, listener.port, 0, TIMEOUT_MS), 0);
    assert_int_equal(wire_accept(&server_side, &listener, 0, TIMEOUT_MS), 0);
    raw_send(server_side.fd, gib, 4);
    assert_int_equal(wire_handshake_client(&peer, &client, &self, &key, TIMEOUT_MS),
                     STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "(allowed 1..2048)"));
    assert_int_equal(client.rx_cap, 0);
    wire_close(&client);
    wire_close(&server_side);
    wire_listener_close(&listener);
}

struct reader {
    struct wire_conn *conn;
    int frames, in_order;
};

/* Reads frames of 32 KiB whose bytes are their index, until the sender closes. */
static void *reader_main(void *arg) {
    struct reader *r = arg;
    const uint8_t *frame;
    size_t len;
    r->in_order = 1;
    while (wire_recv_frame(r->conn, &frame, &len, TIMEOUT_MS) == 0) {
        if (len != (32u << 10) || frame[0] != (uint8_t)r->frames || frame[len - 1] != frame[0])
            r->in_order = 0;
        r->frames++;
    }
    return NULL;
}

/* wire_send_frame_nb: to a peer that does not read, frames queue in the conn and the call
 * returns at once; a later blocking send goes after the queue; past max_queued the peer is
 * refused (STRATA_EBUSY). */
static void queued_sends_never_wait(void **state) {
    (void)state;
    struct wire_listener listener;
    struct wire_conn sender, receiver;
    static uint8_t frame[32u << 10];
    int small = 65536; /* far below 1.25 MiB; not so small that delayed ACKs crawl */
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    assert_int_equal(wire_connect(&sender, NULL, listener.port, 0, TIMEOUT_MS), 0);
    assert_int_equal(wire_accept(&receiver, &listener, 0, TIMEOUT_MS), 0);
    setsockopt(sender.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(receiver.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    int64_t start = cli_now_ms();
    for (int i = 0; i < 40; i++) {
        memset(frame, i, sizeof frame);
        assert_int_equal(wire_send_frame_nb(&sender, frame, sizeof frame, 4u << 20), 0);
    }
    assert_true(cli_now_ms() - start < 500);
    assert_true(wire_conn_tx_pending(&sender) > 0); /* 1.25 MiB cannot all be in flight */
    assert_true(wire_conn_tx_waiting_since(&sender) > 0);
    struct reader r = {&receiver, 0, 0};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, reader_main, &r), 0);
    memset(frame, 40, sizeof frame);
    assert_int_equal(wire_send_frame(&sender, frame, sizeof frame, TIMEOUT_MS), 0);
    assert_int_equal(wire_conn_tx_pending(&sender), 0);
    assert_int_equal(wire_conn_tx_waiting_since(&sender), 0);
    /* A queue limit smaller than the frame: the peer counts as not reading. */
    assert_int_equal(wire_send_frame_nb(&sender, frame, 100, 50), STRATA_EBUSY);
    assert_non_null(strstr(strata_last_error(), "does not read"));
    assert_true(sender.broken);
    wire_close(&sender);
    pthread_join(thread, NULL);
    assert_int_equal(r.frames, 41);
    assert_true(r.in_order);
    wire_close(&receiver);
    wire_listener_close(&listener);
}

static void auth_key_sources(void **state) {
    (void)state;
    struct wire_auth_key key;
    char path[4096];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(path, sizeof path, "%s/key", tmp ? tmp : "/tmp");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("0123456789abcdef-secret\n", f);
    fclose(f);
    assert_int_equal(wire_auth_key_load(&key, path, NULL), 0);
    assert_int_equal(key.len, 23);
    assert_memory_equal(key.bytes, "0123456789abcdef-secret", 23);
    setenv("STRATA_TEST_KEY", "short", 1);
    assert_int_equal(wire_auth_key_load(&key, NULL, "STRATA_TEST_KEY"), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "need at least 16"));
    setenv("STRATA_TEST_KEY", "a-long-enough-environment-key", 1);
    assert_int_equal(wire_auth_key_load(&key, NULL, "STRATA_TEST_KEY"), 0);
    assert_int_equal(key.len, strlen("a-long-enough-environment-key"));
    unsetenv("STRATA_TEST_KEY");
    assert_int_equal(wire_auth_key_load(&key, NULL, "STRATA_TEST_KEY"), 0);
    assert_int_equal(key.len, 0);
    assert_int_equal(wire_auth_key_load(&key, "/nonexistent/key", NULL), STRATA_EIO);
    uint8_t a[32], b[32];
    assert_int_equal(wire_model_fingerprint(a, "{\"x\":1}", 7, "bfloat16"), 0);
    assert_int_equal(wire_model_fingerprint(b, "{\"x\":1}", 7, "float32"), 0);
    assert_memory_not_equal(a, b, 32);
    /* Same config bytes and dtype give the same fingerprint; one changed byte does not. */
    assert_int_equal(wire_model_fingerprint(b, "{\"x\":1}", 7, "bfloat16"), 0);
    assert_memory_equal(a, b, 32);
    assert_int_equal(wire_model_fingerprint(b, "{\"x\":2}", 7, "bfloat16"), 0);
    assert_memory_not_equal(a, b, 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(large_frames_echo_intact),
        cmocka_unit_test(trickled_frame_is_reassembled),
        cmocka_unit_test(oversized_frame_refused_before_allocation),
        cmocka_unit_test(read_timeout_then_recovery),
        cmocka_unit_test(write_timeout_when_peer_stops_reading),
        cmocka_unit_test(peer_close_mid_frame_is_reported),
        cmocka_unit_test(connect_refused_and_timeout),
        cmocka_unit_test(handshake_with_shared_key_succeeds),
        cmocka_unit_test(handshake_refuses_wrong_or_missing_key),
        cmocka_unit_test(protocol_violation_gets_error_frame),
        cmocka_unit_test(auth_key_sources),
        cmocka_unit_test(nonblocking_receive_keeps_partial_frames),
        cmocka_unit_test(handshake_frames_capped_before_authentication),
        cmocka_unit_test(queued_sends_never_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
