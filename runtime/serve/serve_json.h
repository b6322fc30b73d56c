/* Response bodies of the OpenAI-compatible front: errors, chat.completion / text_completion
 * objects, their streamed chunks and the SSE framing around them. Built with cJSON so every
 * string is escaped; each returns a malloc'ed NUL-terminated string or NULL (no memory). */
#ifndef STRATA_RUNTIME_SERVE_SERVE_JSON_H
#define STRATA_RUNTIME_SERVE_SERVE_JSON_H

#include <stddef.h>

#include "runtime/serve/serve_request.h"
#include "runtime/stage/client.h"

/* What every object of one answer shares. */
struct serve_reply_info {
    enum serve_kind kind;
    const char *id; /* "chatcmpl-..." / "cmpl-..." */
    long created;   /* Unix seconds */
    const char *model;
};

struct serve_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of prompt_tokens, taken from the KV cache (prompt_tokens_details) */
    /* completion_tokens_details, as OpenAI names predicted tokens: draft tokens the model
     * accepted (each one of completion_tokens) and rejected (computed, not returned). */
    int accepted_prediction_tokens, rejected_prediction_tokens;
};

/* {"error":{"message","type","param","code"}} (empty param / code are null). */
char *serve_json_error(const struct serve_error *err);

/* The whole answer: chat.completion (choices[0].message.content) or text_completion
 * (choices[0].text), with finish_reason and usage. */
char *serve_json_answer(const struct serve_reply_info *info, const char *text, const char *finish,
                        const struct serve_usage *usage);

/* One streamed chunk: chat.completion.chunk with delta {role?, content?} or text_completion
 * with text. finish NULL while more follow. usage with finish: the final chunk, which always
 * carries the answer's usage ("usage numbers in the final chunk"); usage without
 * finish: the usage-only chunk (choices empty) OpenAI sends last when
 * stream_options.include_usage is set. */
char *serve_json_chunk(const struct serve_reply_info *info, int with_role, const char *text,
                       const char *finish, const struct serve_usage *usage);

/* GET /v1/models: the one model. */
char *serve_json_models(const char *model_id, long created);

/* A stage's state as GET /v1/stages reports it (runtime/serve/serve_ring.h decides it). */
enum serve_stage_state {
    SERVE_STAGE_UP,      /* answered the describe */
    SERVE_STAGE_DOWN,    /* its address refused or ignored a connection */
    SERVE_STAGE_UNKNOWN, /* listening, but the ring is broken somewhere */
};
struct serve_stage_status {
    enum serve_stage_state state;
    char reason[512]; /* why, when not up */
};

/* GET /v1/stages: {"object":"list","data":[{"stage","num_stages","layers":[a,b],"roles":[...],
 * "device","tp","kvp","threads","weights_dtype","version","next","front"(the vision stage
 * in front of stage 0, listed first when the front is one),"state"("up"|"down"|
 * "unknown"),"reason"(when not up),"max_seq","max_batch","kv_slots_in_use","queue_depth",
 * "requests_waiting","kv_blocks","kv_blocks_used","kv_blocks_reserved","kv_blocks_cached",
 * "totals"(stage 0)}]} in ring order, from a ring describe (runtime/stage/client.h).
 * status NULL: every stage up. With err, an OpenAI "error" object first: the ring is broken
 * and d is the last whole ring seen, status each stage's state now. */
char *serve_json_stages(const struct client_describe *d, const struct serve_stage_status *status,
                        const struct serve_error *err);

/* A growable byte buffer (zero-initialised is empty). */
struct serve_buf {
    char *data;
    size_t len, cap;
};
int serve_buf_append(struct serve_buf *b, const char *data, size_t len);
void serve_buf_free(struct serve_buf *b);

/* Appends "data: JSON\n\n" (and frees json; NULL is STRATA_ENOMEM). */
int serve_sse_event(struct serve_buf *b, char *json);
/* Appends "data: [DONE]\n\n". */
int serve_sse_done(struct serve_buf *b);

#endif
