/* The OpenAI-compatible HTTP front on libmicrohttpd (see serve_http.h). */
#include "runtime/serve/serve_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/serve/serve_console.h"
#include "runtime/serve/serve_ring.h"

struct serve_server {
    struct MHD_Daemon *daemon;
    struct serve_app *app;
    int port;
};

/* Per HTTP request: the body as it uploads (dropped past the cap, answered 413). */
struct conn_ctx {
    struct serve_buf body;
    int too_large;
};

/* How often a handler waiting for tokens looks whether its client is still there. */
#define SERVE_POLL_MS 250

/* A streamed answer, owned by its libmicrohttpd response. */
struct stream_ctx {
    struct serve_gen gen;
    int fd;               /* the client's socket, only polled (libmicrohttpd owns it) */
    struct serve_buf out; /* SSE bytes not yet handed to libmicrohttpd, from off */
    size_t off;
    int role_sent, done;
};

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info ? info->connect_fd : -1;
}

/* 1 when the client closed or reset its connection. A client sends nothing while it waits
 * for an answer, so readable-with-hangup is the only signal that it left before the answer
 * is written (libmicrohttpd notices only when a write fails). */
static int client_gone(int fd) {
    struct pollfd p = {fd, POLLRDHUP, 0};
    if (fd < 0 || poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static enum MHD_Result send_body(struct MHD_Connection *c, struct serve_app *app, int status,
                                 const char *type, const char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    if (status == 429) /* busy: stage 0's admission queue was full or too slow */
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    serve_metrics_request(app->metrics, status);
    return ret;
}

/* Sends json (freed here; NULL answers a bare 500). */
static enum MHD_Result send_json(struct MHD_Connection *c, struct serve_app *app, int status,
                                 char *json) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    enum MHD_Result ret = json ? send_body(c, app, status, "application/json", json, strlen(json))
                               : send_body(c, app, 500, "application/json", oom, strlen(oom));
    free(json);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, struct serve_app *app,
                                  const struct serve_error *err) {
    if (err->http_status >= 500)
        strata_log(STRATA_LOG_WARN, "answering %d: %s", err->http_status, err->message);
    return send_json(c, app, err->http_status, serve_json_error(err));
}

/* Appends one chunk with the text in [len] (a NUL-terminated copy: cJSON takes C strings). */
static int add_text_chunk(struct stream_ctx *s, const char *text, size_t len, int with_role,
                          const char *finish) {
    char *copy = strndup(text, len);
    if (!copy) return strata_set_error(STRATA_ENOMEM, "serve: no memory for a chunk");
    int rc =
        serve_sse_event(&s->out, serve_json_chunk(&s->gen.info, with_role, copy, finish, NULL));
    free(copy);
    return rc;
}

/* Produces the next SSE events: the role chunk first, then waits for tokens; at the end the
 * finish chunk (with usage), the usage-only chunk when asked for, and [DONE]. A pipeline
 * failure becomes an error event (the 200 status is already sent). */
static int stream_fill(struct stream_ctx *s) {
    struct serve_gen *g = &s->gen;
    struct serve_error err;
    const char *text;
    size_t len;
    if (!s->role_sent) {
        s->role_sent = 1;
        return add_text_chunk(s, "", 0, g->info.kind == SERVE_CHAT, NULL);
    }
    int rc = serve_gen_step(g, SERVE_POLL_MS, &err);
    if (rc < 0) {
        strata_log(STRATA_LOG_WARN, "stream %s: %s", g->id, err.message);
        s->done = 1;
        return serve_sse_event(&s->out, serve_json_error(&err));
    }
    if (rc == 1 && client_gone(s->fd)) return strata_set_error(STRATA_ECLOSED, "client gone");
    if (rc == 1) return 0;
    serve_text_take(&g->text, g->finished, &text, &len);
    rc = len ? add_text_chunk(s, text, len, 0, NULL) : 0;
    if (rc < 0 || !g->finished) return rc;
    struct serve_usage usage = serve_gen_usage(g);
    rc = serve_sse_event(&s->out, serve_json_chunk(&g->info, 0, NULL, g->finish, &usage));
    if (rc == 0 && g->params.include_usage)
        rc = serve_sse_event(&s->out, serve_json_chunk(&g->info, 0, NULL, NULL, &usage));
    if (rc == 0) rc = serve_sse_done(&s->out);
    s->done = 1;
    return rc;
}

/* libmicrohttpd's content reader: may block (one thread per connection). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct stream_ctx *s = cls;
    (void)pos;
    while (s->off == s->out.len) {
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        s->out.len = s->off = 0;
        if (stream_fill(s) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->out.len - s->off < max ? s->out.len - s->off : max;
    memcpy(buf, s->out.data + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

/* Called when the response is done with: after the last byte, or when the client went
 * away mid-stream, in which case serve_gen_free cancels the request at the pipeline. */
static void stream_free(void *cls) {
    struct stream_ctx *s = cls;
    serve_gen_free(&s->gen);
    serve_buf_free(&s->out);
    free(s);
}

static enum MHD_Result start_stream(struct MHD_Connection *c, struct serve_app *app,
                                    struct stream_ctx *s) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    serve_metrics_request(app->metrics, MHD_HTTP_OK);
    return ret;
}

/* The whole answer at once: this connection's thread waits for it. */
static enum MHD_Result answer_whole(struct MHD_Connection *c, struct serve_app *app,
                                    struct serve_gen *g) {
    struct serve_error err;
    int fd = connection_fd(c);
    while (!g->finished) {
        int rc = serve_gen_step(g, SERVE_POLL_MS, &err);
        if (rc < 0) return send_error(c, app, &err);
        /* Nobody to answer: serve_gen_free cancels the request. */
        if (client_gone(fd)) return MHD_NO;
    }
    struct serve_usage usage = serve_gen_usage(g);
    const char *text = g->text.text.data ? g->text.text.data : "";
    return send_json(c, app, MHD_HTTP_OK, serve_json_answer(&g->info, text, g->finish, &usage));
}

static enum MHD_Result generate(struct MHD_Connection *c, struct serve_app *app,
                                enum serve_kind kind, const struct conn_ctx *ctx) {
    struct serve_error err;
    struct stream_ctx *s = calloc(1, sizeof *s);
    if (!s) return MHD_NO;
    const char *body = ctx->body.data ? ctx->body.data : "";
    if (serve_gen_start(&s->gen, app, kind, body, ctx->body.len, &err) < 0) {
        stream_free(s);
        return send_error(c, app, &err);
    }
    s->fd = connection_fd(c);
    if (s->gen.params.stream) return start_stream(c, app, s);
    enum MHD_Result ret = answer_whole(c, app, &s->gen);
    stream_free(s);
    return ret;
}

static enum MHD_Result answer_health(struct MHD_Connection *c, struct serve_app *app) {
    struct serve_error err;
    if (serve_engine_ping(app->engine, 2000) == 0)
        return send_json(c, app, MHD_HTTP_OK, strdup("{\"status\":\"ok\"}"));
    serve_error_set(&err, 503, NULL, "pipeline_unavailable", "stage 0 does not answer: %s",
                    strata_last_error());
    return send_json(c, app, 503, serve_json_error(&err));
}

/* GET /v1/stages[?timeout_ms=N]: the stages from a describe round the ring; when the ring
 * cannot answer, 503 naming the stage or link that is down, with the last whole ring and each
 * stage's state from serve_ring's probes (the console turns a stage red from these). The
 * default wait is past the stages' own bound, so the error is stage 0's; the console asks
 * for less, to redraw within a second or two. */
static enum MHD_Result answer_stages(struct MHD_Connection *c, struct serve_app *app) {
    struct serve_error err;
    struct serve_stage_status status[CLIENT_MAX_STAGES];
    int timeout_ms = SERVE_DESCRIBE_TIMEOUT_MS;
    const char *arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "timeout_ms");
    if (arg && cli_parse_int(arg, 100, SERVE_DESCRIBE_TIMEOUT_MS, &timeout_ms) < 0) {
        serve_error_set(&err, 400, "timeout_ms", "invalid_value",
                        "timeout_ms is '%s'; allowed 100..%d", arg, SERVE_DESCRIBE_TIMEOUT_MS);
        return send_error(c, app, &err);
    }
    struct client_describe *d = malloc(sizeof *d);
    if (!d) return send_json(c, app, 500, NULL);
    int rc = serve_ring_describe(app->ring, app->engine, timeout_ms, d, status);
    if (rc == 0) {
        char *json = serve_json_stages(d, NULL, NULL);
        free(d);
        return send_json(c, app, MHD_HTTP_OK, json);
    }
    serve_error_set(&err, 503, NULL, "pipeline_unavailable", "cannot describe the pipeline: %s",
                    strata_last_error());
    char *json = serve_json_stages(d, status, &err);
    free(d);
    return send_json(c, app, 503, json);
}

static enum MHD_Result answer_metrics(struct MHD_Connection *c, struct serve_app *app) {
    struct serve_buf out = {0};
    /* Counted before rendering, so a scrape sees itself. */
    serve_metrics_request(app->metrics, MHD_HTTP_OK);
    /* The per-stage gauges from a describe round the ring, bounded so a broken ring costs a
     * scrape at most this long (then strata_serve_stages_up 0). */
    struct client_describe *d = malloc(sizeof *d);
    if (d && serve_engine_describe(app->engine, d, SERVE_METRICS_DESCRIBE_MS) < 0) {
        free(d);
        d = NULL;
    }
    int rc = serve_metrics_render(app->metrics, &out);
    if (rc == 0) rc = serve_metrics_render_stages(d, &out);
    free(d);
    if (rc < 0) {
        serve_buf_free(&out);
        return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(out.len, out.data, MHD_RESPMEM_MUST_COPY);
    serve_buf_free(&out);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* A console file, under the console's Content-Security-Policy. */
static enum MHD_Result send_asset(struct MHD_Connection *c, struct serve_app *app,
                                  const struct serve_asset *a, const char *type) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer((size_t)a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, "Content-Security-Policy", SERVE_CONSOLE_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    serve_metrics_request(app->metrics, MHD_HTTP_OK);
    return ret;
}

static enum MHD_Result route(struct MHD_Connection *c, struct serve_app *app, const char *url,
                             const char *method, const struct conn_ctx *ctx) {
    struct serve_error err;
    int post = !strcmp(method, MHD_HTTP_METHOD_POST), get = !strcmp(method, MHD_HTTP_METHOD_GET);
    int chat = !strcmp(url, "/v1/chat/completions"), completion = !strcmp(url, "/v1/completions");
    if (chat || completion) {
        if (!post)
            return send_error(c, app,
                              (serve_error_set(&err, 405, NULL, "method_not_allowed",
                                               "%s %s: use POST", method, url),
                               &err));
        if (ctx->too_large)
            return send_error(
                c, app,
                (serve_error_set(&err, 413, NULL, "request_too_large", "the body is over %ld bytes",
                                 app->max_body > 0 ? app->max_body : SERVE_MAX_BODY),
                 &err));
        return generate(c, app, chat ? SERVE_CHAT : SERVE_COMPLETION, ctx);
    }
    int models = !strcmp(url, "/v1/models"), health = !strcmp(url, "/health"),
        metrics = !strcmp(url, "/metrics"), stages = !strcmp(url, "/v1/stages");
    if ((models || health || metrics || stages) && !get)
        return send_error(
            c, app,
            (serve_error_set(&err, 405, NULL, "method_not_allowed", "%s %s: use GET", method, url),
             &err));
    if (models)
        return send_json(c, app, MHD_HTTP_OK, serve_json_models(app->model_id, app->created));
    if (health) return answer_health(c, app);
    if (metrics) return answer_metrics(c, app);
    if (stages) return answer_stages(c, app);
    const char *type;
    const struct serve_asset *asset = app->console ? serve_console_find(url, &type) : NULL;
    if (asset && !get && strcmp(method, MHD_HTTP_METHOD_HEAD)) /* HEAD: headers only */
        return send_error(
            c, app,
            (serve_error_set(&err, 405, NULL, "method_not_allowed", "%s %s: use GET", method, url),
             &err));
    if (asset) return send_asset(c, app, asset, type);
    serve_error_set(&err, 404, NULL, "not_found", "no route for %s %s", method, url);
    return send_error(c, app, &err);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    struct conn_ctx *ctx = *con_cls;
    (void)version;
    if (!ctx) {
        ctx = calloc(1, sizeof *ctx);
        *con_cls = ctx;
        return ctx ? MHD_YES : MHD_NO;
    }
    if (*upload_size) {
        const struct serve_app *app = cls;
        const long limit = app->max_body > 0 ? app->max_body : SERVE_MAX_BODY;
        if (ctx->body.len + *upload_size > (size_t)limit)
            ctx->too_large = 1;
        else if (!ctx->too_large && serve_buf_append(&ctx->body, upload_data, *upload_size) < 0)
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c, cls, url, method, ctx);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
    struct conn_ctx *ctx = *con_cls;
    (void)cls;
    (void)c;
    (void)code;
    if (!ctx) return;
    serve_buf_free(&ctx->body);
    free(ctx);
    *con_cls = NULL;
}

/* libmicrohttpd's own diagnostics go to the operator log, never straight to stderr. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char line[512];
    (void)cls;
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    strata_log(STRATA_LOG_WARN, "http: %s", line);
}

int serve_server_start(struct serve_server **out, struct serve_app *app, const char *host,
                       int port) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return strata_set_error(STRATA_EINVAL, "serve: --host must be an IPv4 address, not '%s'",
                                host);
    struct serve_server *s = calloc(1, sizeof *s);
    if (!s) return strata_set_error(STRATA_ENOMEM, "serve: no memory");
    s->app = app;
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
        (uint16_t)port, NULL, NULL, on_request, app, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, app,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        return strata_set_error(STRATA_EIO, "serve: cannot listen on %s:%d", host, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : port;
    *out = s;
    return 0;
}

int serve_server_port(const struct serve_server *s) {
    return s->port;
}

void serve_server_stop(struct serve_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s);
}
