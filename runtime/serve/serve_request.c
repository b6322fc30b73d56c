/* Request-body parsing for the OpenAI-compatible front (see serve_request.h). */
#include "runtime/serve/serve_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_error_set(struct serve_error *err, int http_status, const char *param, const char *code,
                    const char *fmt, ...) {
    va_list ap;
    memset(err, 0, sizeof *err);
    err->http_status = http_status;
    snprintf(err->type, sizeof err->type, "%s",
             http_status >= 500   ? "server_error"
             : http_status == 429 ? "rate_limit_error" /* busy: OpenAI's type for a 429 */
                                  : "invalid_request_error");
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    snprintf(err->code, sizeof err->code, "%s", code ? code : "");
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

void serve_params_free(struct serve_params *p) {
    free(p->messages_json);
    free(p->prompt);
    free(p->prompt_ids);
    free(p->image_bytes);
    free(p->image_sizes);
    free(p->image_formats);
    p->messages_json = p->prompt = NULL;
    p->prompt_ids = NULL;
    p->n_prompt_ids = 0;
    p->image_bytes = NULL;
    p->image_sizes = NULL;
    p->image_formats = NULL;
    p->n_images = p->n_videos = 0;
}

void serve_params_defaults(struct serve_params *p, enum serve_kind kind) {
    p->kind = kind;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
}

int serve_params_check(const struct serve_params *p, const struct serve_limits *limits,
                       struct serve_error *err) {
    if (!(p->temperature >= 0 && p->temperature <= SERVE_MAX_TEMPERATURE))
        return serve_error_set(err, 400, "temperature", "invalid_value",
                               "'temperature' is %g; allowed [0, %g]", p->temperature,
                               SERVE_MAX_TEMPERATURE);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return serve_error_set(err, 400, "top_p", "invalid_value", "'top_p' is %g; allowed (0, 1]",
                               p->top_p);
    if (p->top_k < 0 || p->top_k > SERVE_MAX_TOP_K)
        return serve_error_set(err, 400, "top_k", "invalid_value", "'top_k' is %d; allowed 0..%d",
                               p->top_k, SERVE_MAX_TOP_K);
    if (p->speculate < SERVE_SPECULATE_DEFAULT || p->speculate > SERVE_SPECULATE_DRAFT)
        return serve_error_set(err, 400, "speculate", "invalid_value",
                               "'speculate' is %d; allowed off, ngram or draft", p->speculate);
    if (p->speculate_k < 0 || p->speculate_k > SERVE_MAX_SPECULATE_K)
        return serve_error_set(err, 400, "speculate_k", "invalid_value",
                               "'speculate_k' is %d; allowed 1..%d (0: the pipeline's)",
                               p->speculate_k, SERVE_MAX_SPECULATE_K);
    if (p->max_tokens < 0 || p->max_tokens > limits->max_tokens)
        return serve_error_set(err, 400, "max_tokens", "invalid_value",
                               "'max_tokens' is %d; allowed 1..%d (the pipeline's limit; 0 = "
                               "the room left)",
                               p->max_tokens, limits->max_tokens);
    return 0;
}

/* A number field in [lo, hi] (open at lo when lo_open); absent leaves *out. */
static int get_number(const cJSON *root, const char *name, double lo, int lo_open, double hi,
                      double *out, struct serve_error *err) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!item || cJSON_IsNull(item)) return 0;
    if (!cJSON_IsNumber(item) || isnan(item->valuedouble))
        return serve_error_set(err, 400, name, "invalid_type", "'%s' must be a number", name);
    double v = item->valuedouble;
    if (v > hi || v < lo || (lo_open && v == lo))
        return serve_error_set(err, 400, name, "invalid_value", "'%s' is %g; allowed %s%g, %g]",
                               name, v, lo_open ? "(" : "[", lo, hi);
    *out = v;
    return 0;
}

static int get_bool(const cJSON *root, const char *name, int *out, struct serve_error *err) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!item || cJSON_IsNull(item)) return 0;
    if (!cJSON_IsBool(item))
        return serve_error_set(err, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(item);
    return 0;
}

static int add_stop(struct serve_params *p, const cJSON *s, struct serve_error *err) {
    if (!cJSON_IsString(s))
        return serve_error_set(err, 400, "stop", "invalid_type", "'stop' entries must be strings");
    return serve_params_add_stop(p, s->valuestring, err);
}

int serve_params_add_stop(struct serve_params *p, const char *s, struct serve_error *err) {
    size_t n = strlen(s);
    if (n == 0) return 0; /* an empty stop string would end every answer at once: ignored */
    if (n > SERVE_MAX_STOP_LEN || p->n_stops >= SERVE_MAX_STOPS)
        return serve_error_set(err, 400, "stop", "invalid_value",
                               "at most %d stop strings of at most %d bytes", SERVE_MAX_STOPS,
                               SERVE_MAX_STOP_LEN);
    memcpy(p->stops[p->n_stops++], s, n + 1);
    return 0;
}

/* "stop": a string or a list of strings. */
static int get_stops(struct serve_params *p, const cJSON *root, struct serve_error *err) {
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop"), *s;
    if (!stop || cJSON_IsNull(stop)) return 0;
    if (!cJSON_IsArray(stop)) return add_stop(p, stop, err);
    cJSON_ArrayForEach(s, stop) {
        if (add_stop(p, s, err) < 0) return -1;
    }
    return 0;
}

/* max_tokens (or its newer name max_completion_tokens): an integer in 1..limit. */
static int get_max_tokens(struct serve_params *p, const cJSON *root,
                          const struct serve_limits *limits, struct serve_error *err) {
    const char *name = "max_tokens";
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!item || cJSON_IsNull(item)) {
        name = "max_completion_tokens";
        item = cJSON_GetObjectItemCaseSensitive(root, name);
    }
    if (!item || cJSON_IsNull(item)) return 0;
    if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble))
        return serve_error_set(err, 400, name, "invalid_type", "'%s' must be an integer", name);
    if (item->valuedouble < 1 || item->valuedouble > limits->max_tokens)
        return serve_error_set(err, 400, name, "invalid_value",
                               "'%s' is %g; allowed 1..%d (the pipeline's limit)", name,
                               item->valuedouble, limits->max_tokens);
    p->max_tokens = (int)item->valuedouble;
    return 0;
}

static int get_sampling(struct serve_params *p, const cJSON *root,
                        const struct serve_limits *limits, struct serve_error *err) {
    double t = p->temperature, tp = p->top_p, tk = 0, seed = 0;
    if (get_number(root, "temperature", 0, 0, SERVE_MAX_TEMPERATURE, &t, err) < 0 ||
        get_number(root, "top_p", 0, 1, 1, &tp, err) < 0 ||
        get_number(root, "top_k", -1, 0, SERVE_MAX_TOP_K, &tk, err) < 0 ||
        get_number(root, "seed", -9.2e18, 0, 1.8e19, &seed, err) < 0 ||
        get_max_tokens(p, root, limits, err) < 0 || get_stops(p, root, err) < 0 ||
        get_bool(root, "stream", &p->stream, err) < 0 ||
        get_bool(root, "ignore_eos", &p->ignore_eos, err) < 0) /* vLLM's and llama-server's */
        return -1;
    p->temperature = (float)t;
    p->top_p = (float)tp;
    p->top_k = tk > 0 ? (int)tk : 0;
    p->seed = seed < 0 ? (uint64_t)(int64_t)seed : (uint64_t)seed;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && cJSON_IsObject(so) && get_bool(so, "include_usage", &p->include_usage, err) < 0)
        return -1;
    /* Speculative decoding (an extension, like top_k): "off" or "ngram", and drafts per step. */
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(root, "speculate");
    if (spec && !cJSON_IsNull(spec)) {
        if (!cJSON_IsString(spec) ||
            (strcmp(spec->valuestring, "off") && strcmp(spec->valuestring, "ngram") &&
             strcmp(spec->valuestring, "draft")))
            return serve_error_set(err, 400, "speculate", "invalid_value",
                                   "'speculate' must be \"off\", \"ngram\" or \"draft\"");
        p->speculate = !strcmp(spec->valuestring, "ngram")   ? SERVE_SPECULATE_NGRAM
                       : !strcmp(spec->valuestring, "draft") ? SERVE_SPECULATE_DRAFT
                                                             : SERVE_SPECULATE_OFF;
    }
    double sk = 0;
    if (get_number(root, "speculate_k", 1, 0, SERVE_MAX_SPECULATE_K, &sk, err) < 0) return -1;
    if (sk != floor(sk))
        return serve_error_set(err, 400, "speculate_k", "invalid_type",
                               "'speculate_k' must be an integer");
    p->speculate_k = (int)sk;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && cJSON_IsObject(kw) && get_bool(kw, "enable_thinking", &p->enable_thinking, err) < 0)
        return -1;
    return 0;
}

/* The format of a media file by its first bytes: images PNG / JPEG, videos MP4 / MOV
 * ("ftyp" box) and Matroska / WebM (EBML); 0 when it is none of its kind's. */
static uint8_t media_format(const uint8_t *d, size_t len, int video) {
    if (video)
        return len >= 12 && !memcmp(d + 4, "ftyp", 4)          ? SERVE_VIDEO_MP4
               : len >= 4 && !memcmp(d, "\x1a\x45\xdf\xa3", 4) ? SERVE_VIDEO_WEBM
                                                               : 0;
    return len >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8) ? SERVE_IMAGE_PNG
           : len >= 3 && !memcmp(d, "\xff\xd8\xff", 3)    ? SERVE_IMAGE_JPEG
                                                          : 0;
}

static long max_bytes_of(const struct serve_image_limits *limits, int video) {
    if (video)
        return limits->max_video_bytes > 0 ? limits->max_video_bytes
                                           : SERVE_DEFAULT_MAX_VIDEO_BYTES;
    return limits->max_image_bytes > 0 ? limits->max_image_bytes : SERVE_DEFAULT_MAX_IMAGE_BYTES;
}

static int add_media(struct serve_params *p, const uint8_t *data, size_t len, int video,
                     const struct serve_image_limits *limits, const char *param,
                     struct serve_error *err) {
    const char *what = video ? "video" : "image";
    long max_bytes = max_bytes_of(limits, video);
    int n_kind = video ? p->n_videos : p->n_images - p->n_videos;
    int max_n = video ? (limits->max_videos > 0 ? limits->max_videos : SERVE_DEFAULT_MAX_VIDEOS)
                      : (limits->max_images > 0 ? limits->max_images : SERVE_DEFAULT_MAX_IMAGES);
    uint8_t format = media_format(data, len, video);
    if (n_kind >= max_n)
        return serve_error_set(err, 413, param, video ? "too_many_videos" : "too_many_images",
                               "more than %d %ss in one request", max_n, what);
    if ((long)len > max_bytes)
        return serve_error_set(err, 413, param, video ? "video_too_large" : "image_too_large",
                               "%s %d is %zu bytes; the limit is %ld", what, n_kind + 1, len,
                               max_bytes);
    if (!format)
        return serve_error_set(err, 400, param,
                               video ? "unsupported_video_format" : "unsupported_image_format",
                               video ? "video %d is neither MP4 nor WebM (by its first bytes)"
                                     : "image %d is neither PNG nor JPEG (by its first bytes)",
                               n_kind + 1);
    size_t total = 0;
    for (int i = 0; i < p->n_images; i++)
        total += p->image_sizes[i];
    uint8_t *bytes = realloc(p->image_bytes, total + len);
    if (!bytes) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    p->image_bytes = bytes;
    uint32_t *sizes = realloc(p->image_sizes, (size_t)(p->n_images + 1) * sizeof *sizes);
    if (!sizes) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    p->image_sizes = sizes;
    uint8_t *formats = realloc(p->image_formats, (size_t)(p->n_images + 1));
    if (!formats) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    p->image_formats = formats;
    memcpy(bytes + total, data, len);
    sizes[p->n_images] = (uint32_t)len;
    formats[p->n_images++] = format;
    p->n_videos += video;
    return 0;
}

int serve_params_add_image(struct serve_params *p, const uint8_t *data, size_t len,
                           const struct serve_image_limits *limits, const char *param,
                           struct serve_error *err) {
    return add_media(p, data, len, 0, limits, param, err);
}

int serve_params_add_video(struct serve_params *p, const uint8_t *data, size_t len,
                           const struct serve_image_limits *limits, const char *param,
                           struct serve_error *err) {
    return add_media(p, data, len, 1, limits, param, err);
}

/* Decodes an RFC 2397 data URI with a base64 payload ("data:image/png;base64,...",
 * "data:video/mp4;base64,...") and adds the file. Anything else is refused: the server never
 * fetches a URL. The payload is decoded by OpenSSL (EVP_DecodeBlock, RFC 4648 base64: padded,
 * no line breaks). */
static int add_data_uri(struct serve_params *p, const char *url, int video,
                        const struct serve_image_limits *limits, struct serve_error *err) {
    const char *param = "messages", *field = video ? "video_url" : "image_url";
    if (strncmp(url, "data:", 5))
        return serve_error_set(err, 400, param, "unsupported_url",
                               video ? "video_url must be a data URI (data:video/mp4;base64,... "
                                       "or data:video/webm;base64,...): the server fetches no URLs"
                                     : "image_url must be a data URI (data:image/png;base64,... or "
                                       "data:image/jpeg;base64,...): the server fetches no URLs");
    const char *comma = strchr(url, ',');
    size_t head = comma ? (size_t)(comma - url) : 0;
    if (!comma || head < 12 || strncmp(comma - 7, ";base64", 7) ||
        strncmp(url + 5, video ? "video/" : "image/", 6))
        return serve_error_set(err, 400, param, video ? "invalid_video_url" : "invalid_image_url",
                               video ? "video_url must be data:video/<mp4|webm>;base64,<data>"
                                     : "image_url must be data:image/<png|jpeg>;base64,<data>");
    const char *mime = url + 5, *semi = strchr(mime, ';');
    size_t mlen = (size_t)(semi - mime);
#define MIME_IS(s) (mlen == sizeof(s) - 1 && !strncmp(mime, s, sizeof(s) - 1))
    int known = video ? MIME_IS("video/mp4") || MIME_IS("video/webm") || MIME_IS("video/quicktime")
                      : MIME_IS("image/png") || MIME_IS("image/jpeg") || MIME_IS("image/jpg");
#undef MIME_IS
    if (!known)
        return serve_error_set(
            err, 400, param, video ? "unsupported_video_format" : "unsupported_image_format",
            "%s media type '%.*s': only %s", field, (int)(mlen < 40 ? mlen : 40), mime,
            video ? "video/mp4 and video/webm" : "image/png and image/jpeg");
    const char *b64 = comma + 1;
    size_t n = strlen(b64),
           pad = n >= 1 && b64[n - 1] == '=' ? 1 + (n >= 2 && b64[n - 2] == '=') : 0;
    if (n == 0 || n % 4 || n > (size_t)INT32_MAX || strcspn(b64, "=") < n - pad)
        return serve_error_set(err, 400, param, "invalid_base64",
                               "%s data is not padded base64 (%zu characters)", field, n);
    long max_bytes = max_bytes_of(limits, video);
    size_t len = n / 4 * 3 - pad;
    if ((long)len > max_bytes) /* refused before decoding: no buffer for it */
        return serve_error_set(err, 413, param, video ? "video_too_large" : "image_too_large",
                               "%s %d is %zu bytes; the limit is %ld", video ? "video" : "image",
                               (video ? p->n_videos : p->n_images - p->n_videos) + 1, len,
                               max_bytes);
    unsigned char *buf = malloc(n / 4 * 3 + 1);
    if (!buf) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    int got = EVP_DecodeBlock(buf, (const unsigned char *)b64, (int)n);
    int rc = got != (int)(n / 4 * 3) ? serve_error_set(err, 400, param, "invalid_base64",
                                                       "%s data is not valid base64", field)
                                     : add_media(p, buf, len, video, limits, param, err);
    free(buf);
    return rc;
}

/* One content part: an image_url / video_url part is decoded into p's files and rewritten to
 * {"type":"image"} / {"type":"video"}, which chat_conversation_from_json renders as one image /
 * video pad (so the rendered messages never carry the bytes). video_url is vLLM's part for
 * Qwen3-VL video. Other media are refused. */
static int take_part(struct serve_params *p, cJSON *part, const struct serve_image_limits *limits,
                     struct serve_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    for (int video = 0; video < 2; video++) {
        const char *key = video ? "video_url" : "image_url";
        cJSON *u = cJSON_GetObjectItemCaseSensitive(part, key);
        if (strcmp(t, key) && !u) continue;
        /* {"url": "..."} as OpenAI sends it, or the bare string some clients send. */
        const cJSON *url = cJSON_IsObject(u) ? cJSON_GetObjectItemCaseSensitive(u, "url") : u;
        if (!cJSON_IsString(url))
            return serve_error_set(err, 400, "messages",
                                   video ? "invalid_video_url" : "invalid_image_url",
                                   "a %s part needs %s.url (a data URI string)", key, key);
        if (add_data_uri(p, url->valuestring, video, limits, err) < 0) return -1;
        cJSON_DeleteItemFromObjectCaseSensitive(part, key);
        cJSON_DeleteItemFromObjectCaseSensitive(part, "type");
        if (!cJSON_AddStringToObject(part, "type", video ? "video" : "image"))
            return serve_error_set(err, 500, NULL, NULL, "out of memory");
        return 0;
    }
    if (!strcmp(t, "image") || !strcmp(t, "video") || !strcmp(t, "input_audio") ||
        cJSON_HasObjectItem(part, "image") || cJSON_HasObjectItem(part, "video"))
        return serve_error_set(err, 400, "messages", "unsupported_content",
                               "content part type '%s': only text, image_url and video_url (data "
                               "URIs) parts are supported",
                               t[0] ? t : "image");
    return 0;
}

static int get_messages(struct serve_params *p, const cJSON *root,
                        const struct serve_image_limits *limits, struct serve_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *m;
    if (!msgs) return serve_error_set(err, 400, "messages", "missing", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return serve_error_set(err, 400, "messages", "invalid_value",
                               "'messages' must be a non-empty array");
    cJSON_ArrayForEach(m, msgs) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
        if (!cJSON_IsObject(m))
            return serve_error_set(err, 400, "messages", "invalid_type",
                                   "every message must be an object");
        if (!cJSON_IsArray(content)) continue;
        cJSON_ArrayForEach(part, content) {
            if (cJSON_IsObject(part) && take_part(p, part, limits, err) < 0) return -1;
        }
    }
    p->messages_json = cJSON_PrintUnformatted(msgs);
    if (!p->messages_json) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    return 0;
}

static int get_prompt(struct serve_params *p, const cJSON *root, struct serve_error *err) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!prompt) return serve_error_set(err, 400, "prompt", "missing", "'prompt' is required");
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1)
        prompt = cJSON_GetArrayItem(prompt, 0); /* ["text"]: one prompt, as clients send */
    if (!cJSON_IsString(prompt) || !prompt->valuestring[0])
        return serve_error_set(err, 400, "prompt", "invalid_value",
                               "'prompt' must be a non-empty string");
    p->prompt = strdup(prompt->valuestring);
    if (!p->prompt) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    return 0;
}

int serve_params_parse(struct serve_params *p, enum serve_kind kind, const char *body, size_t len,
                       const struct serve_limits *limits, struct serve_error *err) {
    return serve_params_parse_with(p, kind, body, len, limits, NULL, err);
}

int serve_params_parse_with(struct serve_params *p, enum serve_kind kind, const char *body,
                            size_t len, const struct serve_limits *limits,
                            const struct serve_image_limits *images, struct serve_error *err) {
    static const struct serve_image_limits defaults = {
        SERVE_DEFAULT_MAX_IMAGE_BYTES, SERVE_DEFAULT_MAX_IMAGES, SERVE_DEFAULT_MAX_VIDEO_BYTES,
        SERVE_DEFAULT_MAX_VIDEOS};
    memset(p, 0, sizeof *p);
    serve_params_defaults(p, kind);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return serve_error_set(err, 400, NULL, "invalid_json", "the body is not valid JSON");
    int rc = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "n");
    if (!cJSON_IsObject(root))
        serve_error_set(err, 400, NULL, "invalid_json", "the body must be a JSON object");
    else if (model && !cJSON_IsNull(model) &&
             (!cJSON_IsString(model) || strcmp(model->valuestring, limits->model_id)))
        serve_error_set(err, 400, "model", "model_not_found", "the model '%s' does not exist",
                        cJSON_IsString(model) ? model->valuestring : "?");
    else if (n && !cJSON_IsNull(n) && !(cJSON_IsNumber(n) && n->valuedouble == 1))
        serve_error_set(err, 400, "n", "invalid_value", "only n = 1 is supported");
    else if (kind == SERVE_CHAT ? get_messages(p, root, images ? images : &defaults, err) == 0
                                : get_prompt(p, root, err) == 0)
        rc = get_sampling(p, root, limits, err);
    cJSON_Delete(root);
    return rc;
}
