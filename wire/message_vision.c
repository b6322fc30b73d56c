/* Wire 1.1 messages of the vision stage (wire/strata.fbs): VisionBlock, one block of a
 * request's vision encoder output on its way to stage 0, and VisionAck, stage 0's
 * acknowledgement. Kept beside message.c, on its Tensor helpers (message_internal.h). */
#include <inttypes.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/message_internal.h"

enum {
    VB_NONCE,
    VB_INDEX,
    VB_NUM_BLOCKS,
    VB_TOKEN_START,
    VB_TOTAL_TOKENS,
    VB_EMBEDS,
    VB_DEEPSTACK
};
static const struct fb_field_desc vision_block_fields[] = {
    SCALAR(8),
    SCALAR(4),
    SCALAR(4),
    SCALAR(4),
    SCALAR(4),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
};
const struct fb_table_desc wmsg_vision_block_desc = {"VisionBlock", 7, vision_block_fields};

enum { VA_NONCE, VA_NEXT_BLOCK };
static const struct fb_field_desc vision_ack_fields[] = {SCALAR(8), SCALAR(4)};
const struct fb_table_desc wmsg_vision_ack_desc = {"VisionAck", 2, vision_ack_fields};

/* The semantic checks of a block (see message.h), shared by builder and reader. */
static int check_block(const struct wire_vision_block *m, int code) {
    const struct wire_tensor *e = &m->embeds, *d = &m->deepstack;
    int rc = wmsg_check_tensor(e, "VisionBlock", "embeds");
    if (!rc) rc = wmsg_check_tensor(d, "VisionBlock", "deepstack");
    if (rc) return rc;
    if (m->nonce == 0) return strata_set_error(code, "wire: VisionBlock.nonce 0 is reserved");
    if (m->index >= m->num_blocks)
        return strata_set_error(code, "wire: VisionBlock.index %u outside 0..%u", m->index,
                                m->num_blocks);
    if (!e->defined || e->dtype != WIRE_DTYPE_F32 || e->codec != WIRE_CODEC_NONE || e->ndim != 2 ||
        e->shape[0] < 1 || e->shape[1] < 1 ||
        (uint64_t)m->token_start + (uint64_t)e->shape[0] > m->total_tokens)
        return strata_set_error(code,
                                "wire: VisionBlock.embeds must be F32 [n >= 1, H] within the "
                                "request's %u image tokens (block at token %u)",
                                m->total_tokens, m->token_start);
    if (!d->defined) return 0;
    if (m->index != 0)
        return strata_set_error(code, "wire: VisionBlock %u carries DeepStack (block 0 only)",
                                m->index);
    if (d->dtype != WIRE_DTYPE_F32 || d->codec != WIRE_CODEC_NONE || d->ndim != 3 ||
        d->shape[0] < 1 || d->shape[1] != m->total_tokens || d->shape[2] != e->shape[1])
        return strata_set_error(code,
                                "wire: VisionBlock.deepstack must be F32 [K, %u, %" PRId64 "]",
                                m->total_tokens, e->shape[1]);
    return 0;
}

int wire_build_vision_block(struct wire_arena *a, const struct wire_vision_block *m) {
    int rc = check_block(m, STRATA_EINVAL);
    if (rc) return rc;
    fb_begin(a, 1024 + wmsg_tensor_bytes_estimate(&m->embeds) +
                    wmsg_tensor_bytes_estimate(&m->deepstack));
    uint32_t embeds = wmsg_build_tensor(a, &m->embeds);
    uint32_t deepstack = wmsg_build_tensor(a, &m->deepstack);
    fb_table_start(a);
    fb_add_u64(a, VB_NONCE, m->nonce, 0);
    fb_add_offset(a, VB_EMBEDS, embeds);
    fb_add_offset(a, VB_DEEPSTACK, deepstack);
    fb_add_u32(a, VB_INDEX, m->index, 0);
    fb_add_u32(a, VB_NUM_BLOCKS, m->num_blocks, 0);
    fb_add_u32(a, VB_TOKEN_START, m->token_start, 0);
    fb_add_u32(a, VB_TOTAL_TOKENS, m->total_tokens, 0);
    return wmsg_finish_frame(a, WIRE_KIND_VISION_BLOCK, fb_table_end(a));
}

int wire_build_vision_ack(struct wire_arena *a, const struct wire_vision_ack *m) {
    fb_begin(a, 256);
    fb_table_start(a);
    fb_add_u64(a, VA_NONCE, m->nonce, 0);
    fb_add_u32(a, VA_NEXT_BLOCK, m->next_block, 0);
    return wmsg_finish_frame(a, WIRE_KIND_VISION_ACK, fb_table_end(a));
}

int wmsg_parse_vision_block(struct wire_vision_block *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->nonce = fb_get_scalar(t, VB_NONCE, 8, 0);
    out->index = (uint32_t)fb_get_scalar(t, VB_INDEX, 4, 0);
    out->num_blocks = (uint32_t)fb_get_scalar(t, VB_NUM_BLOCKS, 4, 0);
    out->token_start = (uint32_t)fb_get_scalar(t, VB_TOKEN_START, 4, 0);
    out->total_tokens = (uint32_t)fb_get_scalar(t, VB_TOTAL_TOKENS, 4, 0);
    int rc = wmsg_read_tensor(&out->embeds, t, VB_EMBEDS, "VisionBlock", "embeds");
    if (!rc) rc = wmsg_read_tensor(&out->deepstack, t, VB_DEEPSTACK, "VisionBlock", "deepstack");
    return rc ? rc : check_block(out, STRATA_EFORMAT);
}

int wmsg_parse_vision_ack(struct wire_vision_ack *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->nonce = fb_get_scalar(t, VA_NONCE, 8, 0);
    out->next_block = (uint32_t)fb_get_scalar(t, VA_NEXT_BLOCK, 4, 0);
    if (out->nonce == 0) return strata_set_error(STRATA_EFORMAT, "wire: VisionAck.nonce 0");
    return 0;
}

int wire_read_vision_block(struct wire_vision_block *out, const void *frame, size_t len) {
    struct fb_table body;
    memset(out, 0, sizeof *out);
    int rc = wmsg_open_kind(&body, WIRE_KIND_VISION_BLOCK, frame, len);
    return rc ? rc : wmsg_parse_vision_block(out, &body);
}

int wire_read_vision_ack(struct wire_vision_ack *out, const void *frame, size_t len) {
    struct fb_table body;
    memset(out, 0, sizeof *out);
    int rc = wmsg_open_kind(&body, WIRE_KIND_VISION_ACK, frame, len);
    return rc ? rc : wmsg_parse_vision_ack(out, &body);
}
