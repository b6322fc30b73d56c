/* One generation behind a request: parse the body, render the chat template (or take the
 * raw prompt or its token ids), tokenize, submit to the pipeline, then decode the streamed
 * tokens into text cut at stop strings. Used by serve_http.c for both whole and streamed
 * answers, and by serve_grpc.c for the gRPC streams. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_GEN_H
#define STRATA_RUNTIME_SERVE_SERVE_GEN_H

#include "runtime/serve/serve_engine.h"
#include "runtime/serve/serve_json.h"
#include "runtime/serve/serve_metrics.h"
#include "runtime/serve/serve_request.h"
#include "runtime/serve/serve_text.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

/* What every request shares (read-only after start, except the engine and metrics). */
struct serve_ring;
struct serve_app {
    struct serve_engine *engine;
    struct serve_ring *ring; /* the ring as last seen (GET /v1/stages, the console) */
    struct serve_metrics *metrics;
    const struct tokenizer *tok;
    enum chat_template_kind template_kind;
    int have_template;
    const char *model_id;
    int max_seq;          /* the pipeline's KV positions per request: prompt + answer */
    int token_timeout_ms; /* longest wait for the next token */
    long created;         /* for /v1/models */
    long max_image_bytes; /* largest decoded image_url image; 0 = the default */
    int max_images;       /* images per chat request; 0 = the default */
    long max_video_bytes; /* largest decoded video_url video; 0 = the default */
    long max_body;        /* largest request body / gRPC message; 0 = SERVE_MAX_BODY */
    int max_videos;       /* videos per chat request; 0 = the default */
    int console;          /* serve the web console's pages (GET /, /pipeline, /console/...) */
};

struct serve_gen {
    struct serve_app *app;
    struct serve_params params;
    struct serve_job job;
    struct tokenizer_stream *stream;
    struct serve_text text;
    struct serve_reply_info info;
    char id[48];
    int prompt_tokens, seen, submitted, in_flight;
    int idle_ms;        /* waited since the last token */
    int finished;       /* no more text will come */
    const char *finish; /* "stop" | "length" once finished */
    double t_submit, t_last;
};

/* Parses, tokenizes and submits. -1 with *err (4xx for the request, 503 when stage 0 cannot
 * be reached). serve_gen_free afterwards either way. */
int serve_gen_start(struct serve_gen *g, struct serve_app *app, enum serve_kind kind,
                    const char *body, size_t len, struct serve_error *err);

/* The same from parameters another front decoded (the gRPC one): takes ownership of
 * *params (left zeroed), renders / tokenizes / takes the prompt ids, and submits. */
int serve_gen_begin(struct serve_gen *g, struct serve_app *app, struct serve_params *params,
                    struct serve_error *err);

/* Waits up to slice_ms for the next tokens and decodes them (sets finished/finish when the
 * answer is complete): 0 on progress, 1 when nothing came in the slice (so the caller can
 * check whether its HTTP client is still there), -1 with *err when the pipeline failed or
 * stayed quiet for token_timeout_ms. */
int serve_gen_step(struct serve_gen *g, int slice_ms, struct serve_error *err);

/* Releases the request (cancelling it at the pipeline when it is not finished: the client
 * went away) and frees everything. */
void serve_gen_free(struct serve_gen *g);

struct serve_usage serve_gen_usage(const struct serve_gen *g);

#endif
