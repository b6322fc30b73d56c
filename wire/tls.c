/* TLS 1.3 contexts, handshakes and record I/O for wire_conn; see tls.h.
 *
 * Why a custom BIO: OpenSSL's socket BIO writes with write(2), which raises SIGPIPE when
 * the peer has gone; the transport promises STRATA_ECLOSED instead (send with
 * MSG_NOSIGNAL), so the BIO below is the socket BIO with only its write replaced. */
#include "wire/tls.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "runtime/base/status.h"
#include "wire/transport_internal.h"

#define PSK_IDENTITY "strata"
#define PSK_LABEL "strata tls13 psk"

struct wire_tls {
    SSL_CTX *ctx;
    enum wire_tls_mode mode;
    /* PSK mode: the derived key and its cipher, made into a session per handshake (below) */
    uint8_t psk[32];
    unsigned int psk_len;
    const SSL_CIPHER *psk_cipher;
    BIO_METHOD *bio_method;
};

/* The most specific OpenSSL reason queued on this thread ("" when none); clears the queue. */
static const char *ssl_reason(char *buf, size_t size) {
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0)
        last = e;
    buf[0] = 0;
    if (last) ERR_error_string_n(last, buf, size);
    return buf;
}

static int nosignal_write(BIO *bio, const char *data, int len) {
    int fd = (int)BIO_get_fd(bio, NULL);
    errno = 0;
    ssize_t n = send(fd, data, (size_t)len, MSG_NOSIGNAL);
    BIO_clear_retry_flags(bio);
    if (n <= 0 && BIO_sock_should_retry((int)n)) BIO_set_retry_write(bio);
    return (int)n;
}

static BIO_METHOD *socket_method_nosignal(void) {
    const BIO_METHOD *sock = BIO_s_socket();
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "strata socket");
    if (!m) return NULL;
    BIO_meth_set_write(m, nosignal_write);
    BIO_meth_set_read(m, BIO_meth_get_read(sock));
    BIO_meth_set_puts(m, BIO_meth_get_puts(sock));
    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(sock));
    BIO_meth_set_create(m, BIO_meth_get_create(sock));
    BIO_meth_set_destroy(m, BIO_meth_get_destroy(sock));
    return m;
}

/* The external PSK as a TLS 1.3 session, made anew for each handshake. Why not one session
 * made at start-up and shared: OpenSSL treats an SSL_SESSION as a resumable session with a
 * lifetime (SSL_SESSION_new stamps it with time() and the default 304 s timeout), and the
 * server checks that lifetime when it takes the PSK (ssl_get_prev_session); a session made
 * at start-up "expired" 304 s later and every new handshake then fell back to a certificate
 * the PSK side does not have. An external PSK has no age, so each handshake gets a session
 * stamped now. NULL when OpenSSL is out of memory (the handshake then fails cleanly). */
static SSL_SESSION *psk_session_now(const struct wire_tls *tls) {
    SSL_SESSION *s = SSL_SESSION_new();
    if (s && SSL_SESSION_set1_master_key(s, tls->psk, tls->psk_len) &&
        SSL_SESSION_set_cipher(s, tls->psk_cipher) &&
        SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION))
        return s;
    SSL_SESSION_free(s);
    return NULL;
}

/* Client: offer the external PSK (only for a hash it matches, as RFC 8446 requires). */
static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len,
                   SSL_SESSION **session) {
    struct wire_tls *tls = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    *session = NULL;
    if (md && md != SSL_CIPHER_get_handshake_digest(tls->psk_cipher)) return 1;
    *session = psk_session_now(tls);
    if (!*session) return 0;
    *id = (const unsigned char *)PSK_IDENTITY;
    *id_len = strlen(PSK_IDENTITY);
    return 1;
}

/* Server: the one identity we know maps to the PSK; any other gets no PSK (and fails). */
static int psk_find(SSL *ssl, const unsigned char *id, size_t id_len, SSL_SESSION **session) {
    struct wire_tls *tls = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    *session = NULL;
    if (id_len != strlen(PSK_IDENTITY) || memcmp(id, PSK_IDENTITY, id_len) != 0) return 1;
    *session = psk_session_now(tls);
    return *session != NULL;
}

static int setup_psk(struct wire_tls *tls, const struct wire_auth_key *key) {
    static const unsigned char aes128gcm_sha256[2] = {0x13, 0x01};
    char why[256];
    if (!key || key->len < WIRE_AUTH_KEY_MIN)
        return strata_set_error(STRATA_EINVAL,
                                "tls: a pre-shared key of at least %d bytes is "
                                "needed (--auth-key-file)",
                                WIRE_AUTH_KEY_MIN);
    if (!HMAC(EVP_sha256(), key->bytes, (int)key->len, (const uint8_t *)PSK_LABEL,
              strlen(PSK_LABEL), tls->psk, &tls->psk_len))
        return strata_set_error(STRATA_EIO, "tls: PSK derivation failed");
    SSL *probe = SSL_new(tls->ctx); /* SSL_CIPHER_find needs an SSL */
    tls->psk_cipher = probe ? SSL_CIPHER_find(probe, aes128gcm_sha256) : NULL;
    SSL_SESSION *check = tls->psk_cipher ? psk_session_now(tls) : NULL;
    int ok = check && SSL_CTX_set_ciphersuites(tls->ctx, "TLS_AES_128_GCM_SHA256");
    SSL_SESSION_free(check);
    SSL_free(probe);
    if (!ok) return strata_set_error(STRATA_EIO, "tls: PSK setup: %s", ssl_reason(why, sizeof why));
    SSL_CTX_set_psk_use_session_callback(tls->ctx, psk_use);
    SSL_CTX_set_psk_find_session_callback(tls->ctx, psk_find);
    return 0;
}

static int setup_certs(struct wire_tls *tls, const struct wire_tls_options *o) {
    char why[256];
    if (!o->key_path || !o->ca_path)
        return strata_set_error(STRATA_EINVAL,
                                "tls: certificates need --tls-cert, --tls-key and --tls-ca");
    if (SSL_CTX_use_certificate_chain_file(tls->ctx, o->cert_path) != 1)
        return strata_set_error(STRATA_EINVAL, "tls: cannot load certificate %s: %s", o->cert_path,
                                ssl_reason(why, sizeof why));
    if (SSL_CTX_use_PrivateKey_file(tls->ctx, o->key_path, SSL_FILETYPE_PEM) != 1)
        return strata_set_error(STRATA_EINVAL, "tls: cannot load private key %s: %s", o->key_path,
                                ssl_reason(why, sizeof why));
    if (SSL_CTX_check_private_key(tls->ctx) != 1)
        return strata_set_error(STRATA_EINVAL, "tls: key %s does not match certificate %s: %s",
                                o->key_path, o->cert_path, ssl_reason(why, sizeof why));
    if (SSL_CTX_load_verify_locations(tls->ctx, o->ca_path, NULL) != 1)
        return strata_set_error(STRATA_EINVAL, "tls: cannot load CA %s: %s", o->ca_path,
                                ssl_reason(why, sizeof why));
    /* Mutual: a server asks for the client's certificate and refuses a client without one. */
    SSL_CTX_set_verify(tls->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    return 0;
}

int wire_tls_new(struct wire_tls **out, const struct wire_tls_options *o) {
    struct wire_tls *tls = calloc(1, sizeof *tls);
    int rc;
    *out = NULL;
    if (!tls) return strata_set_error(STRATA_ENOMEM, "tls: out of memory");
    ERR_clear_error();
    tls->ctx = SSL_CTX_new(TLS_method());
    tls->bio_method = socket_method_nosignal();
    if (!tls->ctx || !tls->bio_method ||
        SSL_CTX_set_min_proto_version(tls->ctx, TLS1_3_VERSION) != 1) {
        wire_tls_free(tls);
        return strata_set_error(STRATA_EIO, "tls: cannot create a TLS 1.3 context");
    }
    SSL_CTX_set_app_data(tls->ctx, tls);
    SSL_CTX_set_num_tickets(tls->ctx, 0);
    SSL_CTX_set_session_cache_mode(tls->ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(tls->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* Partial writes let the transport keep its own progress and deadline per frame. */
    SSL_CTX_set_mode(tls->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    tls->mode = o->cert_path ? WIRE_TLS_CERT : WIRE_TLS_PSK;
    rc = tls->mode == WIRE_TLS_CERT ? setup_certs(tls, o) : setup_psk(tls, o->psk);
    if (rc < 0) {
        wire_tls_free(tls);
        return rc;
    }
    *out = tls;
    return 0;
}

void wire_tls_free(struct wire_tls *tls) {
    if (!tls) return;
    OPENSSL_cleanse(tls->psk, sizeof tls->psk);
    SSL_CTX_free(tls->ctx);
    BIO_meth_free(tls->bio_method);
    free(tls);
}

enum wire_tls_mode wire_tls_get_mode(const struct wire_tls *tls) {
    return tls ? tls->mode : WIRE_TLS_PLAIN;
}

const char *wire_tls_describe(const struct wire_tls *tls) {
    switch (wire_tls_get_mode(tls)) {
    case WIRE_TLS_CERT: return "TLS 1.3 with certificates (mutual authentication)";
    case WIRE_TLS_PSK: return "TLS 1.3 with a pre-shared key";
    default: return "plaintext";
    }
}

void wire_tls_peer_describe(const struct wire_conn *conn, char *out, size_t size) {
    char cn[128] = "?";
    if (!conn->ssl) {
        snprintf(out, size, "plaintext");
        return;
    }
    X509 *cert = SSL_get0_peer_certificate(conn->ssl);
    if (!cert) {
        snprintf(out, size, "TLS 1.3, PSK");
        return;
    }
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
    snprintf(out, size, "TLS 1.3, CN=%s", cn);
}

/* A failed handshake's message: OpenSSL's reason, the verification result and a hint. */
static int handshake_error(struct wire_conn *conn, struct wire_tls *tls, int server) {
    char why[256];
    int closed_errno = errno;
    ssl_reason(why, sizeof why);
    /* A client that went away without sending anything TLS refused (no OpenSSL reason): a
     * close, not a refusal, so an accept path can tell it from a wrong key or certificate. */
    if (server && !why[0] &&
        (closed_errno == 0 || closed_errno == EPIPE || closed_errno == ECONNRESET))
        return strata_set_error(STRATA_ECLOSED,
                                "TLS handshake with client %s: the client closed the connection "
                                "before finishing it",
                                conn->peer);
    long verify = SSL_get_verify_result(conn->ssl);
    const char *hint = tls->mode == WIRE_TLS_PSK ? "wrong pre-shared key, or the peer runs "
                                                   "without TLS or with certificates?"
                                                 : "certificate not from this cluster's CA, "
                                                   "or the peer runs without TLS or with a PSK?";
    if (verify != X509_V_OK)
        return strata_set_error(STRATA_EAUTH,
                                "TLS handshake with %s %s failed: %s; peer certificate: %s",
                                server ? "client" : "server", conn->peer, why[0] ? why : "-",
                                X509_verify_cert_error_string(verify));
    if (!why[0] && errno) snprintf(why, sizeof why, "%s", strerror(errno));
    return strata_set_error(STRATA_EAUTH, "TLS handshake with %s %s failed: %s (%s)",
                            server ? "client" : "server", conn->peer,
                            why[0] ? why : "peer closed the connection", hint);
}

int wire_tls_start(struct wire_conn *conn, struct wire_tls *tls, int server) {
    if (!conn->open || conn->fd < 0 || conn->ssl)
        return strata_set_error(STRATA_EINVAL, "tls: handshake on a closed or TLS connection");
    ERR_clear_error();
    conn->ssl = SSL_new(tls->ctx);
    BIO *bio = conn->ssl ? BIO_new(tls->bio_method) : NULL;
    if (!bio) return strata_set_error(STRATA_ENOMEM, "tls: cannot create a TLS connection");
    BIO_set_fd(bio, conn->fd, BIO_NOCLOSE);
    SSL_set_bio(conn->ssl, bio, bio);
    if (server)
        SSL_set_accept_state(conn->ssl);
    else
        SSL_set_connect_state(conn->ssl);
    /* A PSK client trusts no CA: a server answering with a certificate instead fails. */
    if (!server && tls->mode == WIRE_TLS_PSK) SSL_set_verify(conn->ssl, SSL_VERIFY_PEER, NULL);
    return 0;
}

int wire_tls_step(struct wire_conn *conn, struct wire_tls *tls, short *events) {
    int server = SSL_is_server(conn->ssl);
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_do_handshake(conn->ssl);
        *events = 0;
        if (r == 1 && tls->mode == WIRE_TLS_PSK && !SSL_session_reused(conn->ssl)) {
            conn->broken = 1;
            return strata_set_error(
                STRATA_EAUTH, "TLS handshake with %s did not use the pre-shared key", conn->peer);
        }
        if (r == 1) return 0;
        int err = SSL_get_error(conn->ssl, r);
        *events = err == SSL_ERROR_WANT_READ ? POLLIN : err == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (*events) return WIRE_TLS_PENDING;
        if (err == SSL_ERROR_SYSCALL && errno == EINTR) continue;
        conn->broken = 1;
        return handshake_error(conn, tls, server);
    }
}

enum wire_tls_progress wire_tls_progress(const struct wire_conn *conn) {
    if (!conn->ssl) return WIRE_TLS_NOTHING;
    if (SSL_is_init_finished(conn->ssl)) return WIRE_TLS_DONE;
    /* Past reading the ClientHello the server has taken a whole one (a peer that sends it in
     * pieces, or a record at a time, stays below). */
    OSSL_HANDSHAKE_STATE st = SSL_get_state(conn->ssl);
    if (st != TLS_ST_BEFORE && st != TLS_ST_SR_CLNT_HELLO) return WIRE_TLS_ANSWERING;
    BIO *rbio = SSL_get_rbio(conn->ssl);
    return rbio && BIO_number_read(rbio) > 0 ? WIRE_TLS_BYTES : WIRE_TLS_NOTHING;
}

static int handshake(struct wire_conn *conn, struct wire_tls *tls, int server, int timeout_ms) {
    int64_t deadline = wire_deadline_after(timeout_ms);
    int rc = wire_tls_start(conn, tls, server);
    while (rc == 0) {
        short events;
        rc = wire_tls_step(conn, tls, &events);
        if (rc != WIRE_TLS_PENDING) return rc;
        rc = wire_wait_fd(conn->fd, events, deadline, "TLS handshake with", conn->peer);
        if (rc) {
            conn->broken = 1;
            if (rc != STRATA_ETIMEOUT) return rc;
            return strata_set_error(rc,
                                    "TLS handshake with %s %s timed out after %d ms (a peer "
                                    "without TLS waits for a plaintext Hello)",
                                    server ? "client" : "server", conn->peer, timeout_ms);
        }
    }
    return rc;
}

int wire_tls_accept(struct wire_conn *conn, struct wire_tls *tls, int timeout_ms) {
    return handshake(conn, tls, 1, timeout_ms);
}

int wire_tls_connect(struct wire_conn *conn, struct wire_tls *tls, int timeout_ms) {
    return handshake(conn, tls, 0, timeout_ms);
}

/* A close right after the handshake is most likely the peer refusing this side (in TLS 1.3
 * its alert can be lost to a reset), so the message says so. */
static int closed(struct wire_conn *conn) {
    if (conn->frames_in == 0)
        return strata_set_error(STRATA_ECLOSED,
                                "wire: %s closed the TLS connection before its first frame "
                                "(did it refuse this side's TLS certificate or key?)",
                                conn->peer);
    return strata_set_error(STRATA_ECLOSED, "wire: %s closed the connection", conn->peer);
}

/* Maps a failed SSL_read / SSL_write to "wait for events" (0 returned) or a status. */
static ssize_t io_result(struct wire_conn *conn, int r, short *events, const char *what) {
    char why[256];
    int err = SSL_get_error(conn->ssl, r);
    *events = 0;
    switch (err) {
    case SSL_ERROR_WANT_READ: *events = POLLIN; return 0;
    case SSL_ERROR_WANT_WRITE: *events = POLLOUT; return 0;
    case SSL_ERROR_ZERO_RETURN: return closed(conn);
    case SSL_ERROR_SYSCALL:
        if (errno == EINTR) return 0;
        if (errno == 0 || errno == EPIPE || errno == ECONNRESET) return closed(conn);
        return strata_set_error(STRATA_EIO, "wire: TLS %s %s: %s", what, conn->peer,
                                strerror(errno));
    default: {
        unsigned long e = ERR_peek_last_error();
        int reason = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
        /* In TLS 1.3 a client finishes before the server has checked it: a refusal of
         * its certificate or key arrives as an alert on its first read. */
        int alert = reason >= SSL_AD_REASON_OFFSET && reason < SSL_AD_REASON_OFFSET + 256;
        return strata_set_error(alert ? STRATA_EAUTH : STRATA_EIO, "wire: TLS %s %s: %s%s", what,
                                conn->peer, ssl_reason(why, sizeof why),
                                alert ? " (the peer refused this side's TLS certificate or key)"
                                      : "");
    }
    }
}

ssize_t wire_tls_read(struct wire_conn *conn, void *dst, size_t n, short *events) {
    ERR_clear_error();
    errno = 0;
    int r = SSL_read(conn->ssl, dst, n > INT_MAX ? INT_MAX : (int)n);
    return r > 0 ? r : io_result(conn, r, events, "receive from");
}

ssize_t wire_tls_write(struct wire_conn *conn, const void *src, size_t n, short *events) {
    ERR_clear_error();
    errno = 0;
    int r = SSL_write(conn->ssl, src, n > INT_MAX ? INT_MAX : (int)n);
    return r > 0 ? r : io_result(conn, r, events, "send to");
}

void wire_tls_close(struct wire_conn *conn) {
    if (!conn->ssl) return;
    /* One non-blocking attempt: a close_notify helps the peer tell a close from a crash. */
    if (!conn->broken && SSL_is_init_finished(conn->ssl)) SSL_shutdown(conn->ssl);
    ERR_clear_error();
    SSL_free(conn->ssl);
    conn->ssl = NULL;
}

int wire_security_setup(struct wire_security *out, const struct wire_security_flags *f) {
    int certs = f->cert_path || f->key_path || f->ca_path;
    int keyed = f->key && f->key->len > 0;
    memset(out, 0, sizeof *out);
    if (certs && f->insecure)
        return strata_set_error(STRATA_EINVAL, "--insecure and --tls-cert/--tls-key/--tls-ca "
                                               "exclude each other");
    if (certs && !(f->cert_path && f->key_path && f->ca_path))
        return strata_set_error(STRATA_EINVAL, "TLS certificates need all of --tls-cert, "
                                               "--tls-key and --tls-ca");
    if (f->insecure) {
        out->hello_key = keyed ? f->key : NULL;
        out->warning = keyed ? "--insecure: links are NOT encrypted (plaintext frames; the "
                               "pre-shared key only authenticates the Hello)"
                             : "--insecure: links are NOT encrypted and NOT authenticated";
        return 0;
    }
    if (!certs && !keyed)
        return strata_set_error(STRATA_EINVAL,
                                "links need TLS 1.3: give --tls-cert/--tls-key/--tls-ca, or a "
                                "pre-shared key (--auth-key-file or $%s), or --insecure for "
                                "plaintext",
                                WIRE_AUTH_KEY_ENV);
    struct wire_tls_options o = {f->cert_path, f->key_path, f->ca_path, f->key};
    out->hello_key = certs && keyed ? f->key : NULL;
    return wire_tls_new(&out->tls, &o);
}

void wire_security_free(struct wire_security *security) {
    if (!security) return;
    wire_tls_free(security->tls);
    memset(security, 0, sizeof *security);
}
