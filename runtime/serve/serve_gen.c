/* One generation behind an HTTP request (see serve_gen.h). */
#include "runtime/serve/serve_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/model/vl_prompt.h"

/* Renders the messages with the model's chat template (generation prompt on; thinking off
 * unless chat_template_kwargs.enable_thinking, as strata-client --chat) and tokenizes. */
static int encode_chat(struct serve_gen *g, struct tokenizer_ids *ids, struct serve_error *err) {
    struct chat_conversation conv;
    struct chat_options o = {1, g->params.enable_thinking ? CHAT_THINKING_ON : CHAT_THINKING_OFF,
                             0};
    char *text = NULL;
    size_t len = 0;
    if (!g->app->have_template)
        return serve_error_set(err, 400, "messages", "no_chat_template",
                               "the model has no chat template; use /v1/completions");
    /* Only the Qwen3-VL template renders image parts, and only a VL model has a vision
     * stage in front of its pipeline to take the files. */
    if (g->params.n_images && g->app->template_kind != CHAT_TEMPLATE_QWEN3_VL)
        return serve_error_set(err, 400, "messages",
                               g->params.n_videos ? "videos_not_supported" : "images_not_supported",
                               "the model '%s' is a text model: it takes no %s inputs",
                               g->app->model_id, g->params.n_videos ? "video" : "image");
    if (chat_conversation_from_json(&conv, g->params.messages_json) < 0)
        return serve_error_set(err, 400, "messages", "invalid_value", "%s", strata_last_error());
    int rc = chat_template_render(g->app->template_kind, conv.messages, conv.n, &o, &text, &len);
    chat_conversation_free(&conv);
    if (rc < 0)
        return serve_error_set(err, 400, "messages", "invalid_value", "%s", strata_last_error());
    rc = tokenizer_encode(g->app->tok, text, len, ids);
    free(text);
    if (rc < 0)
        return serve_error_set(err, 400, "messages", "invalid_value", "%s", strata_last_error());
    return 0;
}

/* Token ids given directly (gRPC): each must be one the tokenizer can decode, so the answer's
 * text and the pipeline's embedding rows are defined for the whole prompt. */
static int copy_prompt_ids(struct serve_gen *g, struct tokenizer_ids *ids,
                           struct serve_error *err) {
    int32_t n_ids = tokenizer_n_ids(g->app->tok);
    for (int i = 0; i < g->params.n_prompt_ids; i++)
        if (g->params.prompt_ids[i] < 0 || g->params.prompt_ids[i] >= n_ids)
            return serve_error_set(err, 400, "token_ids", "invalid_value",
                                   "token id %d (at %d) is outside the vocabulary [0, %d)",
                                   (int)g->params.prompt_ids[i], i, (int)n_ids);
    ids->ids = malloc((size_t)g->params.n_prompt_ids * sizeof(int32_t));
    if (!ids->ids) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    memcpy(ids->ids, g->params.prompt_ids, (size_t)g->params.n_prompt_ids * sizeof(int32_t));
    ids->n = (size_t)g->params.n_prompt_ids;
    return 0;
}

static int encode_prompt(struct serve_gen *g, struct tokenizer_ids *ids, struct serve_error *err) {
    if (g->params.kind == SERVE_CHAT) return encode_chat(g, ids, err);
    if (!g->params.prompt) return copy_prompt_ids(g, ids, err);
    if (tokenizer_encode(g->app->tok, g->params.prompt, strlen(g->params.prompt), ids) < 0)
        return serve_error_set(err, 400, "prompt", "invalid_value", "%s", strata_last_error());
    return 0;
}

/* The pipeline's KV holds prompt + answer: a request that cannot fit is the client's error. */
static int fit_max_tokens(struct serve_gen *g, int n_prompt, struct serve_error *err) {
    int room = g->app->max_seq - n_prompt;
    if (room < 1)
        return serve_error_set(err, 400, g->params.kind == SERVE_CHAT ? "messages" : "prompt",
                               "context_length_exceeded",
                               "the prompt has %d tokens; the pipeline holds %d", n_prompt,
                               g->app->max_seq);
    if (g->params.max_tokens == 0) g->params.max_tokens = room;
    if (g->params.max_tokens > room)
        return serve_error_set(err, 400, "max_tokens", "context_length_exceeded",
                               "%d prompt tokens + max_tokens %d exceed the pipeline's %d",
                               n_prompt, g->params.max_tokens, g->app->max_seq);
    return 0;
}

_Static_assert((int)SERVE_SPECULATE_OFF == (int)WIRE_SPECULATE_OFF &&
                   (int)SERVE_SPECULATE_NGRAM == (int)WIRE_SPECULATE_NGRAM &&
                   (int)SERVE_SPECULATE_DRAFT == (int)WIRE_SPECULATE_DRAFT &&
                   SERVE_MAX_SPECULATE_K == WIRE_SPECULATE_MAX_K,
               "the fronts' speculation values are the wire's");

static int submit(struct serve_gen *g, const struct tokenizer_ids *ids, struct serve_error *err) {
    struct stage_request req;
    memset(&req, 0, sizeof req);
    req.prompt = ids->ids;
    req.prompt_len = (int)ids->n;
    req.max_tokens = g->params.max_tokens;
    req.sampling.temperature = g->params.temperature;
    req.sampling.top_k = g->params.top_k;
    req.sampling.top_p = g->params.top_p;
    req.sampling.seed = g->params.seed;
    req.speculate = g->params.speculate;
    req.speculate_k = g->params.speculate_k;
    /* Image and video files go to the vision stage as they came (it decodes and encodes them,
     * and writes a video's timestamps into the prompt); the prompt holds one image or video pad
     * per file, in the same order. */
    uint8_t formats[VL_MAX_IMAGES];
    if (g->params.n_images > VL_MAX_IMAGES)
        return serve_error_set(err, 413, "messages", "too_many_images",
                               "more than %d images in one request", VL_MAX_IMAGES);
    for (int i = 0; i < g->params.n_images; i++) {
        static const uint8_t wire_of[] = {
            [SERVE_IMAGE_PNG] = WIRE_IMAGE_PNG, [SERVE_IMAGE_JPEG] = WIRE_IMAGE_JPEG,
            [SERVE_VIDEO_MP4] = WIRE_IMAGE_MP4, [SERVE_VIDEO_WEBM] = WIRE_IMAGE_WEBM};
        formats[i] = wire_of[g->params.image_formats[i] <= SERVE_VIDEO_WEBM
                                 ? g->params.image_formats[i]
                                 : 0];
    }
    if (g->params.n_images) {
        req.image_files = g->params.image_bytes;
        req.image_file_sizes = g->params.image_sizes;
        req.image_formats = formats;
        req.num_image_files = g->params.n_images;
    }
    int32_t eos[TOKENIZER_MAX_EOS];
    int n_eos = g->params.ignore_eos ? 0 : tokenizer_eos_ids(g->app->tok, eos);
    for (int i = 0; i < n_eos && req.num_stop_ids < REQUEST_MAX_STOP_IDS; i++)
        req.stop_ids[req.num_stop_ids++] = eos[i];
    g->t_submit = cli_now_sec();
    if (serve_engine_submit(g->app->engine, &g->job, &req) < 0)
        return serve_error_set(err, 503, NULL, "pipeline_unavailable",
                               "stage 0 cannot be reached: %s", strata_last_error());
    g->submitted = 1;
    return 0;
}

int serve_gen_start(struct serve_gen *g, struct serve_app *app, enum serve_kind kind,
                    const char *body, size_t len, struct serve_error *err) {
    struct serve_limits limits = {app->model_id, app->max_seq};
    struct serve_image_limits images = {app->max_image_bytes, app->max_images,
                                        app->max_video_bytes, app->max_videos};
    struct serve_params params;
    if (serve_params_parse_with(&params, kind, body, len, &limits, &images, err) < 0) {
        serve_params_free(&params);
        memset(g, 0, sizeof *g);
        return -1;
    }
    return serve_gen_begin(g, app, &params, err);
}

int serve_gen_begin(struct serve_gen *g, struct serve_app *app, struct serve_params *params,
                    struct serve_error *err) {
    static unsigned long counter;
    struct tokenizer_ids ids = {0};
    memset(g, 0, sizeof *g);
    g->app = app;
    g->params = *params; /* owned from here on */
    memset(params, 0, sizeof *params);
    enum serve_kind kind = g->params.kind;
    snprintf(g->id, sizeof g->id, "%s-%lx%04lx", kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long)time(NULL), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    g->info = (struct serve_reply_info){kind, g->id, (long)time(NULL), app->model_id};
    serve_text_init(&g->text, &g->params);
    int rc = tokenizer_stream_new(&g->stream, app->tok, 1);
    if (rc < 0) rc = serve_error_set(err, 500, NULL, NULL, "%s", strata_last_error());
    if (rc == 0) rc = encode_prompt(g, &ids, err);
    if (rc == 0) rc = fit_max_tokens(g, (int)ids.n, err);
    g->prompt_tokens = (int)ids.n;
    if (rc == 0) rc = submit(g, &ids, err);
    tokenizer_ids_free(&ids);
    if (rc == 0) {
        g->in_flight = 1;
        serve_metrics_in_flight(app->metrics, 1);
    }
    return rc;
}

/* Decodes tokens [seen, n) into the text; a stop string ends the answer. */
static int decode_new(struct serve_gen *g, int n, struct serve_error *err) {
    for (; g->seen < n && !g->finished; g->seen++) {
        const char *piece;
        size_t len;
        if (tokenizer_stream_push(g->stream, g->job.tokens[g->seen], &piece, &len) < 0)
            return serve_error_set(err, 500, NULL, NULL, "decode: %s", strata_last_error());
        int rc = serve_text_push(&g->text, piece, len);
        if (rc < 0) return serve_error_set(err, 500, NULL, NULL, "%s", strata_last_error());
        if (rc == 1) {
            g->seen++;
            g->finished = 1;
            g->finish = "stop";
        }
    }
    return 0;
}

static void record_latency(struct serve_gen *g, int before, int n) {
    double t = cli_now_sec();
    if (before == 0 && n > 0) serve_metrics_ttft(g->app->metrics, t - g->t_submit);
    if (before > 0 && n > before)
        serve_metrics_itl(g->app->metrics, (t - g->t_last) / (n - before));
    g->t_last = t;
}

int serve_gen_step(struct serve_gen *g, int slice_ms, struct serve_error *err) {
    if (g->finished) return 0;
    int done = 0, before = g->seen;
    int n = serve_engine_wait(g->app->engine, &g->job, g->seen, &done, slice_ms);
    if (n < 0) {
        /* Quiet for a slice: the caller checks its client; quiet too long is the pipeline's
         * fault. */
        g->idle_ms += slice_ms;
        if (g->idle_ms < g->app->token_timeout_ms) return 1;
        return serve_error_set(err, 504, NULL, "pipeline_timeout",
                               "no token from the pipeline in %d ms", g->idle_ms);
    }
    g->idle_ms = 0;
    /* EINVAL: stage 0 refused the request itself (e.g. a token id past the model's own
     * vocabulary, which the tokenizer's may exceed): the client's error, not the pipeline's. */
    /* EFORMAT on a request with images: the vision stage could not decode one (truncated,
     * corrupt); ERANGE naming a bad image request: one too large (a decompression bomb's
     * header, an extreme aspect ratio). The client's error too, not the pipeline's. */
    int bad_image =
        g->job.error_code == STRATA_EFORMAT ||
        (g->job.error_code == STRATA_ERANGE && strstr(g->job.error, "bad image request"));
    if (done && g->params.n_images && bad_image)
        return serve_error_set(err, 400, "messages",
                               g->params.n_videos ? "invalid_media" : "invalid_image",
                               "the vision stage refused %s: %s",
                               g->params.n_videos ? "a file" : "an image", g->job.error);
    /* EBUSY: stage 0's admission queue was full, or the request waited past its deadline:
     * busy, not broken; the client may retry (Retry-After). */
    if (done && g->job.error_code == STRATA_EBUSY)
        return serve_error_set(err, 429, NULL, "server_busy", "the pipeline is busy: %s",
                               g->job.error);
    if (done && g->job.error_code == STRATA_EINVAL)
        return serve_error_set(err, 400, NULL, "invalid_value",
                               "the pipeline refused the request: %s", g->job.error);
    if (done && g->job.error_code)
        return serve_error_set(err, 502, NULL, "pipeline_error", "the pipeline failed: %s",
                               g->job.error);
    record_latency(g, before, n);
    if (decode_new(g, n, err) < 0) return -1;
    if (!g->finished && done) {
        const char *piece;
        size_t len;
        if (tokenizer_stream_flush(g->stream, &piece, &len) == 0 &&
            serve_text_push(&g->text, piece, len) < 0)
            return serve_error_set(err, 500, NULL, NULL, "%s", strata_last_error());
        g->finished = 1;
        g->finish = g->job.finish == WIRE_FINISH_LENGTH ? "length" : "stop";
    }
    return 0;
}

/* The prompt as the model ran it when stage 0 said (an image's or video's pad expanded to its
 * rows, a video's timestamps written in: what vLLM counts), else as tokenized here. */
static int prompt_tokens(const struct serve_gen *g) {
    return g->job.prompt_tokens > 0 ? g->job.prompt_tokens : g->prompt_tokens;
}

struct serve_usage serve_gen_usage(const struct serve_gen *g) {
    return (struct serve_usage){prompt_tokens(g), g->seen, g->job.cached_tokens,
                                g->job.accepted_tokens, g->job.rejected_tokens};
}

void serve_gen_free(struct serve_gen *g) {
    if (g->submitted && !g->finished)
        strata_log(STRATA_LOG_INFO, "request %s (nonce %llu) abandoned after %d tokens: cancelled",
                   g->id, (unsigned long long)g->job.nonce, g->seen);
    if (g->submitted) serve_engine_release(g->app->engine, &g->job);
    if (g->in_flight) {
        serve_metrics_in_flight(g->app->metrics, -1);
        serve_metrics_tokens(g->app->metrics, prompt_tokens(g), g->job.cached_tokens, g->seen);
    }
    tokenizer_stream_free(g->stream);
    serve_text_free(&g->text);
    serve_params_free(&g->params);
    memset(g, 0, sizeof *g);
}
