/* Loopback tests of TLS 1.3 below the frames (wire/tls.h), over real sockets: PSK and
 * certificate modes carry frames of many sizes intact (up to a 24 MiB activation) and the
 * Hello inside; a wrong key, an untrusted certificate, a missing certificate and a
 * plaintext peer are refused with a message naming TLS on both sides; the handshake has a
 * deadline; receive and send timeouts still hold through TLS. The throwaway CAs and
 * certificates come from test_pki.h (OpenSSL C API), so nothing depends on the openssl
 * command. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "tests/wire/test_pki.h"
#include "wire/wire.h"

#define TIMEOUT_MS 5000

static char dir[512];

/* Makes the throwaway PKI of test_pki.h in a fresh directory. */
static int make_pki(void **state) {
    (void)state;
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(dir, sizeof dir, "%s/tls_test.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return -1;
    return test_pki_make(dir);
}

static char *pki_path(char *buf, const char *name) {
    snprintf(buf, 700, "%s/%s", dir, name);
    return buf;
}

/* A context with certificate `who` (a, b, rogue) trusting CA file `ca`. */
static struct wire_tls *cert_tls(const char *who, const char *ca) {
    char cert[700], key[700], ca_path[700], file[64];
    struct wire_tls_options o = {0};
    struct wire_tls *tls = NULL;
    snprintf(file, sizeof file, "%s.crt", who);
    o.cert_path = pki_path(cert, file);
    snprintf(file, sizeof file, "%s.key", who);
    o.key_path = pki_path(key, file);
    snprintf(file, sizeof file, "%s.crt", ca);
    o.ca_path = pki_path(ca_path, file);
    assert_int_equal(wire_tls_new(&tls, &o), 0);
    assert_int_equal(wire_tls_get_mode(tls), WIRE_TLS_CERT);
    return tls;
}

static struct wire_tls *psk_tls(const char *text) {
    struct wire_auth_key key = {0};
    struct wire_tls_options o = {0};
    struct wire_tls *tls = NULL;
    key.len = strlen(text);
    memcpy(key.bytes, text, key.len);
    o.psk = &key;
    assert_int_equal(wire_tls_new(&tls, &o), 0);
    assert_int_equal(wire_tls_get_mode(tls), WIRE_TLS_PSK);
    return tls;
}

/* ---- a TLS echo server on a thread ---- */

struct server {
    struct wire_listener listener;
    struct wire_tls *tls; /* NULL = plaintext */
    pthread_t thread;
    int handshake;   /* status of the TLS handshake (or of the plaintext Hello) */
    int result;      /* status that ended the echo loop */
    int frames;      /* frames echoed */
    int hello;       /* run the Hello inside the channel after TLS */
    char error[512]; /* message of a failed handshake */
};

static void *server_main(void *arg) {
    struct server *s = arg;
    struct wire_conn conn;
    s->result = wire_accept(&conn, &s->listener, 64u << 20, TIMEOUT_MS);
    if (!s->result && s->tls) s->result = wire_tls_accept(&conn, s->tls, 2000);
    if (!s->result && s->hello) {
        struct wire_hello self = {0}, peer;
        self.stage_index = 1;
        self.role = WIRE_ROLE_STAGE;
        s->result = wire_handshake_server(&peer, &conn, &self, NULL, TIMEOUT_MS);
    }
    s->handshake = s->result;
    if (s->result) snprintf(s->error, sizeof s->error, "%s", strata_last_error());
    while (!s->result) {
        const uint8_t *frame;
        size_t len;
        s->result = wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS);
        if (s->result) break;
        assert_int_equal(wire_conn_buffered(&conn), 0); /* records never span frames */
        s->result = wire_send_frame(&conn, frame, len, TIMEOUT_MS);
        s->frames++;
    }
    wire_close(&conn);
    return NULL;
}

static void start_server(struct server *s, struct wire_tls *tls, int hello) {
    memset(s, 0, sizeof *s);
    s->tls = tls;
    s->hello = hello;
    assert_int_equal(wire_listen(&s->listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&s->thread, NULL, server_main, s), 0);
}

static void stop_server(struct server *s) {
    pthread_join(s->thread, NULL);
    wire_listener_close(&s->listener);
}

static int client_open(struct wire_conn *conn, struct server *s, struct wire_tls *tls) {
    int rc = wire_connect(conn, "127.0.0.1", s->listener.port, 64u << 20, TIMEOUT_MS);
    if (!rc && tls) rc = wire_tls_connect(conn, tls, 2000);
    return rc;
}

static void echo_sizes(struct wire_conn *conn) {
    const size_t sizes[] = {1, 7, 16379, 16380, 16381, 65539, 1u << 20, 24u << 20};
    uint32_t seed = 12345;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        uint8_t *payload = malloc(sizes[i]);
        assert_non_null(payload);
        for (size_t j = 0; j < sizes[i]; ++j) {
            seed = seed * 1664525u + 1013904223u;
            payload[j] = (uint8_t)(seed >> 24);
        }
        assert_int_equal(wire_send_frame(conn, payload, sizes[i], TIMEOUT_MS), 0);
        const uint8_t *got;
        size_t len;
        assert_int_equal(wire_recv_frame(conn, &got, &len, TIMEOUT_MS), 0);
        assert_int_equal(len, sizes[i]);
        assert_memory_equal(got, payload, len);
        free(payload);
    }
}

static void run_echo(struct wire_tls *server_tls, struct wire_tls *client_tls) {
    struct server s;
    struct wire_conn conn;
    start_server(&s, server_tls, 0);
    assert_int_equal(client_open(&conn, &s, client_tls), 0);
    assert_non_null(conn.ssl);
    echo_sizes(&conn);
    wire_close(&conn);
    stop_server(&s);
    assert_int_equal(s.frames, 8);
    assert_int_equal(s.result, STRATA_ECLOSED); /* close_notify reads as a clean close */
}

static void psk_frames_intact(void **state) {
    (void)state;
    struct wire_tls *server = psk_tls("a-pre-shared-key-of-enough-bytes");
    struct wire_tls *client = psk_tls("a-pre-shared-key-of-enough-bytes");
    run_echo(server, client);
    wire_tls_free(server);
    wire_tls_free(client);
}

static void cert_frames_intact_with_hello_inside(void **state) {
    (void)state;
    struct wire_tls *server = cert_tls("a", "ca");
    struct wire_tls *client = cert_tls("b", "ca");
    run_echo(server, client);
    /* The Hello runs inside the channel. */
    struct server s;
    struct wire_conn conn;
    struct wire_hello self = {0}, peer;
    self.role = WIRE_ROLE_STAGE;
    start_server(&s, server, 1);
    assert_int_equal(client_open(&conn, &s, client), 0);
    assert_int_equal(wire_handshake_client(&peer, &conn, &self, NULL, TIMEOUT_MS), 0);
    assert_int_equal(peer.stage_index, 1);
    echo_sizes(&conn);
    wire_close(&conn);
    stop_server(&s);
    wire_tls_free(server);
    wire_tls_free(client);
}

/* The client's handshake fails, the server's too, and both messages name TLS. */
static void expect_refused(struct wire_tls *server_tls, struct wire_tls *client_tls,
                           const char *client_says, const char *server_says) {
    struct server s;
    struct wire_conn conn;
    start_server(&s, server_tls, 0);
    int64_t start = cli_now_ms();
    int rc = client_open(&conn, &s, client_tls);
    /* TLS 1.3: a client may finish before the server verified it; its first read (the
     * server's Hello in Strata) fails. */
    if (rc == 0) {
        const uint8_t *frame;
        size_t len;
        rc = wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS);
    }
    assert_true(rc < 0);
    const char *msg = strata_last_error();
    print_message("client: %s\n", msg);
    if (!strstr(msg, "TLS") || (!strstr(msg, client_says) && !strstr(msg, "refused this side")))
        fail_msg("client error: %s", msg);
    wire_close(&conn);
    stop_server(&s);
    assert_true(cli_now_ms() - start < 3000);
    assert_true(s.handshake < 0);
    assert_int_equal(s.frames, 0);
    print_message("server: %s\n", s.error);
    if (!strstr(s.error, "TLS") || !strstr(s.error, server_says))
        fail_msg("server error: %s", s.error);
}

static void wrong_psk_refused(void **state) {
    (void)state;
    struct wire_tls *server = psk_tls("a-pre-shared-key-of-enough-bytes");
    struct wire_tls *client = psk_tls("another-key-that-does-not-match!");
    expect_refused(server, client, "wrong pre-shared key", "wrong pre-shared key");
    wire_tls_free(server);
    wire_tls_free(client);
}

static void untrusted_certificates_refused(void **state) {
    (void)state;
    struct wire_tls *trusted = cert_tls("a", "ca");
    struct wire_tls *rogue = cert_tls("rogue", "rogue-ca");
    struct wire_tls *rogue_trusting_ca = cert_tls("rogue", "ca");
    /* A rogue server: the client does not trust it. */
    expect_refused(rogue, trusted, "peer certificate: ", "not from this cluster");
    /* A rogue client that trusts our CA: the server refuses its certificate. */
    expect_refused(trusted, rogue_trusting_ca, "not from this cluster", "peer certificate: ");
    wire_tls_free(trusted);
    wire_tls_free(rogue);
    wire_tls_free(rogue_trusting_ca);
}

static void mode_mismatch_refused(void **state) {
    (void)state;
    struct wire_tls *psk = psk_tls("a-pre-shared-key-of-enough-bytes");
    struct wire_tls *cert = cert_tls("a", "ca");
    expect_refused(cert, psk, "TLS", "TLS"); /* certificates vs PSK */
    /* A TLS client at a plaintext server that speaks first (its Hello). */
    struct server s;
    struct wire_conn conn;
    start_server(&s, NULL, 1);
    assert_true(client_open(&conn, &s, psk) < 0);
    assert_non_null(strstr(strata_last_error(), "TLS handshake with server"));
    wire_close(&conn);
    stop_server(&s);
    assert_true(s.handshake < 0);
    /* A plaintext client's Hello at a TLS server. */
    start_server(&s, psk, 0);
    assert_int_equal(client_open(&conn, &s, NULL), 0);
    struct wire_hello self = {0}, peer;
    assert_true(wire_handshake_client(&peer, &conn, &self, NULL, TIMEOUT_MS) < 0);
    wire_close(&conn);
    stop_server(&s);
    print_message("server: %s\n", s.error);
    assert_non_null(strstr(s.error, "TLS handshake with client"));
    wire_tls_free(psk);
    wire_tls_free(cert);
}

struct tls_accept {
    struct wire_listener *listener;
    struct wire_tls *tls;
    struct wire_conn conn;
    int rc;
};

static void *accept_tls_main(void *arg) {
    struct tls_accept *a = arg;
    a->rc = wire_accept(&a->conn, a->listener, 0, TIMEOUT_MS);
    if (!a->rc) a->rc = wire_tls_accept(&a->conn, a->tls, TIMEOUT_MS);
    return NULL;
}

static void handshake_deadline_and_io_timeouts(void **state) {
    (void)state;
    struct wire_tls *psk = psk_tls("a-pre-shared-key-of-enough-bytes");
    /* A client that connects and never speaks: the server's handshake times out. */
    struct server s;
    struct wire_conn conn, silent;
    start_server(&s, psk, 0);
    int64_t start = cli_now_ms();
    assert_int_equal(wire_connect(&silent, "127.0.0.1", s.listener.port, 0, TIMEOUT_MS), 0);
    pthread_join(s.thread, NULL);
    assert_int_equal(s.handshake, STRATA_ETIMEOUT);
    assert_true(cli_now_ms() - start >= 1900 && cli_now_ms() - start < 4000);
    assert_non_null(strstr(s.error, "TLS handshake"));
    wire_close(&silent);
    wire_listener_close(&s.listener);
    /* Read timeout through TLS leaves the conn usable; a write timeout breaks it. */
    struct wire_listener listener;
    struct tls_accept side = {&listener, psk, {0}, 0};
    pthread_t t;
    assert_int_equal(wire_listen(&listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&t, NULL, accept_tls_main, &side), 0);
    assert_int_equal(wire_connect(&conn, NULL, listener.port, 0, TIMEOUT_MS), 0);
    assert_int_equal(wire_tls_connect(&conn, psk, TIMEOUT_MS), 0);
    pthread_join(t, NULL);
    assert_int_equal(side.rc, 0);
    const uint8_t *frame;
    size_t len;
    start = cli_now_ms();
    assert_int_equal(wire_recv_frame(&side.conn, &frame, &len, 150), STRATA_ETIMEOUT);
    assert_true(cli_now_ms() - start >= 140 && cli_now_ms() - start < 2000);
    assert_false(side.conn.broken);
    assert_int_equal(wire_send_frame(&conn, "ok", 2, TIMEOUT_MS), 0);
    assert_int_equal(wire_recv_frame(&side.conn, &frame, &len, TIMEOUT_MS), 0);
    assert_memory_equal(frame, "ok", 2);
    size_t size = 64u << 20; /* the receiver never reads */
    uint8_t *payload = calloc(size, 1);
    assert_non_null(payload);
    start = cli_now_ms();
    assert_int_equal(wire_send_frame(&conn, payload, size, 300), STRATA_ETIMEOUT);
    assert_true(cli_now_ms() - start >= 290 && cli_now_ms() - start < 5000);
    assert_true(conn.broken);
    free(payload);
    wire_close(&conn);
    wire_close(&side.conn);
    wire_listener_close(&listener);
    wire_tls_free(psk);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(psk_frames_intact),
        cmocka_unit_test(cert_frames_intact_with_hello_inside),
        cmocka_unit_test(wrong_psk_refused),
        cmocka_unit_test(untrusted_certificates_refused),
        cmocka_unit_test(mode_mismatch_refused),
        cmocka_unit_test(handshake_deadline_and_io_timeouts),
    };
    return cmocka_run_group_tests(tests, make_pki, NULL);
}
