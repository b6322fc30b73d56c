/* The OpenAI-compatible HTTP front on libmicrohttpd: POST /v1/chat/completions and
 * /v1/completions (whole or SSE-streamed), GET /v1/models, /health, /metrics.
 *
 * Threads: libmicrohttpd runs one thread per connection, so a handler may block on its
 * generation (serve_gen) without holding up any other client; the engine's reader thread
 * feeds every generation. A streamed answer is a response whose content-reader callback
 * blocks for the next tokens and returns them as SSE events; when the client goes away,
 * libmicrohttpd destroys the response and its free callback cancels the request. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_HTTP_H
#define STRATA_RUNTIME_SERVE_SERVE_HTTP_H

#include "runtime/serve/serve_gen.h"

/* The request body limit when strata-serve --max-body-bytes does not set one (HTTP bodies and
 * gRPC messages alike). */
#define SERVE_MAX_BODY (1L << 20)

struct serve_server;

/* Listens on host (IPv4 literal or "localhost"):port (0 = any free port). */
int serve_server_start(struct serve_server **out, struct serve_app *app, const char *host,
                       int port);
int serve_server_port(const struct serve_server *s);
void serve_server_stop(struct serve_server *s);

#endif
