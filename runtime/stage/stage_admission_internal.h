/* Stage 0's admission queue: requests that arrive while every KV slot is in use wait here in
 * arrival order instead of being refused, bounded by a count (--max-queue) and a deadline
 * (--queue-timeout-ms); one refused for either gets a clear STRATA_EBUSY, which the serving
 * fronts answer with 429 / RESOURCE_EXHAUSTED (busy, not broken). A waiting request holds
 * only its Request frame: no KV, nothing sent down the ring. It is admitted when a slot is
 * free again, exactly as if it had just arrived; its finish token (or error) for the request
 * it replaces goes down each link ahead of its Request, so every later stage has freed that
 * slot when the Request reaches it. A client that cancels or disconnects leaves the queue.
 * Private to the stage core (stage_admission.c): use stage_core.h. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_ADMISSION_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_ADMISSION_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

struct stage_core;

/* One waiting request: its Request frame as the client sent it. */
struct stage_waiting {
    uint32_t client_id;
    uint64_t nonce;
    uint8_t *frame;
    size_t len;
    int64_t arrived_ms; /* the core's clock */
    int need;           /* KV positions it reserves when it starts */
};

struct stage_admission {
    int max_queue;                 /* 0: no queue (refuse at once) */
    int timeout_ms;                /* longest wait; 0: none */
    struct stage_waiting *waiting; /* ring buffer [max_queue] */
    int head, count;
    /* Since start: queued, admitted from the queue, refused because it was full or their
     * deadline passed, left (cancelled or disconnected), and the total wait of the admitted. */
    uint64_t queued, admitted, refused_full, expired, left;
    int64_t waited_ms;
};

/* Stage 0, a Request that cannot start now (no free slot, or too few KV blocks for its
 * `need` positions): waits (0), or is refused (STRATA_EBUSY with the message set) when the
 * queue is full or off. */
int stage_admission_push(struct stage_core *core, uint32_t client_id, uint64_t nonce,
                         const uint8_t *frame, size_t len, int need);
/* Requests wait behind the ones already waiting (arrival order). */
int stage_admission_waiting(const struct stage_core *core);
/* Refuses the requests past their deadline, then admits waiting ones in arrival order while
 * the head can start (a free slot and its KV blocks). The core calls it after every entry
 * point that can free a slot or move the clock. */
void stage_admission_pump(struct stage_core *core);
/* A waiting request of `client_id` (any nonce when `nonce` is 0) leaves the queue, its
 * client told why (unless it is gone). Returns how many left. */
int stage_admission_leave(struct stage_core *core, uint32_t client_id, uint64_t nonce,
                          int tell_client, const char *why);
void stage_admission_free(struct stage_core *core);

#endif
