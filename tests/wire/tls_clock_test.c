/* TLS links keep accepting new handshakes however long the process has run: contexts made
 * "at start-up" serve handshakes an hour, a day and (PSK) thirty days later, in PSK and in
 * certificate mode, with the Hello and a frame inside.
 *
 * Why a clock seam at time(): OpenSSL reads the wall clock with time() to age its session
 * objects (creation stamp, 304 s default lifetime), and once gave every PSK ring a life of
 * ~5 minutes that way. This test's executable defines time() itself, which the dynamic linker
 * prefers over libc's for every library (libssl included), so the test moves the clock that
 * OpenSSL sees forward without waiting. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "tests/wire/test_pki.h"
#include "wire/wire.h"

#define TIMEOUT_MS 5000

static time_t clock_offset; /* seconds added to the real clock */
static int clock_reads;     /* how often anything read it (proves the seam is in use) */

time_t time(time_t *out) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    __atomic_add_fetch(&clock_reads, 1, __ATOMIC_RELAXED);
    time_t now = tv.tv_sec + __atomic_load_n(&clock_offset, __ATOMIC_RELAXED);
    if (out) *out = now;
    return now;
}

static void advance_clock(time_t seconds) {
    __atomic_store_n(&clock_offset, seconds, __ATOMIC_RELAXED);
}

static char dir[512];

static int make_pki(void **state) {
    (void)state;
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(dir, sizeof dir, "%s/tls_clock_test.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return -1;
    return test_pki_make(dir);
}

static struct wire_tls *cert_tls(const char *who) {
    char cert[700], key[700], ca[700];
    struct wire_tls_options o = {0};
    struct wire_tls *tls = NULL;
    snprintf(cert, sizeof cert, "%s/%s.crt", dir, who);
    snprintf(key, sizeof key, "%s/%s.key", dir, who);
    snprintf(ca, sizeof ca, "%s/ca.crt", dir);
    o.cert_path = cert;
    o.key_path = key;
    o.ca_path = ca;
    assert_int_equal(wire_tls_new(&tls, &o), 0);
    return tls;
}

static struct wire_tls *psk_tls(void) {
    static const char text[] = "a-pre-shared-key-of-enough-bytes";
    struct wire_auth_key key = {0};
    struct wire_tls_options o = {0};
    struct wire_tls *tls = NULL;
    key.len = strlen(text);
    memcpy(key.bytes, text, key.len);
    o.psk = &key;
    assert_int_equal(wire_tls_new(&tls, &o), 0);
    return tls;
}

/* ---- one connection at a time: TLS, the Hello, one frame echoed ---- */

struct server {
    struct wire_listener listener;
    struct wire_tls *tls;
    pthread_t thread;
    int result;
    char error[512];
};

static void *server_main(void *arg) {
    struct server *s = arg;
    struct wire_conn conn;
    struct wire_hello self = {0}, peer;
    const uint8_t *frame;
    size_t len;
    self.stage_index = 1;
    self.role = WIRE_ROLE_STAGE;
    s->result = wire_accept(&conn, &s->listener, 1u << 20, TIMEOUT_MS);
    if (s->result) return NULL;
    s->result = wire_tls_accept(&conn, s->tls, TIMEOUT_MS);
    if (!s->result) s->result = wire_handshake_server(&peer, &conn, &self, NULL, TIMEOUT_MS);
    if (!s->result) s->result = wire_recv_frame(&conn, &frame, &len, TIMEOUT_MS);
    if (!s->result) s->result = wire_send_frame(&conn, frame, len, TIMEOUT_MS);
    if (s->result) snprintf(s->error, sizeof s->error, "%s", strata_last_error());
    wire_close(&conn);
    return NULL;
}

/* A new client connection through both contexts; returns the client's status and checks
 * the server agreed. */
static int one_connection(struct wire_tls *server_tls, struct wire_tls *client_tls) {
    struct server s = {0};
    struct wire_conn conn;
    struct wire_hello self = {0}, peer;
    static const uint8_t ping[] = "ping";
    const uint8_t *got;
    size_t len;
    s.tls = server_tls;
    assert_int_equal(wire_listen(&s.listener, NULL, 0), 0);
    assert_int_equal(pthread_create(&s.thread, NULL, server_main, &s), 0);
    self.role = WIRE_ROLE_CLIENT;
    int rc = wire_connect(&conn, "127.0.0.1", s.listener.port, 1u << 20, TIMEOUT_MS);
    if (!rc) rc = wire_tls_connect(&conn, client_tls, TIMEOUT_MS);
    if (!rc) rc = wire_handshake_client(&peer, &conn, &self, NULL, TIMEOUT_MS);
    if (!rc) rc = wire_send_frame(&conn, ping, sizeof ping, TIMEOUT_MS);
    if (!rc) rc = wire_recv_frame(&conn, &got, &len, TIMEOUT_MS);
    if (!rc && (len != sizeof ping || memcmp(got, ping, len) != 0)) rc = STRATA_EFORMAT;
    if (rc) print_message("client: %s\n", strata_last_error());
    wire_close(&conn);
    pthread_join(s.thread, NULL);
    wire_listener_close(&s.listener);
    if (s.result) print_message("server: %s\n", s.error);
    return rc ? rc : s.result;
}

/* Contexts made at t = 0 serve new handshakes at each later time. */
static void run_aged(struct wire_tls *server, struct wire_tls *client, const time_t *ages, int n) {
    int reads = __atomic_load_n(&clock_reads, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        advance_clock(ages[i]);
        print_message("contexts %lld s old\n", (long long)ages[i]);
        assert_int_equal(one_connection(server, client), 0);
    }
    advance_clock(0);
    /* OpenSSL read the clock through this file's time(): the ages above were real to it. */
    assert_true(__atomic_load_n(&clock_reads, __ATOMIC_RELAXED) > reads);
}

static void psk_contexts_never_expire(void **state) {
    (void)state;
    static const time_t ages[] = {0, 200, 303, 305, 310, 3600, 86400, 30 * 86400};
    struct wire_tls *server = psk_tls(), *client = psk_tls();
    run_aged(server, client, ages, (int)(sizeof ages / sizeof ages[0]));
    /* A client made late meets a server made long before, and the other way round. */
    advance_clock(7200);
    struct wire_tls *late = psk_tls();
    assert_int_equal(one_connection(server, late), 0);
    assert_int_equal(one_connection(late, client), 0);
    advance_clock(0);
    wire_tls_free(late);
    wire_tls_free(server);
    wire_tls_free(client);
}

/* Certificates: no lifetime but the certificates' own (two days in the test PKI). */
static void cert_contexts_never_expire(void **state) {
    (void)state;
    static const time_t ages[] = {0, 310, 3600, 86400};
    struct wire_tls *server = cert_tls("a"), *client = cert_tls("b");
    run_aged(server, client, ages, (int)(sizeof ages / sizeof ages[0]));
    wire_tls_free(server);
    wire_tls_free(client);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(psk_contexts_never_expire),
        cmocka_unit_test(cert_contexts_never_expire),
    };
    return cmocka_run_group_tests(tests, make_pki, NULL);
}
