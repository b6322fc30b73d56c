/* Request-body parsing for the OpenAI-compatible front (see serve_request.h). */
#include "runtime/serve/serve_request.h"

#include <cjson/cJSON.h>
#include <math.h>
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
             http_status >= 500 ? "server_error" : "invalid_request_error");
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
    p->messages_json = p->prompt = NULL;
    p->prompt_ids = NULL;
    p->n_prompt_ids = 0;
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
        get_bool(root, "stream", &p->stream, err) < 0)
        return -1;
    p->temperature = (float)t;
    p->top_p = (float)tp;
    p->top_k = tk > 0 ? (int)tk : 0;
    p->seed = seed < 0 ? (uint64_t)(int64_t)seed : (uint64_t)seed;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && cJSON_IsObject(so) && get_bool(so, "include_usage", &p->include_usage, err) < 0)
        return -1;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && cJSON_IsObject(kw) && get_bool(kw, "enable_thinking", &p->enable_thinking, err) < 0)
        return -1;
    return 0;
}

/* 1 when a content part is an image or a video (chat_template.h's order of tests). */
static int is_media_part(const cJSON *part) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    return !strcmp(t, "image") || !strcmp(t, "image_url") || !strcmp(t, "video") ||
           !strcmp(t, "input_audio") || cJSON_HasObjectItem(part, "image") ||
           cJSON_HasObjectItem(part, "image_url") || cJSON_HasObjectItem(part, "video");
}

static int get_messages(struct serve_params *p, const cJSON *root, struct serve_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *m;
    if (!msgs) return serve_error_set(err, 400, "messages", "missing", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return serve_error_set(err, 400, "messages", "invalid_value",
                               "'messages' must be a non-empty array");
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
        if (!cJSON_IsObject(m))
            return serve_error_set(err, 400, "messages", "invalid_type",
                                   "every message must be an object");
        if (!cJSON_IsArray(content)) continue;
        cJSON_ArrayForEach(part, content) {
            if (is_media_part(part))
                return serve_error_set(err, 400, "messages", "unsupported_content",
                                       "image, video and audio inputs are not supported yet "
                                       "(text only until the vision path exists)");
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
    else if (kind == SERVE_CHAT ? get_messages(p, root, err) == 0 : get_prompt(p, root, err) == 0)
        rc = get_sampling(p, root, limits, err);
    cJSON_Delete(root);
    return rc;
}
