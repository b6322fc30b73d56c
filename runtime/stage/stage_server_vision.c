/* Stage 0's side of a vision stage's link (see stage_server_vision.h). */
#include "runtime/stage/stage_server_vision.h"

#include <stdio.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"

/* Replies go into the link's send queue (wire_send_frame_nb), as every frame to a client
 * does, so a vision stage that stops reading holds stage 0 up no more than a client. */
static int reply(struct wire_conn *conn, struct wire_arena *arena, size_t max_queued) {
    return wire_send_frame_nb(conn, wire_arena_frame(arena), wire_arena_frame_len(arena),
                              max_queued) < 0
               ? STRATA_ECLOSED
               : 0;
}

static int reply_error(struct wire_conn *conn, int code, uint64_t nonce, const char *why,
                       size_t max_queued) {
    struct wire_arena arena;
    struct wire_error err = {code, why, nonce};
    int rc = wire_arena_init(&arena, 1024);
    if (rc == 0) rc = wire_build_error(&arena, &err);
    if (rc == 0) rc = reply(conn, &arena, max_queued);
    wire_arena_free(&arena);
    return rc;
}

static int on_block(struct vision_rx *rx, struct wire_conn *conn, const uint8_t *frame, size_t len,
                    size_t max_queued) {
    struct wire_vision_block b;
    struct wire_vision_ack ack;
    struct wire_arena arena;
    int rc = wire_read_vision_block(&b, frame, len);
    if (rc < 0) return rc;
    rc = vision_rx_on_block(rx, &ack, &b, cli_now_ms());
    if (rc < 0) {
        char why[600];
        snprintf(why, sizeof why, "stage 0: vision transfer refused: %s", strata_last_error());
        strata_log(STRATA_LOG_WARN, "request %llu: %s", (unsigned long long)b.nonce, why);
        return reply_error(conn, rc, b.nonce, why, max_queued);
    }
    strata_log(STRATA_LOG_DEBUG, "request %llu: vision block %u of %u held",
               (unsigned long long)b.nonce, b.index, b.num_blocks);
    if (wire_arena_init(&arena, 256) < 0) return STRATA_ENOMEM;
    rc = wire_build_vision_ack(&arena, &ack);
    if (rc == 0) rc = reply(conn, &arena, max_queued);
    wire_arena_free(&arena);
    return rc;
}

int stage_vision_on_frame(struct vision_rx *rx, struct stage_core *core, struct wire_conn *conn,
                          uint32_t client_id, const uint8_t *frame, size_t len, size_t max_queued) {
    enum wire_kind kind;
    int rc = wire_verify(&kind, NULL, frame, len);
    if (rc < 0) return rc;
    if (kind == WIRE_KIND_VISION_BLOCK) return on_block(rx, conn, frame, len, max_queued);
    if (kind != WIRE_KIND_REQUEST)
        return stage_core_on_frame(core, STAGE_LINK_CLIENT, client_id, frame, len);
    struct wire_request req;
    struct wire_arena arena;
    rc = wire_read_request(&req, frame, len);
    if (rc < 0) return rc;
    if (wire_arena_init(&arena, 0) < 0) return STRATA_ENOMEM;
    rc = vision_rx_attach(rx, &arena, &req);
    if (rc == 1) {
        rc = stage_core_on_frame(core, STAGE_LINK_CLIENT, client_id, wire_arena_frame(&arena),
                                 wire_arena_frame_len(&arena));
    } else if (rc == 0) {
        rc = stage_core_on_frame(core, STAGE_LINK_CLIENT, client_id, frame, len);
    } else {
        char why[600];
        snprintf(why, sizeof why, "stage 0: %s", strata_last_error());
        rc = reply_error(conn, rc, req.nonce, why, max_queued);
    }
    wire_arena_free(&arena);
    return rc;
}
