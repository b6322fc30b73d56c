/* Response builders for the OpenAI-compatible front (see serve_json.h). */
#include "runtime/serve/serve_json.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

static cJSON *string_or_null(const char *s) {
    return s && s[0] ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* Prints and frees root; NULL when anything on the way failed to allocate. */
static char *finish_json(cJSON *root, int ok) {
    char *out = ok && root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

char *serve_json_error(const struct serve_error *err) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    int ok = e && cJSON_AddStringToObject(e, "message", err->message) &&
             cJSON_AddStringToObject(e, "type", err->type[0] ? err->type : "invalid_request_error");
    ok = ok && cJSON_AddItemToObject(e, "param", string_or_null(err->param)) &&
         cJSON_AddItemToObject(e, "code", string_or_null(err->code));
    return finish_json(root, ok);
}

static cJSON *usage_object(const struct serve_usage *u) {
    cJSON *o = cJSON_CreateObject(), *details = NULL;
    if (o && cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens) &&
        cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens) &&
        cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens) &&
        (details = cJSON_AddObjectToObject(o, "prompt_tokens_details")) &&
        cJSON_AddNumberToObject(details, "cached_tokens", u->cached_tokens) &&
        (details = cJSON_AddObjectToObject(o, "completion_tokens_details")) &&
        cJSON_AddNumberToObject(details, "accepted_prediction_tokens",
                                u->accepted_prediction_tokens) &&
        cJSON_AddNumberToObject(details, "rejected_prediction_tokens",
                                u->rejected_prediction_tokens))
        return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"id","object","created","model","choices":[]}; *choices receives the array. */
static cJSON *reply_root(const struct serve_reply_info *info, const char *object, cJSON **choices) {
    cJSON *root = cJSON_CreateObject();
    int ok = root && cJSON_AddStringToObject(root, "id", info->id) &&
             cJSON_AddStringToObject(root, "object", object) &&
             cJSON_AddNumberToObject(root, "created", (double)info->created) &&
             cJSON_AddStringToObject(root, "model", info->model) &&
             (*choices = cJSON_AddArrayToObject(root, "choices")) != NULL;
    if (ok) return root;
    cJSON_Delete(root);
    return NULL;
}

/* A choice object with index 0, added to choices. */
static cJSON *choice_object(cJSON *choices) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddItemToArray(choices, c);
    if (!cJSON_AddNumberToObject(c, "index", 0)) return NULL;
    return c;
}

static int add_finish(cJSON *c, const char *finish) {
    return cJSON_AddItemToObject(c, "finish_reason", string_or_null(finish));
}

char *serve_json_answer(const struct serve_reply_info *info, const char *text, const char *finish,
                        const struct serve_usage *usage) {
    cJSON *choices = NULL, *root, *c, *msg;
    int chat = info->kind == SERVE_CHAT;
    root = reply_root(info, chat ? "chat.completion" : "text_completion", &choices);
    c = root ? choice_object(choices) : NULL;
    int ok = c != NULL;
    if (ok && chat) {
        msg = cJSON_AddObjectToObject(c, "message");
        ok = msg && cJSON_AddStringToObject(msg, "role", "assistant") &&
             cJSON_AddStringToObject(msg, "content", text);
    } else if (ok) {
        ok = cJSON_AddStringToObject(c, "text", text) && cJSON_AddNullToObject(c, "logprobs");
    }
    ok = ok && add_finish(c, finish) && cJSON_AddItemToObject(root, "usage", usage_object(usage));
    return finish_json(root, ok);
}

char *serve_json_chunk(const struct serve_reply_info *info, int with_role, const char *text,
                       const char *finish, const struct serve_usage *usage) {
    cJSON *choices = NULL, *root, *c, *delta;
    int chat = info->kind == SERVE_CHAT;
    root = reply_root(info, chat ? "chat.completion.chunk" : "text_completion", &choices);
    if (!root) return NULL;
    if (usage && !finish)
        return finish_json(root, cJSON_AddItemToObject(root, "usage", usage_object(usage)));
    int ok = (c = choice_object(choices)) != NULL;
    if (ok && chat) {
        ok = (delta = cJSON_AddObjectToObject(c, "delta")) != NULL;
        if (ok && with_role) ok = cJSON_AddStringToObject(delta, "role", "assistant") != NULL;
        if (ok && text) ok = cJSON_AddStringToObject(delta, "content", text) != NULL;
    } else if (ok) {
        ok = cJSON_AddStringToObject(c, "text", text ? text : "") != NULL;
    }
    ok = ok && add_finish(c, finish);
    if (ok && usage) ok = cJSON_AddItemToObject(root, "usage", usage_object(usage));
    return finish_json(root, ok);
}

char *serve_json_models(const char *model_id, long created) {
    cJSON *root = cJSON_CreateObject(), *data, *m;
    int ok = root && cJSON_AddStringToObject(root, "object", "list") &&
             (data = cJSON_AddArrayToObject(root, "data")) && (m = cJSON_CreateObject());
    if (ok) {
        cJSON_AddItemToArray(data, m);
        ok = cJSON_AddStringToObject(m, "id", model_id) &&
             cJSON_AddStringToObject(m, "object", "model") &&
             cJSON_AddNumberToObject(m, "created", (double)created) &&
             cJSON_AddStringToObject(m, "owned_by", "strata");
    }
    return finish_json(root, ok);
}

/* Stage 0's counters since it started, as an object "totals" on its entry only (the others
 * count none); JSON numbers, exact below 2^53. */
static int add_totals(cJSON *e, const struct client_stage_info *s) {
    const struct wire_stage_totals *t = &s->totals;
    if (s->stage_index != 0 || s->front) return 1;
    if (!(e = cJSON_AddObjectToObject(e, "totals"))) return 0;
    const struct {
        const char *name;
        uint64_t v;
    } f[] = {{"requests_queued", t->requests_queued},
             {"queue_admitted", t->queue_admitted},
             {"queue_refused_full", t->queue_refused_full},
             {"queue_expired", t->queue_expired},
             {"queue_wait_ms", t->queue_wait_ms},
             {"prefix_lookups", t->prefix_lookups},
             {"prefix_hits", t->prefix_hits},
             {"prefix_cached_tokens", t->prefix_cached_tokens},
             {"prefix_prompt_tokens", t->prefix_prompt_tokens},
             {"prefix_fallbacks", t->prefix_fallbacks},
             {"spec_steps", t->spec_steps},
             {"spec_drafted", t->spec_drafted},
             {"spec_accepted", t->spec_accepted},
             {"spec_withheld", t->spec_withheld}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (!cJSON_AddNumberToObject(e, f[i].name, (double)f[i].v)) return 0;
    return 1;
}

static const char *state_name(enum serve_stage_state s) {
    return s == SERVE_STAGE_UP ? "up" : s == SERVE_STAGE_DOWN ? "down" : "unknown";
}

/* One stage of GET /v1/stages, with its state (and the reason when it is not up). */
static int add_stage(cJSON *data, const struct client_stage_info *s,
                     const struct serve_stage_status *st) {
    cJSON *e = cJSON_CreateObject(), *layers, *roles;
    if (!e) return 0;
    cJSON_AddItemToArray(data, e);
    int ok = cJSON_AddNumberToObject(e, "stage", s->stage_index) &&
             cJSON_AddNumberToObject(e, "num_stages", s->num_stages) &&
             (layers = cJSON_AddArrayToObject(e, "layers")) &&
             (roles = cJSON_AddArrayToObject(e, "roles"));
    if (!ok) return 0;
    cJSON_AddItemToArray(layers, cJSON_CreateNumber(s->layer_start));
    cJSON_AddItemToArray(layers, cJSON_CreateNumber(s->layer_end));
    if (s->embed) cJSON_AddItemToArray(roles, cJSON_CreateString("embed"));
    if (s->vision) cJSON_AddItemToArray(roles, cJSON_CreateString("vision"));
    if (s->head) cJSON_AddItemToArray(roles, cJSON_CreateString("head"));
    return cJSON_AddStringToObject(e, "device", s->device) &&
           cJSON_AddNumberToObject(e, "tp", s->tp) && cJSON_AddNumberToObject(e, "kvp", s->kvp) &&
           cJSON_AddNumberToObject(e, "threads", s->threads) &&
           cJSON_AddStringToObject(e, "weights_dtype", s->weights_dtype) &&
           cJSON_AddStringToObject(e, "version", s->version) &&
           cJSON_AddStringToObject(e, "next", s->next) &&
           cJSON_AddBoolToObject(e, "front", s->front) &&
           cJSON_AddStringToObject(e, "state", state_name(st ? st->state : SERVE_STAGE_UP)) &&
           (!st || st->state == SERVE_STAGE_UP ||
            cJSON_AddStringToObject(e, "reason", st->reason)) &&
           cJSON_AddNumberToObject(e, "max_seq", s->max_seq) &&
           cJSON_AddNumberToObject(e, "max_batch", s->max_batch) &&
           cJSON_AddNumberToObject(e, "kv_slots_in_use", s->kv_slots_in_use) &&
           cJSON_AddNumberToObject(e, "queue_depth", s->queue_depth) &&
           cJSON_AddNumberToObject(e, "requests_waiting", s->requests_waiting) &&
           cJSON_AddNumberToObject(e, "kv_blocks", s->kv_blocks) &&
           cJSON_AddNumberToObject(e, "kv_blocks_used", s->kv_blocks_used) &&
           cJSON_AddNumberToObject(e, "kv_blocks_reserved", s->kv_blocks_reserved) &&
           cJSON_AddNumberToObject(e, "kv_blocks_cached", s->kv_blocks_cached) &&
           add_totals(e, s) && cJSON_GetArraySize(layers) == 2 &&
           cJSON_GetArraySize(roles) == !!s->embed + !!s->vision + !!s->head;
}

char *serve_json_stages(const struct client_describe *d, const struct serve_stage_status *status,
                        const struct serve_error *err) {
    cJSON *root = cJSON_CreateObject(), *data;
    int ok = root != NULL;
    if (ok && err) { /* the error first, where OpenAI's clients look for it */
        cJSON *e = cJSON_AddObjectToObject(root, "error");
        ok = e && cJSON_AddStringToObject(e, "message", err->message) &&
             cJSON_AddStringToObject(e, "type", err->type[0] ? err->type : "server_error") &&
             cJSON_AddItemToObject(e, "param", string_or_null(err->param)) &&
             cJSON_AddItemToObject(e, "code", string_or_null(err->code));
    }
    ok = ok && cJSON_AddStringToObject(root, "object", "list") &&
         (data = cJSON_AddArrayToObject(root, "data"));
    for (int i = 0; ok && i < d->num_stages; i++)
        ok = add_stage(data, &d->stages[i], status ? &status[i] : NULL);
    return finish_json(root, ok);
}

int serve_buf_append(struct serve_buf *b, const char *data, size_t len) {
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "serve: no memory for %zu bytes", cap);
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

void serve_buf_free(struct serve_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int serve_sse_event(struct serve_buf *b, char *json) {
    if (!json) return strata_set_error(STRATA_ENOMEM, "serve: no memory for a chunk");
    int rc = serve_buf_append(b, "data: ", 6);
    if (rc == 0) rc = serve_buf_append(b, json, strlen(json));
    if (rc == 0) rc = serve_buf_append(b, "\n\n", 2);
    free(json);
    return rc;
}

int serve_sse_done(struct serve_buf *b) {
    return serve_buf_append(b, "data: [DONE]\n\n", 14);
}
