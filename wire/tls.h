/* TLS 1.3 below the frames (OpenSSL libssl): encryption and mutual authentication of every
 * stage-to-stage and client link.
 *
 * A wire_conn optionally carries an SSL*; once wire_tls_accept / wire_tls_connect has run
 * on it, every frame send and receive of transport.h goes through TLS (frames and their
 * length prefixes are unchanged, TLS records carry them). Sockets stay non-blocking:
 * WANT_READ / WANT_WRITE become poll() waits under the caller's timeout, and the TLS
 * handshake itself has a deadline (timeout_ms), so a silent or plaintext peer cannot hold
 * an acceptor.
 *
 * Modes (one per process, shared by its server and client sides):
 *   - WIRE_TLS_CERT: certificates. Each side presents its certificate (cert_path, a PEM
 *     chain, and key_path) and requires the peer's to verify against the cluster CA
 *     (ca_path). Identity is membership of the CA: host names are not checked, since
 *     stages address each other by whatever host/port they were given.
 *   - WIRE_TLS_PSK: an external pre-shared key (RFC 8446 section 2.2; identity "strata",
 *     TLS_AES_128_GCM_SHA256). The TLS PSK is HMAC-SHA256(key, "strata tls13 psk"), so the
 *     key file of the HMAC Hello (auth.h) can be reused without its raw bytes serving two
 *     purposes, and any key length (16..1024 bytes) gives a 32-byte PSK. Both sides prove
 *     the key by the PSK binder and Finished messages; a wrong key fails the handshake.
 * Only TLS 1.3 is offered or accepted. Session tickets are off (no resumption: links are
 * long-lived). A peer that closes without close_notify reads as a clean close: frames are
 * length-prefixed, so a truncated frame is detected by the transport anyway.
 *
 * A refused handshake returns STRATA_EAUTH (STRATA_ETIMEOUT past the deadline) with a
 * message naming TLS, the peer and OpenSSL's reason (plus the certificate verification
 * result when there is one); library code never prints, callers log it. */
#ifndef STRATA_WIRE_TLS_H
#define STRATA_WIRE_TLS_H

#include "wire/auth.h"
#include "wire/transport.h"

enum wire_tls_mode {
    WIRE_TLS_PLAIN = 0, /* no TLS: wire_tls_new is not called, the conn has no SSL* */
    WIRE_TLS_PSK = 1,
    WIRE_TLS_CERT = 2
};

struct wire_tls_options {
    /* Certificates: all three set (PEM files). */
    const char *cert_path;
    const char *key_path;
    const char *ca_path;
    /* External PSK: used when cert_path is NULL (len >= WIRE_AUTH_KEY_MIN). */
    const struct wire_auth_key *psk;
};

/* One SSL_CTX for both directions; shared by threads (OpenSSL contexts are thread-safe). */
struct wire_tls;

/* Builds the context; STRATA_EINVAL / STRATA_EIO name the file or setting that failed. */
int wire_tls_new(struct wire_tls **tls, const struct wire_tls_options *options);
void wire_tls_free(struct wire_tls *tls);
enum wire_tls_mode wire_tls_get_mode(const struct wire_tls *tls);
/* "TLS 1.3 with certificates" / "TLS 1.3 with a pre-shared key", for startup logs. */
const char *wire_tls_describe(const struct wire_tls *tls);

/* Who the peer proved to be, for logs: "TLS 1.3, CN=..." (its certificate's subject
 * common name), "TLS 1.3, PSK" or "plaintext". */
void wire_tls_peer_describe(const struct wire_conn *conn, char *out, size_t size);

/* Server / client side of the TLS handshake on a freshly accepted / connected conn. On
 * failure the conn keeps its socket (the caller closes it). */
int wire_tls_accept(struct wire_conn *conn, struct wire_tls *tls, int timeout_ms);
int wire_tls_connect(struct wire_conn *conn, struct wire_tls *tls, int timeout_ms);

/* The same handshake for event loops, never blocking: wire_tls_start attaches TLS to the
 * conn (server = 1 for the accepting side), then each wire_tls_step advances it as far as
 * the socket allows: 0 done, WIRE_TLS_PENDING (poll conn->fd for *events, then step
 * again), or a status as above. The caller owns the deadline. */
#define WIRE_TLS_PENDING 1
int wire_tls_start(struct wire_conn *conn, struct wire_tls *tls, int server);
int wire_tls_step(struct wire_conn *conn, struct wire_tls *tls, short *events);

/* How far a handshake under way has come, for an acceptor choosing which pending handshake
 * to drop: WIRE_TLS_NOTHING (no byte received), WIRE_TLS_BYTES (bytes, but no complete first
 * message), WIRE_TLS_ANSWERING (the peer's first flight was taken and it is answering; with a
 * PSK that flight carried a valid binder), WIRE_TLS_DONE (the handshake finished). */
enum wire_tls_progress {
    WIRE_TLS_NOTHING = 0,
    WIRE_TLS_BYTES = 1,
    WIRE_TLS_ANSWERING = 2,
    WIRE_TLS_DONE = 3
};
enum wire_tls_progress wire_tls_progress(const struct wire_conn *conn);

/* The link security of a process from its flags (strata-stage, strata-client):
 *   - --tls-cert/--tls-key/--tls-ca: WIRE_TLS_CERT. A pre-shared key, if one is also
 *     given, still runs the HMAC Hello inside TLS (a second factor besides the CA).
 *   - else a pre-shared key (--auth-key-file or $STRATA_AUTH_KEY): WIRE_TLS_PSK. The Hello
 *     inside runs without its HMAC proofs: the PSK binder and TLS Finished messages
 *     already prove the key both ways and bind it to the encrypted channel.
 *   - --insecure: plaintext as before TLS (with the HMAC Hello when a key is given), with
 *     a warning to log at startup.
 *   - none of these: STRATA_EINVAL (plaintext only when asked for), as is --insecure
 *     together with --tls-*. */
struct wire_security_flags {
    const char *cert_path, *key_path, *ca_path;
    int insecure;
    const struct wire_auth_key *key; /* len 0 = none */
};

struct wire_security {
    struct wire_tls *tls;                  /* NULL = plaintext */
    const struct wire_auth_key *hello_key; /* for the Hello's HMAC (NULL = none) */
    const char *warning;                   /* to log at startup, or NULL */
};

/* STRATA_EINVAL for missing or inconsistent flags, else wire_tls_new's status. */
int wire_security_setup(struct wire_security *out, const struct wire_security_flags *flags);
void wire_security_free(struct wire_security *security);

#endif
