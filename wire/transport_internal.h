/* Shared between transport.c and tls.c only (not part of the public wire API). */
#ifndef STRATA_WIRE_TRANSPORT_INTERNAL_H
#define STRATA_WIRE_TRANSPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire/transport.h"

/* Absolute deadline in ms (-1 = none) and the poll wait on one fd against it:
 * 0 ready, STRATA_ETIMEOUT or STRATA_EIO (naming `what` and `peer`). */
int64_t wire_deadline_after(int timeout_ms);
int wire_wait_fd(int fd, short events, int64_t deadline, const char *what, const char *peer);

/* One TLS read / write attempt on conn->ssl: > 0 bytes moved; 0 = would block, poll for
 * *events (0 = retry at once); < 0 a status (STRATA_ECLOSED for a close). */
ssize_t wire_tls_read(struct wire_conn *conn, void *dst, size_t n, short *events);
ssize_t wire_tls_write(struct wire_conn *conn, const void *src, size_t n, short *events);
/* Sends close_notify (best effort, never blocks) and frees conn->ssl. */
void wire_tls_close(struct wire_conn *conn);

#endif
