/* In-process loopback test of the TCP driver (runtime/stage/stage_server.h) with the client API
 * (runtime/stage/client.h): a one-stage pipeline on a golden model serves a wire Request with the
 * golden tokens, and a Request carrying the reserved nonce 0 makes stage 0 answer with a
 * connection-level Error (nonce 0, surfaced as REQUEST_EVENT_CONNECTION_ERROR) and close the
 * connection, while other clients keep being served. The same server on TLS 1.3 with a
 * pre-shared key serves a TLS client the golden tokens and refuses a plaintext client and a
 * client with another key.
 * The accept path's attacks, in process: hundreds of idle or trickling connections, a client
 * stalled mid-frame and a 1 GiB announcement before the Hello do not delay a real client;
 * control frames from a client get an immediate Error; wrong-key handshakes from one
 * address are cut off after a burst while other addresses are served; SIGTERM (the stop
 * flag) drains: the request in flight ends with the golden tokens, a new one is refused,
 * new connections are refused, and the server returns. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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
#include "runtime/stage/client.h"
#include "runtime/stage/stage_server.h"
#include "tests/runtime/stage/stage_test_pipeline.h"

static struct tp_golden golden;
static struct tp_pipeline pipe_one;
static struct stage_server_options server_opt;
static struct wire_auth_key no_key;
static volatile sig_atomic_t stop_flag;
static pthread_t server_thread;
static char port_file[1024];
static int port;
static struct wire_tls *server_tls; /* NULL for the plaintext group */
static int drain_delay_ms;          /* step delay for the drain group */

static struct wire_tls *psk_tls(const char *text) {
    struct wire_auth_key key = {0};
    struct wire_tls *tls = NULL;
    key.len = strlen(text);
    memcpy(key.bytes, text, key.len);
    if (wire_tls_new(&tls, &(struct wire_tls_options){.psk = &key}) < 0) return NULL;
    return tls;
}

/* The stop flag is a signal flag (stage_server_run's contract), so the test stops the loop
 * the way strata-stage does: a signal, delivered to the server thread itself. */
static void on_stop_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void *serve(void *arg) {
    (void)arg;
    stage_server_run(pipe_one.cores[0], &server_opt, &stop_flag);
    return NULL;
}

static int setup(void **state) {
    const char *tmp = getenv("TEST_TMPDIR");
    (void)state;
    if (tp_golden_load(&golden, "qwen3_gqa_tied") < 0) return -1;
    if (tp_pipeline_init(&pipe_one, &golden, 1, NULL, 64, 2, 8) < 0) return -1;
    snprintf(port_file, sizeof port_file, "%s/stage_server_test.%d.port", tmp ? tmp : "/tmp",
             (int)getpid());
    unlink(port_file);
    memset(&server_opt, 0, sizeof server_opt);
    server_opt.port_file = port_file;
    server_opt.key = &no_key;
    server_opt.tls = server_tls;
    server_opt.step_delay_ms = drain_delay_ms;
    server_opt.drain_timeout_ms = 10000;
    port = 0;
    stop_flag = 0;
    server_opt.log_level = STAGE_LOG_ERROR;
    stage_log_setup(0, STAGE_LOG_ERROR);
    {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGUSR1, &sa, NULL) != 0) return -1;
    }
    if (pthread_create(&server_thread, NULL, serve, NULL) != 0) return -1;
    for (int i = 0; i < 500 && port <= 0; i++) { /* up to 5 s for the port file */
        FILE *f = fopen(port_file, "r");
        if (f) {
            if (fscanf(f, "%d", &port) != 1) port = 0;
            fclose(f);
        }
        if (port <= 0) nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    return port > 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    pthread_kill(server_thread, SIGUSR1);
    pthread_join(server_thread, NULL);
    tp_pipeline_free(&pipe_one);
    tp_golden_free(&golden);
    unlink(port_file);
    wire_tls_free(server_tls);
    server_tls = NULL;
    return 0;
}

static int setup_drain(void **state) {
    drain_delay_ms = 20;
    int rc = setup(state);
    drain_delay_ms = 0;
    return rc;
}

static int setup_tls(void **state) {
    server_tls = psk_tls("a-pre-shared-key-of-enough-bytes");
    return server_tls ? setup(state) : -1;
}

/* Reads events until request `nonce` ends; returns the number of tokens. */
static int collect(struct strata_client *client, uint64_t nonce, int32_t *tokens, int cap) {
    int n = 0;
    for (;;) {
        struct request_event ev;
        int rc = client_next_event(client, &ev, 10000);
        if (rc < 0) fail_msg("client: %s", strata_last_error());
        if (ev.kind != REQUEST_EVENT_TOKEN) fail_msg("request failed: %s", ev.message);
        if (ev.nonce != nonce) continue;
        assert_true(n < cap);
        tokens[n++] = ev.token;
        if (ev.finish != WIRE_FINISH_NONE) return n;
    }
}

static void test_request_over_tcp(void **state) {
    struct strata_client client;
    struct stage_request req;
    int32_t tokens[64];
    (void)state;
    assert_int_equal(client_connect(&client, "127.0.0.1", port, &no_key, 5000), 0);
    tp_request(&req, 7, golden.prompt, golden.prompt_len, golden.n_steps);
    assert_int_equal(client_submit(&client, &req), 0);
    assert_int_equal(collect(&client, 7, tokens, 64), golden.n_steps);
    assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)golden.n_steps);
    client_close(&client);
}

/* The Hello a stage sends announces the layer range and index its backend computes
 * (stage_core_get_info), not numbers a caller passed next to it. */
static void test_hello_announces_the_backend_range(void **state) {
    struct wire_conn conn;
    struct wire_hello self, peer;
    struct stage_core_info info;
    (void)state;
    stage_core_get_info(pipe_one.cores[0], &info);
    assert_int_equal(wire_connect(&conn, "127.0.0.1", port, 0, 5000), 0);
    memset(&self, 0, sizeof self);
    self.version_major = WIRE_VERSION_MAJOR;
    self.version_minor = WIRE_VERSION_MINOR;
    self.stage_index = -1;
    self.role = WIRE_ROLE_CLIENT;
    snprintf(self.name, sizeof self.name, "stage_server_test");
    assert_int_equal(wire_handshake_client(&peer, &conn, &self, &no_key, 5000), 0);
    assert_int_equal(peer.stage_index, info.stage_index);
    assert_int_equal(peer.layer_start, info.role.layer_start);
    assert_int_equal(peer.layer_end, info.role.layer_end);
    assert_int_equal(peer.layer_start, pipe_one.stages[0].backend->role.layer_start);
    assert_int_equal(peer.layer_end, pipe_one.stages[0].backend->role.layer_end);
    assert_int_equal(peer.layer_end, golden.cfg.num_layers);
    wire_close(&conn);
}

static void test_reserved_nonce_is_a_connection_error(void **state) {
    struct strata_client bad, good;
    struct stage_request req;
    struct request_event ev;
    int32_t tokens[64];
    uint64_t marker = 0x0123456789abcdefull, zero = 0;
    uint8_t *frame;
    size_t len;
    int found = 0;
    (void)state;
    assert_int_equal(client_connect(&bad, "127.0.0.1", port, &no_key, 5000), 0);
    assert_int_equal(client_connect(&good, "127.0.0.1", port, &no_key, 5000), 0);
    /* client_submit refuses nonce 0, so build with a marker nonce and patch it to 0. */
    tp_request(&req, 0, golden.prompt, golden.prompt_len, 2);
    assert_int_equal(client_submit(&bad, &req), STRATA_EINVAL);
    req.nonce = marker;
    assert_int_equal(request_build(&bad.arena, &req), 0);
    len = wire_arena_frame_len(&bad.arena);
    frame = malloc(len);
    memcpy(frame, wire_arena_frame(&bad.arena), len);
    for (size_t i = 0; i + 8 <= len; i++)
        if (memcmp(frame + i, &marker, 8) == 0) {
            memcpy(frame + i, &zero, 8);
            found++;
        }
    assert_int_equal(found, 1);
    assert_int_equal(wire_send_frame(&bad.conn, frame, len, 5000), 0);
    free(frame);
    assert_int_equal(client_next_event(&bad, &ev, 10000), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_CONNECTION_ERROR);
    assert_true(ev.nonce == 0);
    assert_int_equal(ev.code, STRATA_EFORMAT);
    assert_non_null(strstr(ev.message, "nonce 0 is reserved"));
    assert_int_equal(client_next_event(&bad, &ev, 10000), STRATA_ECLOSED);
    client_close(&bad);
    /* The other client is still served. */
    tp_request(&req, 8, golden.prompt, golden.prompt_len, golden.n_steps);
    assert_int_equal(client_submit(&good, &req), 0);
    assert_int_equal(collect(&good, 8, tokens, 64), golden.n_steps);
    assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)golden.n_steps);
    client_close(&good);
}

/* Over TLS 1.3 (PSK): two requests in turn on one connection get the golden tokens. */
static void test_requests_over_tls(void **state) {
    struct strata_client client;
    struct stage_request req;
    int32_t tokens[64];
    struct wire_tls *tls = psk_tls("a-pre-shared-key-of-enough-bytes");
    (void)state;
    assert_non_null(tls);
    assert_int_equal(client_connect_tls(&client, "127.0.0.1", port, tls, NULL, 5000), 0);
    assert_non_null(client.conn.ssl);
    for (uint64_t nonce = 11; nonce <= 12; nonce++) {
        tp_request(&req, nonce, golden.prompt, golden.prompt_len, golden.n_steps);
        assert_int_equal(client_submit(&client, &req), 0);
        assert_int_equal(collect(&client, nonce, tokens, 64), golden.n_steps);
        assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)golden.n_steps);
    }
    client_close(&client);
    wire_tls_free(tls);
}

/* A client with another key and a plaintext client are refused; the server keeps serving. */
static void test_tls_refuses_wrong_key_and_plaintext(void **state) {
    struct strata_client client;
    struct wire_tls *wrong = psk_tls("another-key-that-does-not-match!");
    (void)state;
    assert_non_null(wrong);
    assert_true(client_connect_tls(&client, "127.0.0.1", port, wrong, NULL, 5000) < 0);
    assert_non_null(strstr(strata_last_error(), "TLS handshake"));
    client_close(&client);
    wire_tls_free(wrong);
    assert_true(client_connect(&client, "127.0.0.1", port, &no_key, 5000) < 0);
    assert_non_null(strstr(strata_last_error(), "require TLS"));
    client_close(&client);
    test_requests_over_tls(state);
}

/* A plain TCP socket to the server from local address `src` (NULL = any), blocking. */
static int raw_connect_from(const char *src) {
    struct sockaddr_in to = {0}, from = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (src) {
        from.sin_family = AF_INET;
        inet_pton(AF_INET, src, &from.sin_addr);
        assert_int_equal(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    }
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
    return fd;
}

/* One golden request on a fresh connection; returns the milliseconds it took. */
static int64_t timed_request(uint64_t nonce) {
    struct strata_client client;
    struct stage_request req;
    int32_t tokens[64];
    int64_t start = cli_now_ms();
    assert_int_equal(client_connect(&client, "127.0.0.1", port, &no_key, 2000), 0);
    tp_request(&req, nonce, golden.prompt, golden.prompt_len, golden.n_steps);
    assert_int_equal(client_submit(&client, &req), 0);
    assert_int_equal(collect(&client, nonce, tokens, 64), golden.n_steps);
    assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)golden.n_steps);
    client_close(&client);
    return cli_now_ms() - start;
}

/* Before the accept path had its own limits, two idle connections made every client time out (one
 * acceptor thread handshaking serially, 3 s each). Now 300 idle and 100 trickling ones (from this
 * address and from 127.0.0.2) leave a real client's request in the milliseconds. */
static void test_idle_connections_do_not_delay_clients(void **state) {
    enum { IDLE = 300, TRICKLE = 100 };
    int fds[IDLE + TRICKLE];
    (void)state;
    for (int i = 0; i < IDLE + TRICKLE; i++)
        fds[i] = raw_connect_from(i % 2 ? "127.0.0.2" : NULL);
    for (int round = 0; round < 3; round++) {
        for (int i = IDLE; i < IDLE + TRICKLE; i++)
            (void)!send(fds[i], "\x16", 1, MSG_NOSIGNAL);
        int64_t took = timed_request(100 + (uint64_t)round);
        print_message("request with %d idle + %d trickling connections: %lld ms\n", IDLE, TRICKLE,
                      (long long)took);
        assert_true(took < 1000);
    }
    for (int i = 0; i < IDLE + TRICKLE; i++)
        close(fds[i]);
}

/* A client that sends 5 bytes of a frame and stalls held stage 0's loop for 5 s; now its
 * bytes wait in its own buffer. A 1 GiB announcement before the Hello is refused from its
 * length prefix (the stage closes the connection at once). */
static void test_stalled_and_oversized_frames_hold_no_one(void **state) {
    struct strata_client staller;
    const uint8_t five[5] = {100, 0, 0, 0, 1}, gib[4] = {0, 0, 0, 0x40};
    char buf[4096];
    (void)state;
    assert_int_equal(client_connect(&staller, "127.0.0.1", port, &no_key, 2000), 0);
    assert_int_equal(send(staller.conn.fd, five, 5, MSG_NOSIGNAL), 5);
    for (int i = 0; i < 3; i++)
        assert_true(timed_request(200 + (uint64_t)i) < 1000);
    int fd = raw_connect_from(NULL);
    int64_t start = cli_now_ms();
    assert_int_equal(send(fd, gib, 4, MSG_NOSIGNAL), 4);
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t r = 1;
    while (r > 0 && cli_now_ms() - start < 2000 && poll(&p, 1, 2000) == 1)
        r = recv(fd, buf, sizeof buf, 0); /* the Hello, an Error, then the close */
    assert_true(r <= 0);
    assert_true(cli_now_ms() - start < 1000);
    close(fd);
    client_close(&staller);
}

/* Ping / Drain from a client: the client used to wait for a reply that never came. */
static void test_control_frames_from_clients_get_an_error(void **state) {
    struct strata_client client;
    struct wire_arena arena;
    const uint8_t *frame;
    size_t len;
    struct wire_error err;
    enum wire_control_kind kinds[3] = {WIRE_CONTROL_DRAIN, WIRE_CONTROL_PING,
                                       WIRE_CONTROL_SHUTDOWN};
    (void)state;
    assert_int_equal(client_connect(&client, "127.0.0.1", port, &no_key, 2000), 0);
    assert_int_equal(wire_arena_init(&arena, 256), 0);
    for (int i = 0; i < 3; i++) {
        struct wire_control msg = {.kind = kinds[i], .nonce = 40 + (uint64_t)i, .seq = 1};
        int64_t start = cli_now_ms();
        assert_int_equal(wire_build_control(&arena, &msg), 0);
        assert_int_equal(wire_send_frame(&client.conn, wire_arena_frame(&arena),
                                         wire_arena_frame_len(&arena), 1000),
                         0);
        assert_int_equal(wire_recv_frame(&client.conn, &frame, &len, 1000), 0);
        assert_true(cli_now_ms() - start < 500);
        assert_int_equal(wire_read_error(&err, frame, len), 0);
        assert_int_equal(err.code, STRATA_EINVAL);
        assert_true(err.nonce == 40 + (uint64_t)i);
        assert_non_null(strstr(err.message, "not accepted from clients"));
    }
    wire_arena_free(&arena);
    client_close(&client);
    assert_true(timed_request(300) < 1000); /* the connection's refusal harmed nothing */
}

/* Wrong-key TLS handshakes from 127.0.0.3, every other one half-closed after its
 * ClientHello: after a burst the stage stops running them (closes unanswered); a client
 * from 127.0.0.1 with the key is served meanwhile. */
static void test_failed_handshakes_are_rate_limited(void **state) {
    struct wire_tls *wrong = psk_tls("another-key-that-does-not-match!");
    int refused = 0, dropped = 0;
    int64_t start = cli_now_ms();
    (void)state;
    assert_non_null(wrong);
    for (int i = 0; i < 40; i++) {
        struct wire_conn conn;
        memset(&conn, 0, sizeof conn);
        conn.fd = raw_connect_from("127.0.0.3");
        conn.open = 1;
        conn.max_frame = WIRE_HANDSHAKE_MAX_FRAME;
        snprintf(conn.peer, sizeof conn.peer, "stage 0");
        fcntl(conn.fd, F_SETFL, fcntl(conn.fd, F_GETFL, 0) | O_NONBLOCK);
        int rc;
        if (i % 2) {
            /* Half-closed after the ClientHello: the verdict can still be read, so the
             * refusal must count although the stage sees the peer's side closed. */
            short events;
            assert_int_equal(wire_tls_start(&conn, wrong, 0), 0);
            rc = wire_tls_step(&conn, wrong, &events); /* the ClientHello goes out */
            if (rc == WIRE_TLS_PENDING) shutdown(conn.fd, SHUT_WR);
            while (rc == WIRE_TLS_PENDING) {
                struct pollfd p = {conn.fd, events, 0};
                poll(&p, 1, 2000);
                rc = wire_tls_step(&conn, wrong, &events);
            }
        } else {
            rc = wire_tls_connect(&conn, wrong, 2000);
        }
        if (rc == 0) {
            const uint8_t *frame;
            size_t len;
            rc = wire_recv_frame(&conn, &frame, &len, 2000);
        }
        assert_true(rc < 0);
        if (strstr(strata_last_error(), "alert"))
            refused++; /* the stage ran the handshake and refused the key */
        else
            dropped++;
        wire_close(&conn);
    }
    print_message("wrong-key handshakes: %d refused by TLS, %d closed unanswered\n", refused,
                  dropped);
    /* The stage's bucket: a burst of 10, then 2 per second (stage_accept.h's defaults). */
    int64_t allowed = 10 + 2 * (cli_now_ms() - start) / 1000 + 1;
    print_message("(allowed %lld in %lld ms)\n", (long long)allowed,
                  (long long)(cli_now_ms() - start));
    assert_true(refused >= 5 && refused <= allowed);
    assert_true(dropped >= 25);
    wire_tls_free(wrong);
    test_requests_over_tls(state); /* another address is not affected */
}

static struct strata_client drain_other;
static int drain_other_error;

/* SIGTERM mid-request: the request in flight finishes with the golden tokens; a new
 * request (on a connection made before) gets an Error naming the drain; a new connection
 * is refused; then the server returns by itself. */
static void test_sigterm_drains(void **state) {
    struct strata_client client;
    struct stage_request req;
    struct request_event ev;
    int32_t tokens[64];
    int n = 0;
    (void)state;
    assert_int_equal(client_connect(&client, "127.0.0.1", port, &no_key, 2000), 0);
    assert_int_equal(client_connect(&drain_other, "127.0.0.1", port, &no_key, 2000), 0);
    tp_request(&req, 500, golden.prompt, golden.prompt_len, golden.n_steps);
    assert_int_equal(client_submit(&client, &req), 0);
    assert_int_equal(client_next_event(&client, &ev, 5000), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_TOKEN);
    tokens[n++] = ev.token;
    pthread_kill(server_thread, SIGUSR1); /* strata-stage's SIGTERM sets the same flag */
    nanosleep(&(struct timespec){.tv_nsec = 50000000}, NULL);
    tp_request(&req, 501, golden.prompt, golden.prompt_len, 2);
    assert_int_equal(client_submit(&drain_other, &req), 0);
    assert_int_equal(client_next_event(&drain_other, &ev, 5000), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_ERROR);
    assert_true(ev.nonce == 501);
    assert_non_null(strstr(ev.message, "draining"));
    drain_other_error = 1;
    struct strata_client late;
    assert_true(client_connect(&late, "127.0.0.1", port, &no_key, 1000) < 0);
    client_close(&late);
    while (n < golden.n_steps) {
        assert_int_equal(client_next_event(&client, &ev, 5000), 0);
        assert_int_equal(ev.kind, REQUEST_EVENT_TOKEN);
        tokens[n++] = ev.token;
    }
    assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)golden.n_steps);
    pthread_join(server_thread, NULL); /* returns once drained */
    server_thread = pthread_self();
    client_close(&client);
    client_close(&drain_other);
}

static int teardown_drain(void **state) {
    (void)state;
    if (!pthread_equal(server_thread, pthread_self())) {
        pthread_kill(server_thread, SIGUSR1);
        pthread_join(server_thread, NULL);
    }
    tp_pipeline_free(&pipe_one);
    tp_golden_free(&golden);
    unlink(port_file);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_over_tcp),
        cmocka_unit_test(test_hello_announces_the_backend_range),
        cmocka_unit_test(test_reserved_nonce_is_a_connection_error),
        cmocka_unit_test(test_idle_connections_do_not_delay_clients),
        cmocka_unit_test(test_stalled_and_oversized_frames_hold_no_one),
        cmocka_unit_test(test_control_frames_from_clients_get_an_error),
    };
    const struct CMUnitTest tls_tests[] = {
        cmocka_unit_test(test_requests_over_tls),
        cmocka_unit_test(test_tls_refuses_wrong_key_and_plaintext),
        cmocka_unit_test(test_failed_handshakes_are_rate_limited),
    };
    const struct CMUnitTest drain_tests[] = {
        cmocka_unit_test(test_sigterm_drains),
    };
    signal(SIGPIPE, SIG_IGN);
    int failed = cmocka_run_group_tests_name("plaintext", tests, setup, teardown);
    failed += cmocka_run_group_tests_name("tls_psk", tls_tests, setup_tls, teardown);
    return failed + cmocka_run_group_tests_name("drain", drain_tests, setup_drain, teardown_drain);
}
