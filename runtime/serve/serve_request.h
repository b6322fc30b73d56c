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
    char *prompt;        /* completion: the prompt text (malloc'ed) */
    int max_tokens;      /* 0 when not given: the room left in the pipeline */
    float temperature;   /* default 1.0, as OpenAI */
    float top_p;         /* default 1.0 */
    int top_k;           /* extension (vLLM's): default 0, no cut */
    uint64_t seed;       /* 0 when not given */
    int n_stops;
    char stops[SERVE_MAX_STOPS][SERVE_MAX_STOP_LEN + 1];
    int stream, include_usage;
    int enable_thinking; /* chat_template_kwargs.enable_thinking, default 0 like the CLI */
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

#endif
