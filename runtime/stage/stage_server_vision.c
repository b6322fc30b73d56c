/* Stage 0's side of a vision stage's link (see stage_server_vision.h). */
#include "runtime/stage/stage_server_vision.h"

#include <stdio.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"

static int on_block(struct vision_rx *rx, struct wire_conn *conn, const uint8_t *frame, size_t len,
                    int timeout_ms) {
    struct wire_vision_block b;
    struct wire_vision_ack ack;
    struct wire_arena arena;
    int rc = wire_read_vision_block(&b, frame, len);
    if (rc < 0) return rc;
    rc = vision_rx_on_block(rx, &ack, &b, cli_now_ns() / 1000000);
    if (rc < 0) {
        char why[600];
        snprintf(why, sizeof why, "stage 0: vision transfer refused: %s", strata_last_error());
        strata_log(STRATA_LOG_WARN, "request %llu: %s", (unsigned long long)b.nonce, why);
        return wire_send_error(conn, rc, b.nonce, why) < 0 ? STRATA_ECLOSED : 0;
    }
    strata_log(STRATA_LOG_DEBUG, "request %llu: vision block %u of %u held",
               (unsigned long long)b.nonce, b.index, b.num_blocks);
    if (wire_arena_init(&arena, 256) < 0) return STRATA_ENOMEM;
    rc = wire_build_vision_ack(&arena, &ack);
    if (rc == 0)
        rc = wire_send_frame(conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                             timeout_ms);
    wire_arena_free(&arena);
    return rc < 0 ? STRATA_ECLOSED : 0;
}

int stage_vision_on_frame(struct vision_rx *rx, struct stage_core *core, struct wire_conn *conn,
                          uint32_t client_id, const uint8_t *frame, size_t len, int timeout_ms) {
    enum wire_kind kind;
    int rc = wire_verify(&kind, NULL, frame, len);
    if (rc < 0) return rc;
    if (kind == WIRE_KIND_VISION_BLOCK) return on_block(rx, conn, frame, len, timeout_ms);
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
        rc = wire_send_error(conn, rc, req.nonce, why) < 0 ? STRATA_ECLOSED : 0;
    }
    wire_arena_free(&arena);
    return rc;
}
