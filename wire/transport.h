/* Framed TCP transport: each frame is a u32 little-endian length followed by one
 * FlatBuffers frame (wire/message.h).
 *
 * Every blocking call takes a timeout in milliseconds (poll-based; < 0 waits forever) and
 * loops until all bytes are moved, so partial reads and writes are invisible to callers.
 * A frame longer than the connection's max frame size is refused from its length prefix,
 * before anything is allocated, and the connection is then unusable. Sockets use
 * TCP_NODELAY and MSG_NOSIGNAL (a closed peer gives STRATA_ECLOSED, not SIGPIPE).
 * Listen addresses default to 127.0.0.1. Errors name the syscall, the peer and errno.
 *
 * A conn may carry TLS (wire/tls.h): after wire_tls_accept / wire_tls_connect every send
 * and receive below goes through its SSL*, with the same frames, timeouts and statuses. */
#ifndef STRATA_WIRE_TRANSPORT_H
#define STRATA_WIRE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_DEFAULT_HOST "127.0.0.1"
#define WIRE_DEFAULT_MAX_FRAME ((size_t)1 << 30) /* 1 GiB */
#define WIRE_FRAME_PREFIX_BYTES 4

struct wire_listener {
    int fd;   /* -1 when closed */
    int port; /* bound port (useful when asked for port 0) */
    int open; /* fd is ours to close (a zeroed listener is closed) */
};

struct ssl_st; /* OpenSSL's SSL, kept out of this header */

struct wire_conn {
    int fd;             /* -1 when closed */
    struct ssl_st *ssl; /* NULL = plaintext; else every byte goes through TLS (wire/tls.h) */
    size_t max_frame;   /* frames above this are refused before allocation */
    uint8_t *rx;        /* [rx_cap] receive buffer, 64-byte aligned; frames point into it */
    size_t rx_cap;
    int broken;         /* a framing error happened: only close is meaningful */
    char peer[64];      /* "host:port" for messages */
    int open;           /* fd is ours to close (a zeroed conn is closed) */
    uint64_t frames_in; /* frames received (the first one is the Hello) */
    /* The frame being received, kept across calls (wire_recv_frame_nb): its prefix bytes,
     * then its length and the bytes of it already in rx. */
    uint8_t rx_prefix[WIRE_FRAME_PREFIX_BYTES];
    size_t rx_prefix_have; /* 0..4 */
    size_t rx_need;        /* announced length once the prefix is complete, else 0 */
    size_t rx_have;        /* bytes of the frame in rx */
    int64_t rx_started_ms; /* when the frame's first byte arrived (0: none pending) */
    /* Frames queued by wire_send_frame_nb that the socket has not taken yet. */
    uint8_t *tx; /* [tx_cap]: bytes [tx_off, tx_len) still to send */
    size_t tx_cap, tx_off, tx_len;
    int64_t tx_waiting_ms; /* since when queued bytes have not moved (0: none queued) */
};

/* Binds and listens on host:port (host NULL = 127.0.0.1, port 0 = any free port). */
int wire_listen(struct wire_listener *listener, const char *host, int port);
void wire_listener_close(struct wire_listener *listener);

/* Waits up to timeout_ms for a connection (0: one try, STRATA_ETIMEOUT when none is
 * waiting). `max_frame` 0 = WIRE_DEFAULT_MAX_FRAME. */
int wire_accept(struct wire_conn *conn, struct wire_listener *listener, size_t max_frame,
                int timeout_ms);

/* Connects with a timeout (STRATA_ETIMEOUT, or STRATA_EIO naming the refusal). */
int wire_connect(struct wire_conn *conn, const char *host, int port, size_t max_frame,
                 int timeout_ms);

/* Sends one frame [len] with its length prefix. */
int wire_send_frame(struct wire_conn *conn, const void *frame, size_t len, int timeout_ms);

/* Receives one frame into the connection's buffer: *frame stays valid until the next
 * receive or close. STRATA_ECLOSED on a clean close before a frame starts, STRATA_EFORMAT
 * for a frame above max_frame or of length 0, STRATA_ETIMEOUT if no full frame arrives
 * in time (the connection is then broken when part of a frame had arrived). The blocking
 * twin of wire_recv_frame_nb: both keep their progress in the conn. */
int wire_recv_frame(struct wire_conn *conn, const uint8_t **frame, size_t *len, int timeout_ms);

/* Non-blocking receive for event loops: moves whatever bytes the socket (or TLS) has into
 * the conn and returns 0 with *frame / *len when a whole frame is there (valid until the
 * next receive or close), WIRE_RECV_PENDING when the frame is not complete yet (progress is
 * kept in the conn, so a peer that stalls mid-frame costs only its own bytes), or a
 * status as wire_recv_frame. The length prefix is checked against max_frame before any
 * allocation, and the buffer then grows with the bytes that actually arrive (doubling,
 * from 64 KiB), so an announced length alone allocates nothing. */
#define WIRE_RECV_PENDING 1
int wire_recv_frame_nb(struct wire_conn *conn, const uint8_t **frame, size_t *len);

/* Non-blocking send for event loops: appends the frame (with its prefix) to the conn's
 * queue and sends as much of the queue as the socket takes now. STRATA_EBUSY (the conn is
 * then broken) when more than max_queued bytes would wait: the peer does not read. A
 * later wire_send_frame sends the queue first, so frames keep their order. */
int wire_send_frame_nb(struct wire_conn *conn, const void *frame, size_t len, size_t max_queued);
/* Sends what the socket takes of the queue now (call when poll() says POLLOUT). */
int wire_flush_nb(struct wire_conn *conn);
/* Bytes queued and not yet sent. */
size_t wire_conn_tx_pending(const struct wire_conn *conn);
/* Since when queued bytes have not moved (cli_now_ns / 1e6 clock), 0 when none queued. */
int64_t wire_conn_tx_waiting_since(const struct wire_conn *conn);

/* When the first byte of a frame not yet complete arrived (cli_now_ns / 1e6 clock), or 0
 * when no frame is partly received: lets an event loop drop a peer stalled mid-frame. */
int64_t wire_conn_partial_since(const struct wire_conn *conn);

/* Best effort: sends an Error frame (code, message, nonce) with a short timeout; used
 * before closing on a protocol violation. Returns the send status. */
int wire_send_error(struct wire_conn *conn, int code, uint64_t nonce, const char *message);

/* 1 when bytes already read from the socket wait inside the conn (TLS records decrypted
 * but not yet consumed): poll() on the fd cannot see them, so an event loop must serve
 * such a conn without waiting. 0 for plaintext. */
int wire_conn_buffered(const struct wire_conn *conn);

/* Closes the socket and frees the buffer; accepts a zeroed or half-built conn. */
void wire_close(struct wire_conn *conn);

/* Moves a connection: *dst takes the socket, buffers, TLS state and partial frames of
 * *src, and *src is left closed and empty (fd -1, nothing to free), so exactly one of them
 * owns what wire_close releases. *dst's old contents are overwritten, not closed: pass a
 * closed or uninitialised conn. Why a function: a struct copy followed by fields cleared
 * by hand forgets the next field that owns something. */
void wire_conn_move(struct wire_conn *dst, struct wire_conn *src);

#endif
