/* Internal: what message.c shares with the messages kept in their own files
 * (message_request.c, message_vision.c, message_describe.c): the schema field macros, the
 * Tensor table's descriptor and helpers, the frame wrapper, and the parsers wire_verify
 * dispatches to. Not part of the wire API. */
#ifndef STRATA_WIRE_MESSAGE_INTERNAL_H
#define STRATA_WIRE_MESSAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "wire/flatbuf.h"
#include "wire/message.h"

/* Field descriptors of the schema tables (flatbuf.h), as the message files write them. */
#define SCALAR(n)                                                                                  \
    { FB_SCALAR, n, n, NULL, NULL, 0 }
#define VECTOR(n, a)                                                                               \
    { FB_VECTOR, n, a, NULL, NULL, 0 }
#define STRING                                                                                     \
    { FB_STRING, 0, 0, NULL, NULL, 0 }
#define TABLE(t)                                                                                   \
    { FB_TABLE, 0, 0, &t, NULL, 0 }

extern const struct fb_table_desc wmsg_tensor_desc;
extern const struct fb_table_desc wmsg_request_desc;
extern const struct fb_table_desc wmsg_vision_block_desc;
extern const struct fb_table_desc wmsg_vision_ack_desc;

/* Tensor checks (byte length = numel x value size, rank, scales), shared by build and read. */
int wmsg_check_tensor(const struct wire_tensor *t, const char *msg, const char *name);
size_t wmsg_tensor_bytes_estimate(const struct wire_tensor *t);
uint32_t wmsg_build_tensor(struct wire_arena *a, const struct wire_tensor *t);
int wmsg_read_tensor(struct wire_tensor *out, const struct fb_table *parent, int id,
                     const char *msg, const char *name);
/* Wraps a finished body table in the Frame root of the current version. */
int wmsg_finish_frame(struct wire_arena *a, enum wire_kind kind, uint32_t body);
/* Verifies a frame and returns its body table when it holds `want`. */
int wmsg_open_kind(struct fb_table *body, enum wire_kind want, const void *frame, size_t len);
/* A 4-byte signed scalar field (`def` when absent). */
static inline int32_t wmsg_get_i32(const struct fb_table *t, int id, int32_t def) {
    return (int32_t)(uint32_t)fb_get_scalar(t, id, 4, (uint32_t)def);
}

/* Control Describe's stage list (message_describe.c): Control field `stages`. */
#define WMSG_CONTROL_STAGES 3
extern const struct fb_table_desc wmsg_stage_info_desc;
/* Builds the StageInfo tables and their vector (0 when there are none; failures sticky in
 * the arena); parses and checks them into out->num_stages / stages_*. */
uint32_t wmsg_build_stages(struct wire_arena *a, const struct wire_control *m);
int wmsg_parse_control_stages(struct wire_control *out, const struct fb_table *t, int id);

/* message_request.c: parses and checks a Request body. */
int wmsg_parse_request(struct wire_request *out, const struct fb_table *t);

int wmsg_parse_vision_block(struct wire_vision_block *out, const struct fb_table *t);
int wmsg_parse_vision_ack(struct wire_vision_ack *out, const struct fb_table *t);

#endif
