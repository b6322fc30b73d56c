/* Requests and their events as wire frames: what a client sends to stage 0 and reads back.
 *
 * The wire schema (wire/strata.fbs, v1.0) has no Request table yet, so a request travels
 * as an Activation with stage_from = -1 (a client), stage_to = 0, step 0, pos 0, the
 * request nonce, `hidden` = I32 [T] prompt ids, and the request parameters packed as an
 * I64 tensor in the `attention_mask` slot (layout in request.c; the same tensor rides on
 * the first prefill chunk to every later stage). Only this file knows that layout, so a
 * future Request table changes one place.
 *
 * Events a client reads: TokenResult (one token per step, finish set on the last one),
 * Error (the request failed; code + message), and nothing else. */
#ifndef STRATA_RUNTIME_REQUEST_H
#define STRATA_RUNTIME_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "reference/sampler.h"
#include "wire/message.h"

#define REQUEST_MAX_STOP_IDS 16

struct stage_request {
    uint64_t nonce;        /* chosen by the client, unique among its active requests */
    const int32_t *prompt; /* [prompt_len] token ids */
    int prompt_len;        /* >= 1 */
    int max_tokens;        /* >= 1 tokens to generate at most */
    int num_stop_ids;      /* 0 .. REQUEST_MAX_STOP_IDS */
    int32_t stop_ids[REQUEST_MAX_STOP_IDS];
    struct sampler_params sampling;
};

/* The parameters part of a request (everything except the prompt ids). */
struct request_params {
    int prompt_len;
    int max_tokens;
    int num_stop_ids;
    int32_t stop_ids[REQUEST_MAX_STOP_IDS];
    struct sampler_params sampling;
};

#define REQUEST_PARAMS_WORDS (8 + REQUEST_MAX_STOP_IDS)

/* Packs params into words [REQUEST_PARAMS_WORDS] and describes them as the I64 tensor
 * `t` (t->data points at words). */
void request_params_pack(struct wire_tensor *t, int64_t *words, const struct request_params *p);
/* Unpacks and checks a parameters tensor (clear error for a malformed one). */
int request_params_unpack(struct request_params *p, const struct wire_tensor *t);

/* Builds the request frame into `arena` (wire_arena_frame() gives the bytes). */
int request_build(struct wire_arena *arena, const struct stage_request *req);
/* Builds a Control Cancel for `nonce`. */
int request_build_cancel(struct wire_arena *arena, uint64_t nonce);

enum request_event_kind { REQUEST_EVENT_TOKEN = 1, REQUEST_EVENT_ERROR = 2 };

struct request_event {
    enum request_event_kind kind;
    uint64_t nonce;
    uint64_t step;           /* TOKEN: 0 for the first generated token */
    int32_t token;           /* TOKEN */
    enum wire_finish finish; /* TOKEN: NONE while more follow */
    int32_t code;            /* ERROR: STRATA_E* */
    char message[512];       /* ERROR */
};

/* Decodes a frame a client received from stage 0. Other message kinds fail (EFORMAT). */
int request_event_decode(struct request_event *ev, const uint8_t *frame, size_t len);

#endif
