/* The gRPC front's messages (see serve_pb.h). */
#include "runtime/serve/serve_pb.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/serve/strata.pb-c.h"

enum serve_grpc_code serve_pb_status(const struct serve_error *err) {
    if (err->http_status == 413 || err->http_status == 429) return SERVE_GRPC_RESOURCE_EXHAUSTED;
    if (err->http_status < 500) return SERVE_GRPC_INVALID_ARGUMENT;
    if (err->http_status == 503) return SERVE_GRPC_UNAVAILABLE;
    if (err->http_status == 504) return SERVE_GRPC_DEADLINE_EXCEEDED;
    return SERVE_GRPC_INTERNAL;
}

/* An empty model is the served one (proto3 cannot tell absent from empty). */
static int check_model(const char *model, const struct serve_limits *limits,
                       struct serve_error *err) {
    if (model[0] && strcmp(model, limits->model_id))
        return serve_error_set(err, 400, "model", "model_not_found",
                               "the model '%s' does not exist (this server has '%s')", model,
                               limits->model_id);
    return 0;
}

/* GenerationParams (NULL = every default) into *p, then the shared range checks. */
static int take_params(struct serve_params *p, const Strata__V1__GenerationParams *m,
                       const struct serve_limits *limits, struct serve_error *err) {
    if (!m) return 0;
    if (m->max_tokens > (uint32_t)limits->max_tokens)
        return serve_error_set(err, 400, "max_tokens", "invalid_value",
                               "'max_tokens' is %u; allowed 1..%d (the pipeline's limit; 0 = "
                               "the room left)",
                               (unsigned)m->max_tokens, limits->max_tokens);
    if (m->top_k > SERVE_MAX_TOP_K)
        return serve_error_set(err, 400, "top_k", "invalid_value", "'top_k' is %u; allowed 0..%d",
                               (unsigned)m->top_k, SERVE_MAX_TOP_K);
    p->max_tokens = (int)m->max_tokens;
    p->top_k = (int)m->top_k;
    if (m->temperature_opt_case == STRATA__V1__GENERATION_PARAMS__TEMPERATURE_OPT_TEMPERATURE)
        p->temperature = m->temperature;
    if (m->top_p_opt_case == STRATA__V1__GENERATION_PARAMS__TOP_P_OPT_TOP_P) p->top_p = m->top_p;
    if (m->seed_opt_case == STRATA__V1__GENERATION_PARAMS__SEED_OPT_SEED) p->seed = m->seed;
    p->ignore_eos = m->ignore_eos != 0;
    if (m->speculate > STRATA__V1__SPECULATE__SPECULATE_DRAFT)
        return serve_error_set(err, 400, "speculate", "invalid_value",
                               "'speculate' is %d; allowed 0..3", (int)m->speculate);
    if (m->speculate_k > SERVE_MAX_SPECULATE_K)
        return serve_error_set(err, 400, "speculate_k", "invalid_value",
                               "'speculate_k' is %u; allowed 0..%d", (unsigned)m->speculate_k,
                               SERVE_MAX_SPECULATE_K);
    p->speculate = (int)m->speculate;
    p->speculate_k = (int)m->speculate_k;
    for (size_t i = 0; i < m->n_stop; i++)
        if (serve_params_add_stop(p, m->stop[i], err) < 0) return -1;
    return serve_params_check(p, limits, err);
}

static int malformed(struct serve_error *err, const char *what) {
    return serve_error_set(err, 400, NULL, "invalid_message",
                           "the request is not a valid %s protobuf message", what);
}

static int take_prompt(struct serve_params *p, const Strata__V1__GenerateRequest *m,
                       const struct serve_limits *limits, struct serve_error *err) {
    if (m->prompt_case == STRATA__V1__GENERATE_REQUEST__PROMPT_TEXT) {
        if (!m->text[0])
            return serve_error_set(err, 400, "text", "invalid_value", "'text' must not be empty");
        p->prompt = strdup(m->text);
        return p->prompt ? 0 : serve_error_set(err, 500, NULL, NULL, "out of memory");
    }
    if (m->prompt_case != STRATA__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS)
        return serve_error_set(err, 400, "prompt", "missing",
                               "one of 'text' or 'token_ids' is "
                               "required");
    const Strata__V1__TokenIds *ids = m->token_ids;
    if (!ids || ids->n_ids == 0)
        return serve_error_set(err, 400, "token_ids", "invalid_value",
                               "'token_ids' must not be empty");
    if (ids->n_ids >= (size_t)limits->max_tokens)
        return serve_error_set(err, 400, "token_ids", "context_length_exceeded",
                               "the prompt has %zu tokens; the pipeline holds %d", ids->n_ids,
                               limits->max_tokens);
    p->prompt_ids = malloc(ids->n_ids * sizeof(int32_t));
    if (!p->prompt_ids) return serve_error_set(err, 500, NULL, NULL, "out of memory");
    memcpy(p->prompt_ids, ids->ids, ids->n_ids * sizeof(int32_t));
    p->n_prompt_ids = (int)ids->n_ids;
    return 0;
}

int serve_pb_parse_generate(struct serve_params *p, const uint8_t *data, size_t len,
                            const struct serve_limits *limits, struct serve_error *err) {
    memset(p, 0, sizeof *p);
    serve_params_defaults(p, SERVE_COMPLETION);
    Strata__V1__GenerateRequest *m = strata__v1__generate_request__unpack(NULL, len, data);
    if (!m) return malformed(err, "strata.v1.GenerateRequest");
    int rc = check_model(m->model, limits, err);
    if (rc == 0) rc = take_prompt(p, m, limits, err);
    if (rc == 0) rc = take_params(p, m->params, limits, err);
    strata__v1__generate_request__free_unpacked(m, NULL);
    return rc;
}

/* A message's parts as the HTTP API's list content: text parts as they are, each image's or
 * video's bytes into p's files and an {"type":"image"} / {"type":"video"} part in its place. */
static int parts_json(struct serve_params *p, cJSON *o, const Strata__V1__ChatMessage *msg,
                      const struct serve_image_limits *images, struct serve_error *err) {
    if (msg->content[0])
        return serve_error_set(err, 400, "messages", "invalid_value",
                               "a message has either 'content' or 'parts', not both");
    cJSON *list = cJSON_AddArrayToObject(o, "content");
    for (size_t k = 0; list && k < msg->n_parts; k++) {
        const Strata__V1__ChatPart *part = msg->parts[k];
        cJSON *item = cJSON_CreateObject();
        if (!item || !cJSON_AddItemToArray(list, item)) break;
        if (part->part_case == STRATA__V1__CHAT_PART__PART_TEXT) {
            if (!cJSON_AddStringToObject(item, "type", "text") ||
                !cJSON_AddStringToObject(item, "text", part->text))
                break;
        } else if (part->part_case == STRATA__V1__CHAT_PART__PART_IMAGE) {
            if (serve_params_add_image(p, part->image.data, part->image.len, images, "messages",
                                       err) < 0)
                return -1;
            if (!cJSON_AddStringToObject(item, "type", "image")) break;
        } else if (part->part_case == STRATA__V1__CHAT_PART__PART_VIDEO) {
            if (serve_params_add_video(p, part->video.data, part->video.len, images, "messages",
                                       err) < 0)
                return -1;
            if (!cJSON_AddStringToObject(item, "type", "video")) break;
        } else {
            return serve_error_set(err, 400, "messages", "invalid_value",
                                   "a ChatPart needs 'text', 'image' or 'video'");
        }
        if (k + 1 == msg->n_parts) return 0;
    }
    return serve_error_set(err, 500, NULL, NULL, "out of memory");
}

/* The messages as the HTTP API's JSON array, so the chat template path is the same one. */
static int messages_json(struct serve_params *p, const Strata__V1__ChatRequest *m,
                         const struct serve_image_limits *images, struct serve_error *err) {
    if (m->n_messages == 0)
        return serve_error_set(err, 400, "messages", "invalid_value",
                               "'messages' must not be empty");
    cJSON *arr = cJSON_CreateArray();
    int rc = arr ? 0 : serve_error_set(err, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; rc == 0 && i < m->n_messages; i++) {
        const Strata__V1__ChatMessage *msg = m->messages[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o) || !cJSON_AddStringToObject(o, "role", msg->role))
            rc = serve_error_set(err, 500, NULL, NULL, "out of memory");
        else if (msg->n_parts)
            rc = parts_json(p, o, msg, images, err);
        else if (!cJSON_AddStringToObject(o, "content", msg->content))
            rc = serve_error_set(err, 500, NULL, NULL, "out of memory");
    }
    p->messages_json = rc == 0 ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (rc == 0 && !p->messages_json) rc = serve_error_set(err, 500, NULL, NULL, "out of memory");
    return rc;
}

int serve_pb_parse_chat(struct serve_params *p, const uint8_t *data, size_t len,
                        const struct serve_limits *limits, struct serve_error *err) {
    return serve_pb_parse_chat_with(p, data, len, limits, NULL, err);
}

int serve_pb_parse_chat_with(struct serve_params *p, const uint8_t *data, size_t len,
                             const struct serve_limits *limits,
                             const struct serve_image_limits *images, struct serve_error *err) {
    static const struct serve_image_limits defaults = {SERVE_DEFAULT_MAX_IMAGE_BYTES,
                                                       SERVE_DEFAULT_MAX_IMAGES,
                                                       SERVE_DEFAULT_MAX_VIDEO_BYTES, SERVE_DEFAULT_MAX_VIDEOS};
    memset(p, 0, sizeof *p);
    serve_params_defaults(p, SERVE_CHAT);
    Strata__V1__ChatRequest *m = strata__v1__chat_request__unpack(NULL, len, data);
    if (!m) return malformed(err, "strata.v1.ChatRequest");
    int rc = check_model(m->model, limits, err);
    if (rc == 0) rc = messages_json(p, m, images ? images : &defaults, err);
    if (rc == 0) rc = take_params(p, m->params, limits, err);
    p->enable_thinking = m->enable_thinking != 0;
    strata__v1__chat_request__free_unpacked(m, NULL);
    return rc;
}

/* Packs any message into a malloc'ed buffer. */
static int pack(const ProtobufCMessage *m, uint8_t **out, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    *out = malloc(n ? n : 1);
    if (!*out) return strata_set_error(STRATA_ENOMEM, "serve: no memory for a message");
    *len = protobuf_c_message_pack(m, *out);
    return 0;
}

int serve_pb_pack_chunk(const struct serve_pb_chunk *c, uint8_t **out, size_t *len) {
    Strata__V1__GenerateResponse m = STRATA__V1__GENERATE_RESPONSE__INIT;
    Strata__V1__Usage usage = STRATA__V1__USAGE__INIT;
    char *text = strndup(c->text ? c->text : "", c->text ? c->text_len : 0);
    if (!text) return strata_set_error(STRATA_ENOMEM, "serve: no memory for a message");
    m.n_token_ids = c->n_ids;
    m.token_ids = (int32_t *)c->ids;
    m.text = text;
    if (c->finish)
        m.finish_reason = strcmp(c->finish, "length")
                              ? STRATA__V1__FINISH_REASON__FINISH_REASON_STOP
                              : STRATA__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    if (c->usage) {
        usage.prompt_tokens = (uint32_t)c->usage->prompt_tokens;
        usage.completion_tokens = (uint32_t)c->usage->completion_tokens;
        usage.cached_tokens = (uint32_t)c->usage->cached_tokens;
        usage.accepted_prediction_tokens = (uint32_t)c->usage->accepted_prediction_tokens;
        usage.rejected_prediction_tokens = (uint32_t)c->usage->rejected_prediction_tokens;
        m.usage = &usage;
    }
    int rc = pack(&m.base, out, len);
    free(text);
    return rc;
}

int serve_pb_pack_health(int serving, const char *message, uint8_t **out, size_t *len) {
    Strata__V1__HealthResponse m = STRATA__V1__HEALTH_RESPONSE__INIT;
    m.status = serving ? STRATA__V1__HEALTH_RESPONSE__SERVING_STATUS__SERVING
                       : STRATA__V1__HEALTH_RESPONSE__SERVING_STATUS__NOT_SERVING;
    m.message = (char *)(message ? message : "");
    return pack(&m.base, out, len);
}

int serve_pb_pack_info(const struct serve_pb_info *info, uint8_t **out, size_t *len) {
    Strata__V1__InfoResponse m = STRATA__V1__INFO_RESPONSE__INIT;
    m.model = (char *)info->model;
    m.max_seq = (uint32_t)info->max_seq;
    m.vocab_size = (uint32_t)info->vocab_size;
    m.n_eos_ids = (size_t)info->n_eos;
    m.eos_ids = (int32_t *)info->eos_ids;
    m.chat_template = info->chat_template != 0;
    m.wire_version = (char *)info->wire_version;
    m.grpc_version = (char *)info->grpc_version;
    m.stages_error = (char *)(info->stages_error ? info->stages_error : "");
    m.strata_version = (char *)(info->strata_version ? info->strata_version : "");
    int n = info->stages ? info->stages->num_stages : 0;
    Strata__V1__StageInfo entries[CLIENT_MAX_STAGES], *ptrs[CLIENT_MAX_STAGES];
    for (int i = 0; i < n; i++) {
        const struct client_stage_info *s = &info->stages->stages[i];
        Strata__V1__StageInfo e = STRATA__V1__STAGE_INFO__INIT;
        e.stage_index = s->stage_index;
        e.num_stages = s->num_stages;
        e.layer_start = s->layer_start;
        e.layer_end = s->layer_end;
        e.embed = s->embed != 0;
        e.head = s->head != 0;
        e.vision = s->vision != 0;
        e.device = (char *)s->device;
        e.tp = s->tp;
        e.kvp = s->kvp;
        e.threads = s->threads;
        e.weights_dtype = (char *)s->weights_dtype;
        e.version = (char *)s->version;
        e.max_seq = s->max_seq;
        e.max_batch = s->max_batch;
        e.kv_slots_in_use = s->kv_slots_in_use;
        e.queue_depth = s->queue_depth;
        e.requests_waiting = s->requests_waiting;
        e.kv_blocks = s->kv_blocks;
        e.kv_blocks_used = s->kv_blocks_used;
        e.kv_blocks_reserved = s->kv_blocks_reserved;
        e.kv_blocks_cached = s->kv_blocks_cached;
        e.requests_queued = s->totals.requests_queued;
        e.queue_admitted = s->totals.queue_admitted;
        e.queue_refused_full = s->totals.queue_refused_full;
        e.queue_expired = s->totals.queue_expired;
        e.queue_wait_ms = s->totals.queue_wait_ms;
        e.prefix_lookups = s->totals.prefix_lookups;
        e.prefix_hits = s->totals.prefix_hits;
        e.prefix_cached_tokens = s->totals.prefix_cached_tokens;
        e.prefix_prompt_tokens = s->totals.prefix_prompt_tokens;
        e.prefix_fallbacks = s->totals.prefix_fallbacks;
        e.spec_steps = s->totals.spec_steps;
        e.spec_drafted = s->totals.spec_drafted;
        e.spec_accepted = s->totals.spec_accepted;
        e.spec_withheld = s->totals.spec_withheld;
        e.next = (char *)s->next;
        e.front = s->front != 0;
        entries[i] = e;
        ptrs[i] = &entries[i];
    }
    m.n_stages = (size_t)n;
    m.stages = n ? ptrs : NULL;
    return pack(&m.base, out, len);
}
