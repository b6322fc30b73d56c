/* The vision stage: strata-stage --role vision, the process in front of stage 0 that turns
 * image files into the vision encoder's outputs (encode/language disaggregation).
 *
 *   client --Request + image files--> vision stage --VisionBlocks, then Request--> stage 0
 *   client <--TokenResult / Error----  vision stage <--VisionAck, TokenResult, Error-- stage 0
 *
 * Connections: an acceptor thread takes clients (stage_accept.h, as stage 0's: concurrent
 * TLS + Hello handshakes under deadlines, per-address caps, a failed-handshake rate limit;
 * the vision stage answers as stage 0 would, stage_index 0, so strata-client talks to it
 * unchanged); frames to clients are queued, never waited for, and a client that stalls
 * mid-frame or stops reading past the I/O timeout is dropped;
 * each client gets its own link to stage 0 (Hello role Vision: stage 0 serves it as a
 * client with a larger frame limit and takes VisionBlocks on it). One upstream link per
 * client keeps stage 0's per-client bookkeeping: a client that leaves closes its link and
 * stage 0 cancels its requests, as if it had been connected directly.
 *
 * Per Request: without image files it goes to stage 0 unchanged (text bypass). With files:
 * decode -> preprocess -> encode (vision_encode.h) on an encoder thread, one request at a
 * time (the encoder has its own worker pool; the loop keeps relaying meanwhile), then the outputs
 * go to stage 0 in blocks of --vision-block-tokens rows (vision_xfer.h, at most VISION_STAGE_WINDOW
 * unacknowledged), and after the last acknowledgement the Request itself, its image files replaced
 * by the grids. A bad image is answered with an Error naming it (the client's connection stays, the
 * stage serves on). When the link to stage 0 drops mid-transfer the stage reconnects (backoff 50 ms
 * .. 1 s, up to VISION_STAGE_RECONNECTS tries) and resumes at the last acknowledged block; requests
 * already inside the pipeline are failed to the client with an Error (stage 0 has cancelled them).
 * Everything else a client or stage 0 sends is relayed unchanged.
 *
 * Limits: a client's Request frame above max_request_bytes is refused from its length
 * prefix with a connection Error naming the limit; an image file above max_image_bytes is
 * refused by name. */
#ifndef STRATA_RUNTIME_STAGE_VISION_STAGE_H
#define STRATA_RUNTIME_STAGE_VISION_STAGE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/vision_encode.h"
#include "wire/auth.h"
#include "wire/tls.h"

#define VISION_STAGE_WINDOW 8
#define VISION_STAGE_RECONNECTS 20
#define VISION_DEFAULT_MAX_REQUEST_BYTES ((size_t)64 << 20)
#define VISION_DEFAULT_BLOCK_TOKENS 1024

struct vision_stage_options {
    const char *listen_host; /* NULL = 127.0.0.1 */
    int listen_port;         /* 0 = any free port */
    const char *port_file;   /* if set, the bound port is written here */
    const char *next_host;   /* stage 0; NULL = 127.0.0.1 */
    int next_port;
    const char *next_port_file; /* re-read before every connect */
    struct wire_tls *tls;
    const struct wire_auth_key *key;
    uint8_t fingerprint[WIRE_FINGERPRINT_BYTES];
    int block_tokens;         /* image tokens per VisionBlock; 0 = the default */
    size_t max_request_bytes; /* a client's frame; 0 = the default */
    int io_timeout_ms;        /* 0 = 5000 */
    int drop_after_block;     /* testing: once per request, drop the stage-0 link right after
                                 sending this block (-1 = never) */
    /* Its own entry in a ring describe, listed first (StageInfo.front): where the tower runs,
     * in the words of a stage's device ("cpu, 2 threads", "cuda:0"), and encoder threads. */
    const char *device_words;
    int threads;
};

/* Serves until *stop becomes non-zero. Returns 0, or a negative status when the stage
 * cannot run at all (listen failed). */
int vision_stage_run(struct vision_frontend *fe, const struct vision_stage_options *opt,
                     volatile sig_atomic_t *stop);

#endif
