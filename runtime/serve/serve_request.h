/* OpenAI-shaped request bodies (POST /v1/chat/completions and /v1/completions) parsed and
 * checked into plain parameters, and the OpenAI error shape they fail with. Pure: no I/O, no
 * tokenizer, so the unit tests drive it with strings. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_REQUEST_H
#define STRATA_RUNTIME_SERVE_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#define SERVE_MAX_STOPS 4
#define SERVE_MAX_STOP_LEN 256

/* An HTTP status with the OpenAI error fields ("param" and "code" may be empty: null). */
struct serve_error {
    int http_status;
    char type[32];
    char message[512];
    char param[48];
    char code[48];
};

/* Fills *err (type invalid_request_error unless http_status >= 500) and returns -1. */
int serve_error_set(struct serve_error *err, int http_status, const char *param, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

enum serve_kind { SERVE_CHAT = 1, SERVE_COMPLETION = 2 };

struct serve_params {
    enum serve_kind kind;
    char *messages_json; /* chat: the "messages" array as compact JSON (malloc'ed) */
    char *prompt;        /* completion: the prompt text (malloc'ed), or NULL when... */
    int32_t *prompt_ids; /* ...the prompt is given as token ids (gRPC), malloc'ed */
    int n_prompt_ids;
    int max_tokens;    /* 0 when not given: the room left in the pipeline */
    float temperature; /* default 1.0, as OpenAI */
    float top_p;       /* default 1.0 */
    int top_k;         /* extension (vLLM's): default 0, no cut */
    uint64_t seed;     /* 0 when not given */
    int n_stops;
    char stops[SERVE_MAX_STOPS][SERVE_MAX_STOP_LEN + 1];
    int stream, include_usage;
    int enable_thinking; /* chat_template_kwargs.enable_thinking, default 0 like the CLI */
    int ignore_eos;      /* gRPC: generate past the tokenizer's eos ids */
};

/* Limits the server checks a request against. */
struct serve_limits {
    const char *model_id; /* the one served model; "model" must name it when given */
    int max_tokens;       /* most tokens a request may ask for (the pipeline's KV room) */
};

/* Parses body [len] for `kind`. On failure returns -1 with *err filled (400: malformed JSON,
 * unknown model, empty messages, image parts, bad sampling values). Free with
 * serve_params_free (also after a failure). */
int serve_params_parse(struct serve_params *p, enum serve_kind kind, const char *body, size_t len,
                       const struct serve_limits *limits, struct serve_error *err);
void serve_params_free(struct serve_params *p);

/* The allowed sampling ranges, shared by the JSON and protobuf decoders. */
#define SERVE_MAX_TEMPERATURE 2.0
#define SERVE_MAX_TOP_K 1000000

/* Sets the defaults (temperature and top_p 1, as OpenAI) on a zeroed *p of `kind`. */
void serve_params_defaults(struct serve_params *p, enum serve_kind kind);

/* Checks already-typed values (the protobuf front's): temperature in [0, 2], top_p in
 * (0, 1], top_k <= 10^6, max_tokens in 0..limits->max_tokens (0 = the room left). -1 with
 * *err naming the field. */
int serve_params_check(const struct serve_params *p, const struct serve_limits *limits,
                       struct serve_error *err);

/* Adds one stop string (empty ones are ignored: they would end every answer at once). */
int serve_params_add_stop(struct serve_params *p, const char *s, struct serve_error *err);

#endif
