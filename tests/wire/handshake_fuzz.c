/* libFuzzer target for the server side of the Hello handshake (wire/auth: what any peer on
 * the network reaches before authenticating): the input becomes the byte stream a client
 * sends on a socket, and wire_handshake_server must accept it (only a well-formed Hello
 * without a key configured) or refuse it with a status and a message, within its timeout,
 * never crashing, leaking or allocating past the pre-authentication frame cap.
 *
 * Input: byte 0 = flags (bit 0: the server has a key, so proofs are checked; bit 1: raw
 * mode, the rest of the input is the stream itself, length prefixes included; bit 2: the
 * client's fingerprint differs). Otherwise the rest gives a client Hello's fields (version
 * minor, role, stage index, 16 name bytes), then (position, xor) pairs that corrupt the
 * built frame, which is sent with its length prefix - so mutations reach both the framing
 * and the FlatBuffers verifier past a valid Hello. */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "wire/auth.h"
#include "wire/message.h"
#include "wire/transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The client's stream in structured mode: a Hello from the input's fields, corrupted. */
static size_t client_stream(uint8_t *out, size_t cap, const uint8_t *in, size_t n, int bad_fp) {
    struct wire_hello h = {.version_major = WIRE_VERSION_MAJOR, .has_fingerprint = 1};
    struct wire_arena arena;
    h.version_minor = n > 0 ? in[0] : 0;
    h.role = n > 1 ? (enum wire_role)(in[1] % 5) : WIRE_ROLE_CLIENT;
    h.stage_index = n > 2 ? (int8_t)in[2] : -1;
    memset(h.fingerprint, bad_fp ? 0x55 : 0xAA, sizeof h.fingerprint);
    for (size_t i = 0; i < 16 && 3 + i < n; ++i)
        h.name[i] = (char)(in[3 + i] ? in[3 + i] : 'x');
    if (wire_arena_init(&arena, 512) || wire_build_hello(&arena, &h)) {
        wire_arena_free(&arena);
        return 0;
    }
    size_t len = wire_arena_frame_len(&arena);
    if (len + 4 > cap) len = cap - 4;
    memcpy(out + 4, wire_arena_frame(&arena), len);
    wire_arena_free(&arena);
    for (int i = 0; i < 4; ++i)
        out[i] = (uint8_t)(len >> (8 * i));
    for (size_t i = 19; i + 1 < n; i += 2)
        out[4 + in[i] % len] ^= in[i + 1];
    return len + 4;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t stream[8192];
    static const struct wire_auth_key key = {.len = 32,
                                             .bytes = "0123456789abcdef0123456789abcdef"};
    static const struct wire_auth_key no_key = {0};
    if (size < 1 || size > sizeof stream) return 0;
    int flags = data[0];
    size_t n = (flags & 2) ? size - 1
                           : client_stream(stream, sizeof stream, data + 1, size - 1, flags & 4);
    if (flags & 2) memcpy(stream, data + 1, n);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    if (n && write(sv[1], stream, n) != (ssize_t)n) __builtin_trap();
    shutdown(sv[1], SHUT_WR);
    struct wire_conn conn;
    memset(&conn, 0, sizeof conn);
    conn.fd = sv[0];
    conn.open = 1;
    conn.max_frame = WIRE_HANDSHAKE_MAX_FRAME;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    snprintf(conn.peer, sizeof conn.peer, "fuzz");
    struct wire_hello self = {.version_major = WIRE_VERSION_MAJOR,
                              .version_minor = WIRE_VERSION_MINOR,
                              .has_fingerprint = 1,
                              .stage_index = 0,
                              .role = WIRE_ROLE_SERVER};
    memset(self.fingerprint, 0xAA, sizeof self.fingerprint);
    struct wire_hello peer;
    int rc = wire_handshake_server(&peer, &conn, &self, (flags & 1) ? &key : &no_key, 20);
    if (rc == 0) {
        if ((flags & 1) || memchr(peer.name, 0, sizeof peer.name) == NULL) __builtin_trap();
    } else if (!strata_last_error()[0]) {
        __builtin_trap();
    }
    if (conn.rx_cap > 4 * WIRE_HANDSHAKE_MAX_FRAME) __builtin_trap(); /* the pre-auth cap held */
    wire_close(&conn);
    close(sv[1]);
    return 0;
}
