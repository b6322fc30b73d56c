/* Length-prefixed frames over TCP; see transport.h.
 *
 * Sockets are non-blocking and every wait is a poll() against one deadline per call, so
 * a slow peer that trickles bytes cannot stretch a call past its timeout. Reads and
 * writes loop until the whole frame has moved. The length prefix is checked against
 * max_frame before the receive buffer grows, so a hostile length costs nothing. */
#include "wire/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/message.h"
#include "wire/transport_internal.h"

#define ERROR_SEND_TIMEOUT_MS 1000
#define TLS_RECORD_BYTES 16384 /* TLS's largest record payload */

int64_t wire_deadline_after(int timeout_ms) {
    return timeout_ms < 0 ? -1 : cli_now_ms() + timeout_ms;
}

/* Waits for `events` on fd until the deadline: 0 ready, STRATA_ETIMEOUT, STRATA_EIO. */
int wire_wait_fd(int fd, short events, int64_t deadline, const char *what, const char *peer) {
    for (;;) {
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - cli_now_ms();
            if (left <= 0)
                return strata_set_error(STRATA_ETIMEOUT, "wire: %s %s timed out", what, peer);
            wait = left > 1000000 ? 1000000 : (int)left;
        }
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, wait);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR)
            return strata_set_error(STRATA_EIO, "wire: poll during %s %s: %s", what, peer,
                                    strerror(errno));
    }
}

static int set_socket_options(int fd) {
    int one = 1;
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return strata_set_error(STRATA_EIO, "wire: fcntl O_NONBLOCK: %s", strerror(errno));
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        return strata_set_error(STRATA_EIO, "wire: setsockopt TCP_NODELAY: %s", strerror(errno));
    return 0;
}

static int resolve(struct addrinfo **out, const char *host, int port, int passive) {
    char service[16];
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    if (port < 0 || port > 65535)
        return strata_set_error(STRATA_EINVAL, "wire: port %d outside 0..65535", port);
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host ? host : WIRE_DEFAULT_HOST, service, &hints, out);
    if (rc != 0)
        return strata_set_error(STRATA_EIO, "wire: cannot resolve %s: %s",
                                host ? host : WIRE_DEFAULT_HOST, gai_strerror(rc));
    return 0;
}

static void conn_reset(struct wire_conn *conn, int fd, size_t max_frame, const char *peer) {
    memset(conn, 0, sizeof *conn);
    conn->fd = fd;
    conn->open = fd >= 0;
    conn->max_frame = max_frame ? max_frame : WIRE_DEFAULT_MAX_FRAME;
    snprintf(conn->peer, sizeof conn->peer, "%s", peer);
}

static void format_peer(char *out, size_t size, const struct sockaddr *addr) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, size, "%s:%d", host, port);
}

int wire_listen(struct wire_listener *listener, const char *host, int port) {
    struct addrinfo *addrs = NULL;
    listener->fd = -1;
    listener->port = 0;
    listener->open = 0;
    int fd = -1;
    int rc = resolve(&addrs, host, port, 1);
    if (rc) return rc;
    fd = socket(addrs->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = strata_set_error(STRATA_EIO, "wire: socket: %s", strerror(errno));
        goto fail;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); /* accept never blocks past poll */
    if (bind(fd, addrs->ai_addr, addrs->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        rc = strata_set_error(STRATA_EIO, "wire: bind/listen %s:%d: %s",
                              host ? host : WIRE_DEFAULT_HOST, port, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) < 0) {
        rc = strata_set_error(STRATA_EIO, "wire: getsockname: %s", strerror(errno));
        goto fail;
    }
    listener->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                       : ((struct sockaddr_in *)&bound)->sin_port);
    listener->fd = fd;
    listener->open = 1;
    freeaddrinfo(addrs);
    return 0;
fail:
    if (fd >= 0) close(fd);
    freeaddrinfo(addrs);
    return rc;
}

void wire_listener_close(struct wire_listener *listener) {
    if (!listener) return;
    if (listener->open && listener->fd >= 0) close(listener->fd);
    listener->fd = -1;
    listener->open = 0;
}

int wire_accept(struct wire_conn *conn, struct wire_listener *listener, size_t max_frame,
                int timeout_ms) {
    conn_reset(conn, -1, max_frame, "?");
    int64_t deadline = wire_deadline_after(timeout_ms);
    for (;;) {
        /* timeout 0: one try, for an event loop that saw the listener readable. */
        int rc = timeout_ms == 0
                     ? 0
                     : wire_wait_fd(listener->fd, POLLIN, deadline, "accept on port", "");
        if (rc) return rc;
        struct sockaddr_storage addr;
        socklen_t addr_len = sizeof addr;
        int fd = accept4(listener->fd, (struct sockaddr *)&addr, &addr_len, SOCK_CLOEXEC);
        if (fd < 0) {
            if (timeout_ms == 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return strata_set_error(STRATA_ETIMEOUT, "wire: no connection waiting");
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
                continue;
            return strata_set_error(STRATA_EIO, "wire: accept: %s", strerror(errno));
        }
        char peer[64];
        format_peer(peer, sizeof peer, (struct sockaddr *)&addr);
        conn_reset(conn, fd, max_frame, peer);
        rc = set_socket_options(fd);
        if (rc) wire_close(conn);
        return rc;
    }
}

int wire_connect(struct wire_conn *conn, const char *host, int port, size_t max_frame,
                 int timeout_ms) {
    struct addrinfo *addrs = NULL;
    char peer[64];
    snprintf(peer, sizeof peer, "%s:%d", host ? host : WIRE_DEFAULT_HOST, port);
    conn_reset(conn, -1, max_frame, peer);
    int rc = resolve(&addrs, host, port, 0);
    if (rc) return rc;
    int64_t deadline = wire_deadline_after(timeout_ms);
    int fd = socket(addrs->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    conn->fd = fd;
    conn->open = fd >= 0;
    if (fd < 0) {
        rc = strata_set_error(STRATA_EIO, "wire: socket: %s", strerror(errno));
        goto fail;
    }
    rc = set_socket_options(fd);
    if (rc) goto fail;
    if (connect(fd, addrs->ai_addr, addrs->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            rc = strata_set_error(STRATA_EIO, "wire: connect %s: %s", peer, strerror(errno));
            goto fail;
        }
        rc = wire_wait_fd(fd, POLLOUT, deadline, "connect to", peer);
        if (rc) goto fail;
        int err = 0;
        socklen_t err_len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) < 0) err = errno;
        if (err) {
            rc = strata_set_error(err == ETIMEDOUT ? STRATA_ETIMEOUT : STRATA_EIO,
                                  "wire: connect %s: %s", peer, strerror(err));
            goto fail;
        }
    }
    freeaddrinfo(addrs);
    return 0;
fail:
    freeaddrinfo(addrs);
    wire_close(conn);
    return rc;
}

/* Plaintext: one sendmsg of prefix + frame (a single syscall for small frames). */
static int send_plain(struct wire_conn *conn, struct iovec *iov, int64_t deadline) {
    int iov_index = 0;
    while (iov_index < 2) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov + iov_index;
        msg.msg_iovlen = (size_t)(2 - iov_index);
        ssize_t sent = sendmsg(conn->fd, &msg, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wire_wait_fd(conn->fd, POLLOUT, deadline, "send to", conn->peer);
                if (rc) return rc;
                continue;
            }
            return strata_set_error(errno == EPIPE || errno == ECONNRESET ? STRATA_ECLOSED
                                                                          : STRATA_EIO,
                                    "wire: send to %s: %s", conn->peer, strerror(errno));
        }
        size_t done = (size_t)sent;
        while (iov_index < 2 && done >= iov[iov_index].iov_len)
            done -= iov[iov_index++].iov_len;
        if (iov_index < 2) {
            iov[iov_index].iov_base = (uint8_t *)iov[iov_index].iov_base + done;
            iov[iov_index].iov_len -= done;
        }
    }
    return 0;
}

/* Writes all of [n] through TLS, polling for what OpenSSL waits on. */
static int tls_write_all(struct wire_conn *conn, const uint8_t *src, size_t n, int64_t deadline) {
    size_t done = 0;
    while (done < n) {
        short events = 0;
        ssize_t w = wire_tls_write(conn, src + done, n - done, &events);
        if (w < 0) return (int)w;
        done += (size_t)w;
        if (w == 0 && events) {
            int rc = wire_wait_fd(conn->fd, events, deadline, "send to", conn->peer);
            if (rc) return rc;
        }
    }
    return 0;
}

/* TLS: the prefix travels in one record with the frame's first bytes (a 4-byte record of
 * its own would cost a record header, a tag and, with TCP_NODELAY, a segment). */
static int send_tls(struct wire_conn *conn, const uint8_t *prefix, const uint8_t *frame, size_t len,
                    int64_t deadline) {
    uint8_t first[TLS_RECORD_BYTES];
    size_t head =
        len < sizeof first - WIRE_FRAME_PREFIX_BYTES ? len : sizeof first - WIRE_FRAME_PREFIX_BYTES;
    memcpy(first, prefix, WIRE_FRAME_PREFIX_BYTES);
    memcpy(first + WIRE_FRAME_PREFIX_BYTES, frame, head);
    int rc = tls_write_all(conn, first, WIRE_FRAME_PREFIX_BYTES + head, deadline);
    if (!rc && head < len) rc = tls_write_all(conn, frame + head, len - head, deadline);
    return rc;
}

static int send_usable(struct wire_conn *conn, size_t len) {
    if (!conn->open || conn->broken)
        return strata_set_error(STRATA_ECLOSED, "wire: send on a closed or broken connection to %s",
                                conn->peer);
    if (len == 0 || len > UINT32_MAX || len > conn->max_frame)
        return strata_set_error(STRATA_EINVAL, "wire: frame of %zu bytes outside 1..%zu", len,
                                conn->max_frame);
    return 0;
}

int wire_flush_nb(struct wire_conn *conn) {
    size_t before = conn->tx_off;
    while (conn->tx_off < conn->tx_len) {
        size_t left = conn->tx_len - conn->tx_off;
        ssize_t n;
        if (conn->ssl) {
            short events = 0;
            /* Never less than a retried SSL_write was given: the queue only grows. */
            n = wire_tls_write(conn, conn->tx + conn->tx_off,
                               left < TLS_RECORD_BYTES ? left : TLS_RECORD_BYTES, &events);
            if (n == 0 && events) break;
        } else {
            n = send(conn->fd, conn->tx + conn->tx_off, left, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (n < 0 && errno == EINTR) continue;
            if (n < 0)
                n = strata_set_error(errno == EPIPE || errno == ECONNRESET ? STRATA_ECLOSED
                                                                           : STRATA_EIO,
                                     "wire: send to %s: %s", conn->peer, strerror(errno));
        }
        if (n < 0) {
            conn->broken = 1;
            return (int)n;
        }
        conn->tx_off += (size_t)n;
    }
    if (conn->tx_off == conn->tx_len) {
        conn->tx_off = conn->tx_len = 0;
        conn->tx_waiting_ms = 0;
    } else if (!conn->tx_waiting_ms || conn->tx_off != before) {
        conn->tx_waiting_ms = cli_now_ms();
    }
    return 0;
}

int wire_send_frame_nb(struct wire_conn *conn, const void *frame, size_t len, size_t max_queued) {
    int rc = send_usable(conn, len);
    if (rc) return rc;
    size_t queued = conn->tx_len - conn->tx_off, need = queued + WIRE_FRAME_PREFIX_BYTES + len;
    if (need > max_queued) {
        conn->broken = 1;
        return strata_set_error(STRATA_EBUSY,
                                "wire: %s does not read: %zu bytes queued, %zu more refused",
                                conn->peer, queued, len);
    }
    if (conn->tx_off) { /* a retried SSL_write may move (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER) */
        memmove(conn->tx, conn->tx + conn->tx_off, queued);
        conn->tx_off = 0;
        conn->tx_len = queued;
    }
    if (need > conn->tx_cap) {
        size_t cap = conn->tx_cap * 2 > need ? conn->tx_cap * 2 : need < 4096 ? 4096 : need;
        uint8_t *grown = realloc(conn->tx, cap);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "wire: cannot queue %zu bytes", need);
        conn->tx = grown;
        conn->tx_cap = cap;
    }
    uint8_t *p = conn->tx + conn->tx_len;
    p[0] = (uint8_t)len;
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)(len >> 16);
    p[3] = (uint8_t)(len >> 24);
    memcpy(p + WIRE_FRAME_PREFIX_BYTES, frame, len);
    conn->tx_len = need;
    return wire_flush_nb(conn);
}

size_t wire_conn_tx_pending(const struct wire_conn *conn) {
    return conn->tx_len - conn->tx_off;
}

int64_t wire_conn_tx_waiting_since(const struct wire_conn *conn) {
    return conn->tx_waiting_ms;
}

/* Sends the queue of wire_send_frame_nb before a blocking send, so frames keep order. */
static int flush_queue(struct wire_conn *conn, int64_t deadline) {
    while (conn->tx_off < conn->tx_len) {
        int rc = wire_flush_nb(conn);
        if (!rc && conn->tx_off < conn->tx_len)
            rc = wire_wait_fd(conn->fd, POLLOUT, deadline, "send to", conn->peer);
        if (rc) {
            conn->broken = 1;
            return rc;
        }
    }
    return 0;
}

int wire_send_frame(struct wire_conn *conn, const void *frame, size_t len, int timeout_ms) {
    int rc = send_usable(conn, len);
    if (rc) return rc;
    uint8_t prefix[WIRE_FRAME_PREFIX_BYTES] = {(uint8_t)len, (uint8_t)(len >> 8),
                                               (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    int64_t deadline = wire_deadline_after(timeout_ms);
    rc = flush_queue(conn, deadline);
    if (rc) return rc;
    if (conn->ssl) {
        rc = send_tls(conn, prefix, frame, len, deadline);
    } else {
        struct iovec iov[2] = {{prefix, sizeof prefix}, {(void *)frame, len}};
        rc = send_plain(conn, iov, deadline);
    }
    if (rc) conn->broken = 1;
    return rc;
}

/* One receive attempt: > 0 bytes, 0 = poll for *events first, < 0 a status. */
static ssize_t recv_some(struct wire_conn *conn, uint8_t *dst, size_t n, short *events) {
    if (conn->ssl) return wire_tls_read(conn, dst, n, events);
    *events = 0;
    ssize_t r = recv(conn->fd, dst, n, 0);
    if (r > 0) return r;
    if (r == 0)
        return strata_set_error(STRATA_ECLOSED, "wire: %s closed the connection", conn->peer);
    if (errno == EINTR) return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *events = POLLIN;
        return 0;
    }
    return strata_set_error(errno == ECONNRESET ? STRATA_ECLOSED : STRATA_EIO,
                            "wire: recv from %s: %s", conn->peer, strerror(errno));
}

/* Checks a complete length prefix: the announced length, before anything is allocated. */
static int check_prefix(struct wire_conn *conn) {
    const uint8_t *p = conn->rx_prefix;
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (!conn->ssl && conn->frames_in == 0 && p[0] == 0x16 && p[1] == 0x03 && n > 65535) {
        /* A TLS record header (handshake, version 3.x) where a Hello was expected. */
        conn->broken = 1;
        return strata_set_error(STRATA_EFORMAT,
                                "wire: %s speaks TLS, but this side runs without TLS (--insecure "
                                "or no --tls-* / key given)",
                                conn->peer);
    }
    if (n == 0 || n > conn->max_frame) {
        conn->broken = 1;
        return strata_set_error(STRATA_EFORMAT,
                                "wire: %s announced a frame of %zu bytes (allowed 1..%zu)",
                                conn->peer, n, conn->max_frame);
    }
    conn->rx_need = n;
    conn->rx_have = 0;
    return 0;
}

/* Makes room for the next bytes of a frame of rx_need: at most doubling, from 64 KiB, so
 * the buffer tracks what arrived rather than what was announced. Keeps the bytes so far. */
#define RX_GROW_MIN ((size_t)64 << 10)
static int grow_rx(struct wire_conn *conn) {
    size_t want = conn->rx_cap * 2 > RX_GROW_MIN ? conn->rx_cap * 2 : RX_GROW_MIN;
    if (want > conn->rx_need) want = conn->rx_need;
    size_t cap = (want + 63) / 64 * 64;
    uint8_t *grown = aligned_alloc(64, cap);
    if (!grown) {
        conn->broken = 1;
        return strata_set_error(STRATA_ENOMEM, "wire: cannot allocate %zu bytes for a frame", cap);
    }
    if (conn->rx_have) memcpy(grown, conn->rx, conn->rx_have);
    free(conn->rx);
    conn->rx = grown;
    conn->rx_cap = cap;
    return 0;
}

/* One step of the frame receive: 0 progress made (or a frame completed: rx_need == rx_have
 * != 0), WIRE_RECV_PENDING with *events to wait for, or a status. */
static int recv_step(struct wire_conn *conn, short *events) {
    ssize_t r;
    if (conn->rx_need == 0) {
        r = recv_some(conn, conn->rx_prefix + conn->rx_prefix_have,
                      WIRE_FRAME_PREFIX_BYTES - conn->rx_prefix_have, events);
    } else {
        if (conn->rx_have == conn->rx_cap && grow_rx(conn) < 0) return STRATA_ENOMEM;
        size_t room = (conn->rx_cap < conn->rx_need ? conn->rx_cap : conn->rx_need) - conn->rx_have;
        r = recv_some(conn, conn->rx + conn->rx_have, room, events);
    }
    if (r < 0) {
        if (r == STRATA_ECLOSED && conn->rx_need)
            strata_set_error(STRATA_ECLOSED,
                             "wire: %s closed the connection %zu bytes into a %zu-byte frame",
                             conn->peer, conn->rx_have, conn->rx_need);
        if (conn->rx_need || conn->rx_prefix_have) conn->broken = 1;
        return (int)r;
    }
    if (r == 0) return *events ? WIRE_RECV_PENDING : 0;
    if (!conn->rx_started_ms) conn->rx_started_ms = cli_now_ms();
    if (conn->rx_need == 0) {
        conn->rx_prefix_have += (size_t)r;
        if (conn->rx_prefix_have == WIRE_FRAME_PREFIX_BYTES) return check_prefix(conn);
        return 0;
    }
    conn->rx_have += (size_t)r;
    return 0;
}

/* Pops a completed frame out of the receive state. */
static void take_frame(struct wire_conn *conn, const uint8_t **frame, size_t *len) {
    *frame = conn->rx;
    *len = conn->rx_need;
    conn->rx_need = conn->rx_have = conn->rx_prefix_have = 0;
    conn->rx_started_ms = 0;
    conn->frames_in++;
}

static int recv_usable(struct wire_conn *conn, const uint8_t **frame, size_t *len) {
    *frame = NULL;
    *len = 0;
    if (!conn->open || conn->broken)
        return strata_set_error(STRATA_ECLOSED,
                                "wire: receive on a closed or broken connection to %s", conn->peer);
    return 0;
}

int wire_recv_frame_nb(struct wire_conn *conn, const uint8_t **frame, size_t *len) {
    int rc = recv_usable(conn, frame, len);
    while (rc == 0) {
        short events = 0;
        if (conn->rx_need && conn->rx_have == conn->rx_need) {
            take_frame(conn, frame, len);
            return 0;
        }
        rc = recv_step(conn, &events);
    }
    return rc;
}

int wire_recv_frame(struct wire_conn *conn, const uint8_t **frame, size_t *len, int timeout_ms) {
    int64_t deadline = wire_deadline_after(timeout_ms);
    int rc = recv_usable(conn, frame, len);
    while (rc == 0) {
        short events = 0;
        if (conn->rx_need && conn->rx_have == conn->rx_need) {
            take_frame(conn, frame, len);
            return 0;
        }
        rc = recv_step(conn, &events);
        if (rc == WIRE_RECV_PENDING) {
            rc = wire_wait_fd(conn->fd, events, deadline, "receive from", conn->peer);
            /* A partial frame cannot be resumed by a caller that gave up on it. */
            if (rc && conn->rx_started_ms) conn->broken = 1;
        }
    }
    return rc;
}

int64_t wire_conn_partial_since(const struct wire_conn *conn) {
    return conn->rx_started_ms;
}

int wire_send_error(struct wire_conn *conn, int code, uint64_t nonce, const char *message) {
    struct wire_arena arena;
    struct wire_error err = {code, message, nonce};
    int rc = wire_arena_init(&arena, 1024);
    if (!rc) rc = wire_build_error(&arena, &err);
    if (!rc)
        rc = wire_send_frame(conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                             ERROR_SEND_TIMEOUT_MS);
    wire_arena_free(&arena);
    return rc;
}

int wire_conn_buffered(const struct wire_conn *conn) {
    return conn->ssl && conn->fd >= 0 && SSL_has_pending(conn->ssl);
}

void wire_close(struct wire_conn *conn) {
    if (!conn) return;
    wire_tls_close(conn);
    if (conn->open && conn->fd >= 0) close(conn->fd);
    free(conn->rx);
    free(conn->tx);
    conn->tx = NULL;
    conn->tx_cap = conn->tx_off = conn->tx_len = 0;
    conn->fd = -1;
    conn->open = 0;
    conn->rx = NULL;
    conn->rx_cap = 0;
}

void wire_conn_move(struct wire_conn *dst, struct wire_conn *src) {
    *dst = *src;
    memset(src, 0, sizeof *src);
    src->fd = -1;
}
