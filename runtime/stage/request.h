/* Requests and their events as wire frames: what a client sends to stage 0 and reads back.
 *
 * A request is a wire `Request` message (wire/strata.fbs): nonce, prompt ids, max_tokens,
 * sampling (temperature, top_k, top_p, seed) and stop ids. Stage 0 forwards the same frame
 * down the pipeline when it admits the request, so every stage checks it with
 * request_params_from_wire() before the request's first activation arrives.
 *
 * Nonces: a client picks a nonzero nonce per request, unique among its active requests.
 * Nonce 0 is reserved: request_build refuses it, the wire reader refuses a Request with it,
 * and an Error with nonce 0 is about the connection itself (a bad frame, a protocol
 * violation): the stage closes the connection after sending it.
 *
 * Events a client reads: TokenResult (one token per step, finish set on the last one),
 * Error with a request's nonce (that request failed), Error with nonce 0 (the connection
 * failed: every request on it is lost), the Control Describe answering one it sent
 * (client.h), and nothing else. */
#ifndef STRATA_RUNTIME_STAGE_REQUEST_H
#define STRATA_RUNTIME_STAGE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/sampling_params.h"
#include "runtime/model/vl_prompt.h"
#include "wire/message.h"

#define REQUEST_MAX_STOP_IDS 16

/* The Qwen3-VL inputs of a request, what a vision encoder produces for its images (spec
 * qwen3-architecture.md §5.4): one grid per image in prompt order, the merged embeddings
 * that replace the image-pad rows (all images concatenated) and the DeepStack features.
 * The prompt holds either one image-pad id per image (stage 0 expands each to its
 * t*h*w/merge^2 rows, as Qwen3VLProcessor does) or the expanded runs. Stage 0 computes the
 * M-RoPE positions itself from the expanded ids and the grids (runtime/model/vl_prompt.h). */
struct request_vision {
    const struct vl_grid *grids; /* [num_images] */
    int num_images;
    int n_image_tokens;     /* rows of embeds: sum of t*h*w / merge^2 */
    int hidden_size;        /* H */
    const float *embeds;    /* [n_image_tokens, H] */
    int num_deepstack;      /* K (len(deepstack_visual_indexes)); 0 = none */
    const float *deepstack; /* [K, n_image_tokens, H] */
};

struct stage_request {
    uint64_t nonce;        /* != 0, chosen by the client, unique among its active requests */
    const int32_t *prompt; /* [prompt_len] token ids */
    int prompt_len;        /* >= 1 */
    int max_tokens;        /* >= 1 tokens to generate at most */
    int num_stop_ids;      /* 0 .. REQUEST_MAX_STOP_IDS */
    int32_t stop_ids[REQUEST_MAX_STOP_IDS];
    struct sampler_params sampling;
    const struct request_vision *vision; /* NULL: a text request */
    /* Image files for a vision stage (wire 1.1; strata-stage --role vision decodes and
     * encodes them and sends the request on with `vision` filled): file i is
     * image_file_sizes[i] bytes of image_files, concatenated in prompt order. */
    const uint8_t *image_files;       /* [sum of sizes] */
    const uint32_t *image_file_sizes; /* [num_image_files] */
    const uint8_t *image_formats;     /* [num_image_files] enum wire_image_format, or NULL */
    int num_image_files;
    /* Recovery (stage_recovery.c): the tokens already received for this request (steps
     * 0..n-1), when a client resubmits it to a new stage 0; the request resumes at step n
     * with the same tokens and sampler state as if it had never stopped. n < max_tokens. */
    const int32_t *resume_tokens; /* [num_resume_tokens] or NULL */
    int num_resume_tokens;
    /* Speculative decoding (runtime/stage/stage_speculate.c): enum wire_speculate (0: stage
     * 0's default) and the most drafts per step (0: stage 0's). The tokens are the same. */
    int speculate, speculate_k;
};

/* The parameters part of a request (everything except the prompt ids). */
struct request_params {
    int prompt_len;
    int max_tokens;
    int num_stop_ids;
    int32_t stop_ids[REQUEST_MAX_STOP_IDS];
    struct sampler_params sampling;
    int resume_len; /* tokens generated before a recovery replay (Request.resume_tokens) */
};

/* Checks a read Request against the runtime's limits (prompt length, stop-id count and
 * values) and fills `p`; the prompt ids stay in `msg`. Clear error for a bad one. */
int request_params_from_wire(struct request_params *p, const struct wire_request *msg);

/* Builds the Request frame into `arena` (wire_arena_frame() gives the bytes). */
int request_build(struct wire_arena *arena, const struct stage_request *req);
/* Builds a Control Cancel for `nonce` (!= 0). */
int request_build_cancel(struct wire_arena *arena, uint64_t nonce);

enum request_event_kind {
    REQUEST_EVENT_TOKEN = 1,
    REQUEST_EVENT_ERROR = 2,            /* request `nonce` failed */
    REQUEST_EVENT_CONNECTION_ERROR = 3, /* Error with nonce 0: the connection failed */
    REQUEST_EVENT_DESCRIBE = 4          /* the answer to a Control Describe (client.h) */
};

struct request_event {
    enum request_event_kind kind;
    uint64_t nonce;          /* 0 for CONNECTION_ERROR */
    uint64_t step;           /* TOKEN: 0 for the first generated token */
    int32_t token;           /* TOKEN */
    enum wire_finish finish; /* TOKEN: NONE while more follow */
    int32_t cached_tokens;   /* TOKEN: prompt positions stage 0 took from its KV cache */
    int32_t accepted_tokens; /* TOKEN: the request's draft tokens so far the model accepted */
    int32_t prompt_tokens;   /* TOKEN: the prompt's positions as stage 0 ran it (0: unknown) */
    int32_t rejected_tokens; /* TOKEN: ... and rejected (speculative decoding) */
    int32_t code;            /* ERROR, CONNECTION_ERROR: STRATA_E* */
    char message[512];       /* ERROR, CONNECTION_ERROR */
    /* DESCRIBE: the received Control frame (read it with client_describe_read); it points
     * into the connection's buffer and is valid until the next receive. */
    const uint8_t *frame;
    size_t frame_len;
};

/* Decodes a frame a client received from stage 0. Other message kinds (and other Control
 * kinds than Describe), and a token with the reserved nonce 0, fail (EFORMAT). */
int request_event_decode(struct request_event *ev, const uint8_t *frame, size_t len);

#endif
