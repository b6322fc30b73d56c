/* Hello handshake with pre-shared-key authentication (HMAC-SHA256, OpenSSL libcrypto).
 *
 * Exchange on a fresh connection (each step one frame):
 *   1. server -> client  Hello{role Server, challenge Ns (32 random bytes), fingerprint, ...}
 *   2. client -> server  Hello{role, challenge Nc, auth_proof = HMAC(K, "strata-client" || Ns ||
 * Nc)}
 *   3. server -> client  Hello{role Server, auth_proof = HMAC(K, "strata-server" || Nc || Ns)}
 *      or an Error frame naming the reason, then close.
 * Both proofs are compared in constant time (CRYPTO_memcmp), so each side proves it holds
 * K without sending it. The server also refuses another protocol major and, when both
 * sides send one, a different model fingerprint. A NULL or empty key on both sides runs
 * the same exchange without proofs (development only); a key on one side only fails.
 *
 * The key comes from --auth-key-file (the file's bytes, trailing newline stripped) or an
 * environment variable (default STRATA_AUTH_KEY); at least 16 bytes.
 * Both sides receive handshake frames under WIRE_HANDSHAKE_MAX_FRAME. */
#ifndef STRATA_WIRE_AUTH_H
#define STRATA_WIRE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "wire/message.h"
#include "wire/transport.h"

#define WIRE_AUTH_KEY_ENV "STRATA_AUTH_KEY"
#define WIRE_AUTH_KEY_MIN 16
#define WIRE_AUTH_KEY_MAX 1024
/* Frames before the handshake is through are held to this size, whatever the conn's
 * max_frame: the largest Hello (~300 bytes: fingerprint, challenge, proof, a 64-byte
 * name) or handshake Error (a reason of at most 512 bytes) fits, a 1 GiB announcement
 * from an unknown peer is refused from its length prefix. */
#define WIRE_HANDSHAKE_MAX_FRAME 2048

struct wire_auth_key {
    size_t len; /* 0 = no key */
    uint8_t bytes[WIRE_AUTH_KEY_MAX];
};

/* Loads the key from `path` if not NULL, else from environment variable `env_name`
 * (NULL = WIRE_AUTH_KEY_ENV). Neither present -> key->len = 0 and success. A file that
 * cannot be read or a key shorter than WIRE_AUTH_KEY_MIN is an error. */
int wire_auth_key_load(struct wire_auth_key *key, const char *path, const char *env_name);
/* Wipes the key bytes. */
void wire_auth_key_clear(struct wire_auth_key *key);

/* fingerprint [32] = SHA-256(config_json [len] || 0x00 || dtype name). */
int wire_model_fingerprint(uint8_t *fingerprint, const void *config_json, size_t len,
                           const char *dtype);

/* proof [32] = HMAC-SHA256(key, label || first [32] || second [32]). */
int wire_auth_proof(uint8_t *proof, const struct wire_auth_key *key, const char *label,
                    const uint8_t *first, const uint8_t *second);

/* Server side of the handshake on an accepted conn. `self` describes this process (its
 * challenge/proof fields are filled here). On success `peer` holds the client's Hello.
 * On refusal an Error frame is sent and the status is returned (STRATA_EAUTH,
 * STRATA_EVERSION, STRATA_EINVAL for a fingerprint mismatch) with the reason as the
 * strata_last_error() message; nothing is printed, the caller logs it with conn->peer. */
int wire_handshake_server(struct wire_hello *peer, struct wire_conn *conn,
                          const struct wire_hello *self, const struct wire_auth_key *key,
                          int timeout_ms);

/* The server side in two halves, for an event loop that receives the client's Hello
 * itself (wire_recv_frame_nb with the conn's max_frame at most WIRE_HANDSHAKE_MAX_FRAME):
 * _start sends the first Hello (a few hundred bytes: on a fresh socket the send buffer
 * takes it at once) and keeps the challenge in `hs`; _finish judges the client's Hello
 * frame and sends the final Hello or the Error, with the statuses of
 * wire_handshake_server. */
struct wire_handshake {
    struct wire_hello self;
    const struct wire_auth_key *key; /* NULL = no HMAC proofs */
    uint8_t server_nonce[WIRE_NONCE_BYTES];
};
int wire_handshake_server_start(struct wire_handshake *hs, struct wire_conn *conn,
                                const struct wire_hello *self, const struct wire_auth_key *key,
                                int timeout_ms);
int wire_handshake_server_finish(struct wire_handshake *hs, struct wire_hello *peer,
                                 struct wire_conn *conn, const uint8_t *frame, size_t len,
                                 int timeout_ms);

/* Client side on a connected conn; `peer` receives the server's Hello. A server that
 * refuses gives STRATA_EPEER with its message; a server that cannot prove the key gives
 * STRATA_EAUTH. */
int wire_handshake_client(struct wire_hello *peer, struct wire_conn *conn,
                          const struct wire_hello *self, const struct wire_auth_key *key,
                          int timeout_ms);

#endif
