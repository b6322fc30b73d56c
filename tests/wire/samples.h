/* Fixed sample messages of every kind, shared by the wire tests, the flatc compatibility
 * goldens and the fuzz seed corpus generator, so all three describe the same frames. */
#ifndef STRATA_TESTS_WIRE_SAMPLES_H
#define STRATA_TESTS_WIRE_SAMPLES_H

#include "wire/message.h"

/* Builds the sample frame of `kind` (WIRE_KIND_HELLO .. WIRE_KIND_LAST) into `arena`. */
int sample_build(struct wire_arena *arena, enum wire_kind kind);

/* Checks that a read message of `kind` equals the sample field by field; returns 0 or a
 * line number of the first mismatch (for test diagnostics). */
int sample_check_hello(const struct wire_hello *m);
int sample_check_activation(const struct wire_activation *m);
int sample_check_kv_block(const struct wire_kv_block *m);
int sample_check_token_result(const struct wire_token_result *m);
int sample_check_error(const struct wire_error *m);
int sample_check_control(const struct wire_control *m);
int sample_check_request(const struct wire_request *m);
int sample_check_vision_block(const struct wire_vision_block *m);
int sample_check_vision_ack(const struct wire_vision_ack *m);

/* The Control Describe sample (wire 1.1, appended): a 3-stage ring's answer with every
 * StageInfo field set on some entry (roles, a TP x KVP grid, q8, strings) and one entry at
 * the defaults. Its files are "control_describe.*". */
int sample_build_describe(struct wire_arena *arena);
int sample_check_describe(const struct wire_control *m);

/* Reads `frame` as `kind` and runs the matching check (0 = equal). */
int sample_read_and_check(enum wire_kind kind, const void *frame, size_t len);

/* Sample file basenames ("hello", "activation", ..., "request", "vision_block", "vision_ack"). */
const char *sample_name(enum wire_kind kind);

#endif
