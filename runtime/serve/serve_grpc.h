/* The gRPC service of strata-serve (runtime/serve/strata.proto, package strata.v1, service
 * Strata): Generate and Chat (server streaming), Health (also answering
 * /grpc.health.v1.Health/Check) and Info, on gRPC core's C API.
 *
 * Threads: an acceptor thread owns the server's completion queue and asks for calls one at a
 * time (grpc_server_request_call), each bound to a completion queue of its own; every call
 * then runs on a thread of its own, like the HTTP front's thread per connection, so it may
 * block on its generation (serve_gen, the same request path as HTTP) without holding up the
 * others. Between token waits a call polls its queue for RECV_CLOSE_ON_SERVER: a client that
 * cancels, disconnects or passes its deadline ends the call, and serve_gen_free cancels the
 * request on every stage. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_GRPC_H
#define STRATA_RUNTIME_SERVE_SERVE_GRPC_H

#include "runtime/serve/serve_gen.h"

/* Calls served at once; more are refused with RESOURCE_EXHAUSTED. */
#define SERVE_GRPC_MAX_CALLS 256

/* The method names (gRPC's "/package.Service/Method"). */
#define SERVE_GRPC_GENERATE "/strata.v1.Strata/Generate"
#define SERVE_GRPC_CHAT "/strata.v1.Strata/Chat"
#define SERVE_GRPC_HEALTH "/strata.v1.Strata/Health"
#define SERVE_GRPC_INFO "/strata.v1.Strata/Info"
#define SERVE_GRPC_HEALTH_V1 "/grpc.health.v1.Health/Check"

struct serve_grpc;

/* Listens on host:port (port 0 = any free port; plaintext HTTP/2) and starts serving. */
int serve_grpc_start(struct serve_grpc **out, struct serve_app *app, const char *host, int port);
int serve_grpc_port(const struct serve_grpc *s);
/* Refuses new calls, cancels the ones in flight (their requests are cancelled on the
 * pipeline), waits for their threads and frees everything. NULL is fine. */
void serve_grpc_stop(struct serve_grpc *s);

#endif
