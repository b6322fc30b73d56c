/* Client side of a pipeline: connect to stage 0, submit requests (prompt ids, sampling,
 * max tokens, stop ids), read the streamed tokens, cancel. Several requests may be in
 * flight on one connection; events carry their nonce. Used by strata-client, the
 * integration tests and the demo. */
#ifndef STRATA_RUNTIME_STAGE_CLIENT_H
#define STRATA_RUNTIME_STAGE_CLIENT_H

#include <stdint.h>

#include "runtime/stage/request.h"
#include "wire/auth.h"
#include "wire/message.h"
#include "wire/tls.h"
#include "wire/transport.h"

struct strata_client {
    struct wire_conn conn;
    struct wire_arena arena;
};

/* Connects to stage 0 at host:port and runs the Hello handshake (key may have len 0). */
int client_connect(struct strata_client *client, const char *host, int port,
                   const struct wire_auth_key *key, int timeout_ms);
/* The same over TLS 1.3 when tls is not NULL (wire/tls.h): the TLS handshake first, then
 * the Hello inside it with `key` (NULL = no HMAC; see wire_security_setup). */
int client_connect_tls(struct strata_client *client, const char *host, int port,
                       struct wire_tls *tls, const struct wire_auth_key *key, int timeout_ms);
/* Accepts a zeroed or half-built client. */
void client_close(struct strata_client *client);

/* Sends a Request (request->nonce != 0: nonce 0 is reserved). */
int client_submit(struct strata_client *client, const struct stage_request *request);
int client_cancel(struct strata_client *client, uint64_t nonce);

/* Waits up to timeout_ms for the next token or error of any request on this connection.
 * An Error with nonce 0 comes back as REQUEST_EVENT_CONNECTION_ERROR: stage 0 is closing
 * the connection and every request on it is lost. STRATA_ETIMEOUT when nothing arrived;
 * STRATA_ECLOSED when stage 0 went away. */
int client_next_event(struct strata_client *client, struct request_event *event, int timeout_ms);

#endif
