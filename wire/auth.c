/* Pre-shared-key Hello handshake (HMAC-SHA256 challenge/response both ways); see auth.h.
 *
 * The server speaks first with a fresh random challenge, so a recorded client proof is
 * useless on a later connection. Proofs are compared with CRYPTO_memcmp (constant time).
 * Every refusal is answered with an Error frame when the socket still works and returned
 * as a status whose message is the reason; the caller logs it with conn->peer. */
#include "wire/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

#define CLIENT_LABEL "strata-client"
#define SERVER_LABEL "strata-server"

int wire_auth_key_load(struct wire_auth_key *key, const char *path, const char *env_name) {
    memset(key, 0, sizeof *key);
    if (path) {
        FILE *f = fopen(path, "rb");
        if (!f) return strata_set_error(STRATA_EIO, "auth: cannot open key file %s", path);
        size_t n = fread(key->bytes, 1, sizeof key->bytes, f);
        int extra = fgetc(f);
        int failed = ferror(f);
        fclose(f);
        if (failed) return strata_set_error(STRATA_EIO, "auth: cannot read key file %s", path);
        if (extra != EOF)
            return strata_set_error(STRATA_EINVAL, "auth: key file %s is longer than %d bytes",
                                    path, WIRE_AUTH_KEY_MAX);
        while (n > 0 && (key->bytes[n - 1] == '\n' || key->bytes[n - 1] == '\r'))
            n--;
        key->len = n;
    } else {
        const char *value = getenv(env_name ? env_name : WIRE_AUTH_KEY_ENV);
        if (!value) return 0;
        size_t n = strlen(value);
        if (n > WIRE_AUTH_KEY_MAX)
            return strata_set_error(STRATA_EINVAL, "auth: key in $%s is longer than %d bytes",
                                    env_name ? env_name : WIRE_AUTH_KEY_ENV, WIRE_AUTH_KEY_MAX);
        memcpy(key->bytes, value, n);
        key->len = n;
    }
    if (key->len < WIRE_AUTH_KEY_MIN) {
        size_t len = key->len;
        wire_auth_key_clear(key);
        return strata_set_error(STRATA_EINVAL, "auth: key from %s has %zu bytes, need at least %d",
                                path ? path : "the environment", len, WIRE_AUTH_KEY_MIN);
    }
    return 0;
}

void wire_auth_key_clear(struct wire_auth_key *key) {
    if (key) OPENSSL_cleanse(key, sizeof *key);
}

int wire_model_fingerprint(uint8_t *fingerprint, const void *config_json, size_t len,
                           const char *dtype) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int out_len = 0;
    const uint8_t zero = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(ctx, config_json, len) && EVP_DigestUpdate(ctx, &zero, 1) &&
             EVP_DigestUpdate(ctx, dtype ? dtype : "", dtype ? strlen(dtype) : 0) &&
             EVP_DigestFinal_ex(ctx, fingerprint, &out_len);
    EVP_MD_CTX_free(ctx);
    if (!ok || out_len != WIRE_FINGERPRINT_BYTES)
        return strata_set_error(STRATA_EIO, "auth: SHA-256 of the model config failed");
    return 0;
}

int wire_auth_proof(uint8_t *proof, const struct wire_auth_key *key, const char *label,
                    const uint8_t *first, const uint8_t *second) {
    uint8_t message[64 + 2 * WIRE_NONCE_BYTES];
    size_t label_len = strlen(label);
    if (label_len > 64) return strata_set_error(STRATA_EINVAL, "auth: label too long");
    memcpy(message, label, label_len);
    memcpy(message + label_len, first, WIRE_NONCE_BYTES);
    memcpy(message + label_len + WIRE_NONCE_BYTES, second, WIRE_NONCE_BYTES);
    unsigned int out_len = 0;
    if (!HMAC(EVP_sha256(), key->bytes, (int)key->len, message, label_len + 2 * WIRE_NONCE_BYTES,
              proof, &out_len) ||
        out_len != WIRE_PROOF_BYTES)
        return strata_set_error(STRATA_EIO, "auth: HMAC-SHA256 failed");
    return 0;
}

static int send_hello(struct wire_conn *conn, const struct wire_hello *hello, int timeout_ms) {
    struct wire_arena arena;
    int rc = wire_arena_init(&arena, 1024);
    if (!rc) rc = wire_build_hello(&arena, hello);
    if (!rc)
        rc = wire_send_frame(conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                             timeout_ms);
    wire_arena_free(&arena);
    return rc;
}

/* Reads a received frame as a Hello; an Error frame from the peer becomes STRATA_EPEER with
 * its message. */
static int parse_hello(struct wire_hello *hello, const struct wire_conn *conn, const uint8_t *frame,
                       size_t len) {
    enum wire_kind kind;
    int rc = wire_verify(&kind, NULL, frame, len);
    if (!rc && kind == WIRE_KIND_ERROR) {
        struct wire_error err;
        rc = wire_read_error(&err, frame, len);
        if (rc) return rc;
        return strata_set_error(STRATA_EPEER, "wire: %s refused the handshake: %s (%s)", conn->peer,
                                err.message, strata_status_name(err.code));
    }
    if (rc) return rc;
    return wire_read_hello(hello, frame, len);
}

/* Receives a Hello. Before the handshake is through the peer is unknown, so its frames are
 * held to WIRE_HANDSHAKE_MAX_FRAME whatever the conn's limit (restored after). */
static int recv_hello(struct wire_hello *hello, struct wire_conn *conn, int timeout_ms) {
    const uint8_t *frame;
    size_t len, saved = conn->max_frame;
    if (conn->max_frame > WIRE_HANDSHAKE_MAX_FRAME) conn->max_frame = WIRE_HANDSHAKE_MAX_FRAME;
    int rc = wire_recv_frame(conn, &frame, &len, timeout_ms);
    conn->max_frame = saved;
    if (rc) return rc;
    return parse_hello(hello, conn, frame, len);
}

static int check_version(const struct wire_hello *peer, const char *who) {
    if (peer->version_major != WIRE_VERSION_MAJOR)
        return strata_set_error(
            STRATA_EVERSION, "wire: %s speaks protocol %u.%u, this build speaks %d.%d", who,
            peer->version_major, peer->version_minor, WIRE_VERSION_MAJOR, WIRE_VERSION_MINOR);
    return 0;
}

/* Tells the peer why it is refused (best effort) and returns the status with the reason as
 * the message; the caller, which knows the peer's address, logs it (library code never
 * prints). */
static int refuse(struct wire_conn *conn, int code) {
    char reason[512];
    snprintf(reason, sizeof reason, "%s", strata_last_error());
    wire_send_error(conn, code, 0, reason);
    return strata_set_error(code, "%s", reason);
}

static void hello_template(struct wire_hello *out, const struct wire_hello *self) {
    *out = *self;
    out->version_major = WIRE_VERSION_MAJOR;
    out->version_minor = WIRE_VERSION_MINOR;
    out->has_challenge = 0;
    out->has_proof = 0;
}

int wire_handshake_server_start(struct wire_handshake *hs, struct wire_conn *conn,
                                const struct wire_hello *self, const struct wire_auth_key *key,
                                int timeout_ms) {
    struct wire_hello hello;
    memset(hs, 0, sizeof *hs);
    hs->self = *self;
    hs->key = key && key->len > 0 ? key : NULL;
    hello_template(&hello, self);
    hello.role = WIRE_ROLE_SERVER;
    hello.has_challenge = 1;
    if (RAND_bytes(hello.challenge, WIRE_NONCE_BYTES) != 1)
        return strata_set_error(STRATA_EIO, "auth: RAND_bytes failed");
    memcpy(hs->server_nonce, hello.challenge, WIRE_NONCE_BYTES);
    return send_hello(conn, &hello, timeout_ms);
}

/* The server's judgement of the client's Hello: 0 and the final Hello to send, or the
 * refusal's status (the message says why). */
static int judge_client(struct wire_hello *hello, const struct wire_handshake *hs,
                        const struct wire_hello *peer, const char *who) {
    const struct wire_hello *self = &hs->self;
    if (check_version(peer, who)) return STRATA_EVERSION;
    if (self->has_fingerprint && peer->has_fingerprint &&
        memcmp(self->fingerprint, peer->fingerprint, WIRE_FINGERPRINT_BYTES) != 0)
        return strata_set_error(STRATA_EINVAL,
                                "model fingerprint differs (different config.json or dtype)");
    if (!peer->has_challenge) return strata_set_error(STRATA_EAUTH, "client sent no challenge");
    hello_template(hello, self);
    hello->role = WIRE_ROLE_SERVER;
    if (hs->key) {
        uint8_t expected[WIRE_PROOF_BYTES];
        int rc =
            wire_auth_proof(expected, hs->key, CLIENT_LABEL, hs->server_nonce, peer->challenge);
        if (rc) return rc;
        if (!peer->has_proof)
            return strata_set_error(STRATA_EAUTH, "client sent no auth proof (no key configured?)");
        if (CRYPTO_memcmp(expected, peer->proof, WIRE_PROOF_BYTES) != 0)
            return strata_set_error(STRATA_EAUTH, "auth proof does not match (wrong key)");
        hello->has_proof = 1;
        return wire_auth_proof(hello->proof, hs->key, SERVER_LABEL, peer->challenge,
                               hs->server_nonce);
    }
    if (peer->has_proof)
        return strata_set_error(STRATA_EAUTH,
                                "client sent an auth proof but this server has no key");
    return 0;
}

int wire_handshake_server_finish(struct wire_handshake *hs, struct wire_hello *peer,
                                 struct wire_conn *conn, const uint8_t *frame, size_t len,
                                 int timeout_ms) {
    struct wire_hello hello;
    memset(peer, 0, sizeof *peer);
    int rc = parse_hello(peer, conn, frame, len);
    if (rc == STRATA_EFORMAT || rc == STRATA_EVERSION) return refuse(conn, rc);
    if (rc) return rc;
    rc = judge_client(&hello, hs, peer, conn->peer);
    if (rc == STRATA_EIO) return rc;
    if (rc) return refuse(conn, rc);
    return send_hello(conn, &hello, timeout_ms);
}

int wire_handshake_server(struct wire_hello *peer, struct wire_conn *conn,
                          const struct wire_hello *self, const struct wire_auth_key *key,
                          int timeout_ms) {
    struct wire_handshake hs;
    const uint8_t *frame;
    size_t len, saved = conn->max_frame;
    memset(peer, 0, sizeof *peer);
    int rc = wire_handshake_server_start(&hs, conn, self, key, timeout_ms);
    if (rc) return rc;
    if (conn->max_frame > WIRE_HANDSHAKE_MAX_FRAME) conn->max_frame = WIRE_HANDSHAKE_MAX_FRAME;
    rc = wire_recv_frame(conn, &frame, &len, timeout_ms);
    conn->max_frame = saved;
    if (rc == STRATA_EFORMAT) return refuse(conn, rc);
    if (rc) return rc;
    return wire_handshake_server_finish(&hs, peer, conn, frame, len, timeout_ms);
}

int wire_handshake_client(struct wire_hello *peer, struct wire_conn *conn,
                          const struct wire_hello *self, const struct wire_auth_key *key,
                          int timeout_ms) {
    struct wire_hello hello, final;
    int keyed = key && key->len > 0;
    memset(peer, 0, sizeof *peer);
    int rc = recv_hello(peer, conn, timeout_ms);
    /* A TLS server waits for a ClientHello, then gives up: its close is the only hint. */
    if (rc == STRATA_ECLOSED && !conn->ssl)
        return strata_set_error(rc,
                                "wire: server %s closed the connection before its Hello (does "
                                "it require TLS? this side runs without: give its key or "
                                "certificates)",
                                conn->peer);
    if (rc) return rc;
    rc = check_version(peer, conn->peer);
    if (rc) return rc;
    if (!peer->has_challenge)
        return strata_set_error(STRATA_EAUTH, "wire: server %s sent no challenge", conn->peer);
    hello_template(&hello, self);
    hello.has_challenge = 1;
    if (RAND_bytes(hello.challenge, WIRE_NONCE_BYTES) != 1)
        return strata_set_error(STRATA_EIO, "auth: RAND_bytes failed");
    if (keyed) {
        hello.has_proof = 1;
        rc = wire_auth_proof(hello.proof, key, CLIENT_LABEL, peer->challenge, hello.challenge);
        if (rc) return rc;
    }
    rc = send_hello(conn, &hello, timeout_ms);
    if (rc) return rc;
    rc = recv_hello(&final, conn, timeout_ms);
    if (rc) return rc;
    if (keyed) {
        uint8_t expected[WIRE_PROOF_BYTES];
        rc = wire_auth_proof(expected, key, SERVER_LABEL, hello.challenge, peer->challenge);
        if (rc) return rc;
        if (!final.has_proof || CRYPTO_memcmp(expected, final.proof, WIRE_PROOF_BYTES) != 0)
            return strata_set_error(STRATA_EAUTH, "wire: server %s could not prove the shared key",
                                    conn->peer);
    }
    return 0;
}
