/* The vision stage's encoder thread (vision_stage.c): decoding, preprocessing and encoding
 * off the event loop, so token streams of other requests keep flowing while an image
 * encodes. Tasks go in and come back through two lists under its own lock; each finished
 * task wakes the loop through the callback it was started with. A task owns its copy of the
 * client's frame and its outputs, so a session that goes away meanwhile loses nothing. */
#ifndef STRATA_RUNTIME_STAGE_VISION_WORKER_H
#define STRATA_RUNTIME_STAGE_VISION_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/vision_encode.h"

/* One image request for the encoder thread, and what came back. */
struct vision_task {
    struct vision_task *next;
    uint32_t session_id;
    uint64_t nonce, seq;
    uint8_t *frame; /* [len] the client's Request */
    size_t len;
    int rc; /* the encoding's status */
    char message[700];
    struct vision_output out;
    uint8_t *request; /* [request_len] the Request for stage 0 (grids, no files) */
    size_t request_len;
};

struct vision_worker;

/* Starts the thread; `wake(ctx)` is called (on it) after each task it finishes. 0, or
 * STRATA_ENOMEM / STRATA_EIO. */
int vision_worker_start(struct vision_worker **out, struct vision_frontend *fe,
                        void (*wake)(void *ctx), void *ctx);
/* Stops the thread after the encode under way and frees every task; accepts NULL. */
void vision_worker_stop(struct vision_worker *w);

/* Queues a copy of a client's Request frame [len]; *seq is the task's number (> 0), for
 * matching what comes back. STRATA_ENOMEM with the message set. */
int vision_worker_submit(struct vision_worker *w, uint32_t session_id, uint64_t nonce,
                         const uint8_t *frame, size_t len, uint64_t *seq);
/* The finished tasks (a list through `next`, the caller's to free), or NULL. */
struct vision_task *vision_worker_take_done(struct vision_worker *w);
void vision_task_free(struct vision_task *t); /* accepts NULL */

#endif
