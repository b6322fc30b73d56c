/* The gRPC service on gRPC core's completion queues (see serve_grpc.h).
 *
 * gRPC core rules this file follows (grpc/grpc.h, Debian's 1.51): at most one op of each kind
 * in flight per call, so sends and receives go in separate batches; receive targets and
 * status slices outlive their batch; a server is destroyed only after
 * grpc_server_shutdown_and_notify's tag, and a queue only after it drained to
 * GRPC_QUEUE_SHUTDOWN. */
#include "runtime/serve/serve_grpc.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/base/version.h"
#include "runtime/serve/serve_http.h"
#include "runtime/serve/serve_pb.h"
#include "wire/message.h"

/* How often a call waiting for tokens looks whether its client is still there. */
#define GRPC_POLL_MS 50
/* Longest wait for a call's request message once the call has started. */
#define GRPC_RECV_TIMEOUT_MS 30000

struct serve_grpc {
    struct serve_app *app;
    grpc_server *server;
    grpc_completion_queue *cq; /* new calls and the shutdown notice */
    pthread_t acceptor;
    int port, acceptor_running;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int n_calls; /* call threads alive */
};

/* Tags on a call's own queue (one op of each kind in flight at a time). */
static char g_tag_recv, g_tag_close, g_tag_send, g_tag_status, g_tag_shutdown;

struct call_ctx {
    struct serve_grpc *srv;
    grpc_completion_queue *cq; /* bound to the call; only its thread polls it */
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array request_md;
    grpc_byte_buffer *request;
    int cancelled; /* RECV_CLOSE_ON_SERVER's answer: the client cancelled or went away */
    int closed;    /* RECV_CLOSE_ON_SERVER completed */
    int md_sent;   /* initial metadata went out with an earlier batch */
    char method[96];
};

static gpr_timespec deadline_ms(int ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Waits for `tag` on the call's queue (the close notice is recorded on the way). 1 when it
 * completed with success, 0 when it failed (the call is cancelled), -1 at the deadline. */
static int wait_tag(struct call_ctx *c, void *tag, gpr_timespec deadline) {
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(c->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) return -1;
        if (ev.type != GRPC_OP_COMPLETE) return 0;
        if (ev.tag == &g_tag_close) c->closed = 1;
        if (ev.tag == tag) return ev.success != 0;
    }
}

/* 1 when the client is gone (cancelled, disconnected, past its deadline). */
static int client_gone(struct call_ctx *c) {
    if (!c->closed) wait_tag(c, &g_tag_close, gpr_time_0(GPR_CLOCK_MONOTONIC));
    return c->closed && c->cancelled;
}

static int start_batch(struct call_ctx *c, grpc_op *ops, size_t n, void *tag) {
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK)
        return strata_set_error(STRATA_EIO, "grpc: start_batch failed (%d)", (int)e);
    return 0;
}

/* Sends one message (bytes freed here), with the initial metadata the first time. 0 when it
 * went out, -1 when the call is gone. */
static int send_bytes(struct call_ctx *c, uint8_t *bytes, size_t len, void *tag) {
    grpc_slice slice = grpc_slice_new(bytes, len, free);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    c->md_sent = 1;
    int rc = start_batch(c, ops, n, tag) == 0
                 ? wait_tag(c, tag, deadline_ms(c->srv->app->token_timeout_ms))
                 : 0;
    if (rc < 0) {
        /* A client that stops reading must not hold the thread and its request forever. */
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                     "the client read nothing for the token timeout", NULL);
        rc = wait_tag(c, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    }
    grpc_byte_buffer_destroy(bb);
    return rc == 1 ? 0 : -1;
}

/* Ends the call with a status (and the message, when not NULL, before it). */
static void finish(struct call_ctx *c, enum serve_grpc_code code, const char *message) {
    grpc_slice details = grpc_slice_from_copied_string(message ? message : "");
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &details;
    c->md_sent = 1;
    if (start_batch(c, ops, n, &g_tag_status) == 0)
        wait_tag(c, &g_tag_status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    grpc_slice_unref(details);
    serve_metrics_grpc(c->srv->app->metrics, (int)code);
    if (code != SERVE_GRPC_OK && code != SERVE_GRPC_CANCELLED)
        strata_log(code == SERVE_GRPC_INVALID_ARGUMENT ? STRATA_LOG_INFO : STRATA_LOG_WARN,
                   "grpc %s: status %d: %s", c->method, (int)code, message ? message : "");
}

static void finish_error(struct call_ctx *c, const struct serve_error *err) {
    finish(c, serve_pb_status(err), err->message);
}

/* The request message's bytes (one slice, malloc'ed) or NULL when the client sent none. */
static uint8_t *request_bytes(struct call_ctx *c, size_t *len) {
    grpc_byte_buffer_reader reader;
    if (!c->request || !grpc_byte_buffer_reader_init(&reader, c->request)) return NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    *len = GRPC_SLICE_LENGTH(all);
    uint8_t *out = malloc(*len ? *len : 1);
    if (out) memcpy(out, GRPC_SLICE_START_PTR(all), *len);
    grpc_slice_unref(all);
    return out;
}

/* Sends the tokens and text that are new since the last message (and, once the generation
 * is finished, its finish reason and usage). -1 when the client is gone. */
static int send_progress(struct call_ctx *c, struct serve_gen *g, int *sent_ids) {
    const char *text;
    size_t text_len;
    serve_text_take(&g->text, g->finished, &text, &text_len);
    int n_ids = g->seen - *sent_ids;
    if (n_ids == 0 && text_len == 0 && !g->finished) return 0;
    struct serve_usage usage = serve_gen_usage(g);
    struct serve_pb_chunk chunk = {
        g->job.tokens + *sent_ids,  (size_t)n_ids, text, text_len, g->finished ? g->finish : NULL,
        g->finished ? &usage : NULL};
    uint8_t *bytes;
    size_t len;
    if (serve_pb_pack_chunk(&chunk, &bytes, &len) < 0) return -1;
    *sent_ids = g->seen;
    return send_bytes(c, bytes, len, &g_tag_send);
}

/* Generate / Chat: decode, submit, then stream until finished, failed or cancelled. */
static void serve_generation(struct call_ctx *c, enum serve_kind kind, const uint8_t *req,
                             size_t len) {
    struct serve_app *app = c->srv->app;
    struct serve_limits limits = {app->model_id, app->max_seq};
    struct serve_params params;
    struct serve_error err;
    struct serve_gen g;
    struct serve_image_limits images = {app->max_image_bytes, app->max_images, app->max_video_bytes,
                                        app->max_videos};
    int rc = kind == SERVE_CHAT
                 ? serve_pb_parse_chat_with(&params, req, len, &limits, &images, &err)
                 : serve_pb_parse_generate(&params, req, len, &limits, &err);
    if (rc < 0) {
        serve_params_free(&params);
        finish_error(c, &err);
        return;
    }
    if (serve_gen_begin(&g, app, &params, &err) < 0) {
        serve_gen_free(&g);
        finish_error(c, &err);
        return;
    }
    int sent_ids = 0, done = 0;
    while (!done) {
        rc = serve_gen_step(&g, GRPC_POLL_MS, &err);
        if (rc < 0) break;
        if (client_gone(c)) {
            strata_log(STRATA_LOG_INFO, "grpc %s: the client cancelled or went away", c->method);
            break;
        }
        if (rc == 0 && send_progress(c, &g, &sent_ids) < 0) break;
        done = rc == 0 && g.finished;
    }
    if (rc < 0)
        finish_error(c, &err);
    else
        finish(c, done ? SERVE_GRPC_OK : SERVE_GRPC_CANCELLED, done ? NULL : "cancelled");
    serve_gen_free(&g); /* cancels the request on every stage when it did not finish */
}

static void serve_health(struct call_ctx *c) {
    uint8_t *bytes;
    size_t len;
    int up = serve_engine_ping(c->srv->app->engine, 2000) == 0;
    char why[512];
    snprintf(why, sizeof why, "%s%s",
             up ? "" : "stage 0 does not answer: ", up ? "" : strata_last_error());
    if (serve_pb_pack_health(up, why, &bytes, &len) < 0 ||
        send_bytes(c, bytes, len, &g_tag_send) < 0)
        return;
    finish(c, SERVE_GRPC_OK, NULL);
}

/* The model and limits, and the stages from a describe round the ring: a broken ring leaves
 * stages empty with stages_error saying why (Info still answers for the front). */
static void serve_info(struct call_ctx *c) {
    const struct serve_app *app = c->srv->app;
    int32_t eos[TOKENIZER_MAX_EOS];
    char wire_version[32], stages_error[700] = "";
    struct client_describe *stages = malloc(sizeof *stages);
    snprintf(wire_version, sizeof wire_version, "%d.%d", WIRE_VERSION_MAJOR, WIRE_VERSION_MINOR);
    int rc = stages ? serve_engine_describe(app->engine, stages, SERVE_DESCRIBE_TIMEOUT_MS)
                    : strata_set_error(STRATA_ENOMEM, "no memory for the stage list");
    if (rc < 0)
        snprintf(stages_error, sizeof stages_error, "%s: %s", strata_status_name(rc),
                 strata_last_error());
    struct serve_pb_info info = {app->model_id,
                                 app->max_seq,
                                 (int)tokenizer_n_ids(app->tok),
                                 eos,
                                 tokenizer_eos_ids(app->tok, eos),
                                 app->have_template,
                                 wire_version,
                                 grpc_version_string(),
                                 stages_error[0] ? NULL : stages,
                                 stages_error,
                                 STRATA_VERSION};
    uint8_t *bytes;
    size_t len;
    rc = serve_pb_pack_info(&info, &bytes, &len);
    free(stages);
    if (rc < 0 || send_bytes(c, bytes, len, &g_tag_send) < 0) return;
    finish(c, SERVE_GRPC_OK, NULL);
}

/* Reads the one request message, then runs the method. */
static void serve_call(struct call_ctx *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (start_batch(c, &op, 1, &g_tag_close) < 0) return;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->request;
    if (start_batch(c, &op, 1, &g_tag_recv) < 0) return;
    int got = wait_tag(c, &g_tag_recv, deadline_ms(GRPC_RECV_TIMEOUT_MS));
    if (got < 0) {
        /* A call that never sends its request must not hold a thread. */
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                     "no request message within the server's timeout", NULL);
        got = wait_tag(c, &g_tag_recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    }
    if (got != 1) return; /* the client went away before sending its message */
    size_t len = 0;
    uint8_t *req = request_bytes(c, &len);
    int gen = !strcmp(c->method, SERVE_GRPC_GENERATE), chat = !strcmp(c->method, SERVE_GRPC_CHAT);
    if (!req && (gen || chat))
        finish(c, SERVE_GRPC_INVALID_ARGUMENT, "no request message");
    else if (gen || chat)
        serve_generation(c, chat ? SERVE_CHAT : SERVE_COMPLETION, req, len);
    else if (!strcmp(c->method, SERVE_GRPC_HEALTH) || !strcmp(c->method, SERVE_GRPC_HEALTH_V1))
        serve_health(c);
    else if (!strcmp(c->method, SERVE_GRPC_INFO))
        serve_info(c);
    else {
        char msg[160];
        snprintf(msg, sizeof msg, "unknown method %s", c->method);
        finish(c, SERVE_GRPC_UNIMPLEMENTED, msg);
    }
    free(req);
}

static struct call_ctx *call_new(struct serve_grpc *srv) {
    struct call_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = srv;
    c->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->request_md);
    return c;
}

/* After every op of the call completed: releases the call and drains its queue. */
static void call_free(struct call_ctx *c) {
    if (c->call && !c->closed) wait_tag(c, &g_tag_close, deadline_ms(5000));
    if (c->request) grpc_byte_buffer_destroy(c->request);
    if (c->call) grpc_call_unref(c->call);
    grpc_completion_queue_shutdown(c->cq);
    while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->cq);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->request_md);
    free(c);
}

static void *call_main(void *arg) {
    struct call_ctx *c = arg;
    struct serve_grpc *srv = c->srv;
    serve_call(c);
    call_free(c);
    pthread_mutex_lock(&srv->mu);
    if (--srv->n_calls == 0) pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* Asks gRPC for the next call. */
static int arm(struct serve_grpc *srv) {
    struct call_ctx *c = call_new(srv);
    if (!c) return strata_set_error(STRATA_ENOMEM, "grpc: no memory for a call");
    grpc_call_error e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->request_md,
                                                 c->cq, srv->cq, c);
    if (e != GRPC_CALL_OK) {
        call_free(c);
        return strata_set_error(STRATA_EIO, "grpc: request_call failed (%d)", (int)e);
    }
    return 0;
}

/* A new call: its own thread, or RESOURCE_EXHAUSTED when too many run already. */
static void dispatch(struct serve_grpc *srv, struct call_ctx *c) {
    size_t n = GRPC_SLICE_LENGTH(c->details.method);
    if (n >= sizeof c->method) n = sizeof c->method - 1;
    memcpy(c->method, GRPC_SLICE_START_PTR(c->details.method), n);
    c->method[n] = '\0';
    pthread_t t;
    pthread_mutex_lock(&srv->mu);
    int ok = srv->n_calls < SERVE_GRPC_MAX_CALLS;
    if (ok) srv->n_calls++;
    pthread_mutex_unlock(&srv->mu);
    if (ok && pthread_create(&t, NULL, call_main, c) == 0) {
        pthread_detach(t);
        return;
    }
    if (ok) {
        pthread_mutex_lock(&srv->mu);
        srv->n_calls--;
        pthread_mutex_unlock(&srv->mu);
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (start_batch(c, &op, 1, &g_tag_close) == 0)
        finish(c, SERVE_GRPC_RESOURCE_EXHAUSTED, "too many calls in flight; try again later");
    call_free(c);
}

static void *acceptor_main(void *arg) {
    struct serve_grpc *srv = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE || ev.tag == &g_tag_shutdown) break;
        struct call_ctx *c = ev.tag;
        if (!ev.success) { /* the server is shutting down: no call came */
            call_free(c);
            continue;
        }
        if (arm(srv) < 0) strata_log(STRATA_LOG_ERROR, "%s", strata_last_error());
        dispatch(srv, c);
    }
    return NULL;
}

static grpc_server *create_server(long max_message) {
    grpc_arg args[3];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)max_message;
    /* Pings keep long streams alive through idle periods and find dead clients. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[1].value.integer = 30000;
    /* gRPC turns SO_REUSEPORT on by default: a second server would share a taken port
     * silently instead of failing to listen. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    grpc_channel_args ch = {3, args};
    return grpc_server_create(&ch, NULL);
}

/* gRPC core's own diagnostics go to the operator log (as libmicrohttpd's do), never straight
 * to stderr; only errors: its info lines are per-connection noise. */
static void on_grpc_log(gpr_log_func_args *args) {
    char line[512];
    snprintf(line, sizeof line, "%s", args->message);
    line[strcspn(line, "\n")] = '\0';
    strata_log(STRATA_LOG_WARN, "grpc core: %s", line);
}

int serve_grpc_start(struct serve_grpc **out, struct serve_app *app, const char *host, int port) {
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%d", host, port);
    struct serve_grpc *s = calloc(1, sizeof *s);
    if (!s) return strata_set_error(STRATA_ENOMEM, "grpc: no memory");
    gpr_set_log_function(on_grpc_log);
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    grpc_init();
    s->app = app;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->server = create_server(app->max_body > 0 ? app->max_body : SERVE_MAX_BODY);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    s->port = grpc_server_add_http2_port(s->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        grpc_server_destroy(s->server); /* never started: no shutdown needed */
        s->server = NULL;
        serve_grpc_stop(s);
        return strata_set_error(STRATA_EIO, "grpc: cannot listen on %s", addr);
    }
    grpc_server_start(s->server);
    int rc = arm(s);
    if (rc == 0 && pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0)
        rc = strata_set_error(STRATA_ENOMEM, "grpc: cannot start the acceptor thread");
    s->acceptor_running = rc == 0;
    if (rc < 0) {
        serve_grpc_stop(s);
        return rc;
    }
    *out = s;
    return 0;
}

int serve_grpc_port(const struct serve_grpc *s) {
    return s->port;
}

void serve_grpc_stop(struct serve_grpc *s) {
    if (!s) return;
    if (s->server) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &g_tag_shutdown);
        grpc_server_cancel_all_calls(s->server);
        if (s->acceptor_running)
            pthread_join(s->acceptor, NULL);
        else
            for (;;) { /* arm()'s call, refused by the shutdown, then the notice */
                grpc_event ev =
                    grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
                if (ev.type != GRPC_OP_COMPLETE || ev.tag == &g_tag_shutdown) break;
                call_free(ev.tag);
            }
        pthread_mutex_lock(&s->mu);
        while (s->n_calls > 0)
            pthread_cond_wait(&s->idle, &s->mu);
        pthread_mutex_unlock(&s->mu);
        grpc_server_destroy(s->server);
    }
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
    grpc_shutdown();
}
