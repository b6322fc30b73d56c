/* The gRPC front's messages (runtime/serve/strata.proto) to and from the front's plain types:
 * request bytes decoded with protobuf-c and checked into the same serve_params the HTTP front
 * fills (so one serve_gen serves both), responses packed into bytes. Pure: no I/O and no gRPC
 * (the status codes are gRPC's numbers, grpc/status.h), so the unit tests and the fuzzer
 * drive it with bytes. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_PB_H
#define STRATA_RUNTIME_SERVE_SERVE_PB_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/serve/serve_json.h"
#include "runtime/serve/serve_request.h"
#include "runtime/stage/client.h"

/* gRPC status codes (the values of grpc/status.h's grpc_status_code, which are fixed by the
 * gRPC protocol: doc/statuscodes.md). */
enum serve_grpc_code {
    SERVE_GRPC_OK = 0,
    SERVE_GRPC_CANCELLED = 1,
    SERVE_GRPC_INVALID_ARGUMENT = 3,
    SERVE_GRPC_DEADLINE_EXCEEDED = 4,
    SERVE_GRPC_RESOURCE_EXHAUSTED = 8,
    SERVE_GRPC_UNIMPLEMENTED = 12,
    SERVE_GRPC_INTERNAL = 13,
    SERVE_GRPC_UNAVAILABLE = 14,
};

/* The gRPC status for a front error (its HTTP status): 4xx are the request's fault
 * (INVALID_ARGUMENT; 413 RESOURCE_EXHAUSTED), 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, other
 * 5xx INTERNAL. */
enum serve_grpc_code serve_pb_status(const struct serve_error *err);

/* Decodes a GenerateRequest / ChatRequest into *p (checked against limits: the model id,
 * sampling ranges, max_tokens, stop strings, a non-empty prompt or message list). -1 with
 * *err (400) for malformed bytes or a bad value. serve_params_free afterwards either way. */
int serve_pb_parse_generate(struct serve_params *p, const uint8_t *data, size_t len,
                            const struct serve_limits *limits, struct serve_error *err);
int serve_pb_parse_chat(struct serve_params *p, const uint8_t *data, size_t len,
                        const struct serve_limits *limits, struct serve_error *err);
/* The same with image limits other than the defaults (NULL = the defaults): a ChatMessage's
 * image parts are refused as the HTTP API's image_url parts are (413 past the limits, 400
 * for bytes that are neither PNG nor JPEG). */
int serve_pb_parse_chat_with(struct serve_params *p, const uint8_t *data, size_t len,
                             const struct serve_limits *limits,
                             const struct serve_image_limits *images, struct serve_error *err);

/* One GenerateResponse: tokens [n_ids], the text delta [text_len] (UTF-8), finish NULL while
 * more follow ("stop" | "length" on the last), usage on the last only (else NULL). */
struct serve_pb_chunk {
    const int32_t *ids;
    size_t n_ids;
    const char *text;
    size_t text_len;
    const char *finish;
    const struct serve_usage *usage;
};

/* Each packs into a malloc'ed *out [*len] (free it); STRATA_ENOMEM. */
int serve_pb_pack_chunk(const struct serve_pb_chunk *c, uint8_t **out, size_t *len);
int serve_pb_pack_health(int serving, const char *message, uint8_t **out, size_t *len);

struct serve_pb_info {
    const char *model;
    int max_seq, vocab_size;
    const int32_t *eos_ids;
    int n_eos;
    int chat_template;
    const char *wire_version, *grpc_version;
    const struct client_describe *stages; /* NULL: none (then stages_error says why) */
    const char *stages_error, *strata_version;
};
int serve_pb_pack_info(const struct serve_pb_info *info, uint8_t **out, size_t *len);

#endif
