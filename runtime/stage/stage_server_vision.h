/* Internal to strata-stage's server: stage 0's side of a vision stage's link (Hello role
 * Vision, wire 1.1). The vision stage is served like a client, with two differences: its
 * frames may be as large as WIRE_DEFAULT_MAX_FRAME (a VisionBlock 0 carries the request's
 * whole DeepStack; a client's Request stays capped at 64 MiB), and VisionBlocks are taken
 * here: acknowledged on the link and assembled (runtime/stage/vision_xfer.h) until the
 * request's Request arrives, which then enters the core with its vision tensors. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_SERVER_VISION_H
#define STRATA_RUNTIME_STAGE_STAGE_SERVER_VISION_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/stage_core.h"
#include "runtime/stage/vision_xfer.h"
#include "wire/transport.h"

#define STAGE_VISION_MAX_FRAME WIRE_DEFAULT_MAX_FRAME

/* Handles one frame from vision link `client_id` (conn): a VisionBlock is assembled and
 * acknowledged (a refused block gets an Error with its nonce); a Request takes its
 * assembled tensors; everything else goes to the core as a client frame. Replies go into
 * the conn's send queue (wire_send_frame_nb, at most max_queued bytes waiting). Returns
 * what stage_core_on_frame returns (negative: drop the link). */
int stage_vision_on_frame(struct vision_rx *rx, struct stage_core *core, struct wire_conn *conn,
                          uint32_t client_id, const uint8_t *frame, size_t len, size_t max_queued);

#endif
