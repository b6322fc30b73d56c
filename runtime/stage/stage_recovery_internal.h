/* In-flight recovery's state inside the stage core (stage_recovery.c: the Reset attempt;
 * stage_recovery_kv.c: KV-restoring recovery) and the calls the rest of the core makes into
 * it. Private to the stage core: use stage_core.h. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_RECOVERY_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_RECOVERY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/stage_core.h"

struct stage_req;
struct wire_request;
struct wire_kv_block;

struct stage_recovery {
    /* Stage 0: the Reset attempt in flight (its seq) and when it was sent. */
    uint64_t reset_epoch;
    int64_t reset_sent_ms;
    int reset_pending;
    /* Stage 0, KV-restoring recovery: bytes of KvBlock copies kept, the cap and mode
     * (stage_core_set_kv_recovery), the driver's measured costs (0 = unknown). */
    size_t kv_kept_bytes, kv_keep_cap;
    enum stage_kv_recovery kv_mode;
    double row_ns, link_bytes_per_s;
};

/* stage_recovery.c: in-flight recovery (design in that file). */
/* Drops a request's queued work items (it keeps its slot; release() uses it too). */
void stage_drop_items(struct stage_core *core, uint64_t nonce);
/* Stage 0: the ring broke under `req`; 1 when it is now held (recovery on and recoverable),
 * 0 when the caller must fail it as before. */
int stage_recovery_hold(struct stage_core *core, struct stage_req *req, const char *why);
/* A Control Reset: stage 0 replays when it is its own; other stages drop and forward. */
void stage_recovery_on_reset(struct stage_core *core, enum stage_link from, uint64_t seq);
/* Any stage: a Request with resume tokens for a nonce still held here is stale: dropped. */
void stage_recovery_drop_stale(struct stage_core *core, const struct wire_request *msg);
/* After admitting a resumed Request: tokens 0..n-1 known, the sampler at step n (the last
 * stage), stage 0's prompt row extended with them. */
int stage_recovery_admit_resumed(struct stage_core *core, struct stage_req *req,
                                 const struct wire_request *msg);
/* Stage 0: queues the request's prefill (prompt + resume tokens) in chunks. */
int stage_recovery_queue_prefill(struct stage_core *core, struct stage_req *req);
/* Last stage with keep_logits: logits (kept) and samples of the replayed rows before the
 * resumed step, checked against the tokens stage 0 sent; called before sampling. */
void stage_recovery_replay_logits(struct stage_core *core, int n, const int *row_off);

/* stage_recovery_kv.c: KV-restoring recovery (design in that file). */
/* A KvBlock from upstream: kept (stage 0), restored (a copy addressed back to its owner),
 * handed to the driver (addressed here: --kv-out) and/or forwarded toward stage 0. */
int stage_recovery_on_kv_block(struct stage_core *core, const struct wire_kv_block *msg,
                               const uint8_t *frame, size_t len);
/* Stage r >= 1: the replay's Request for a request restored from its copy (after its
 * parameters are set): checks the copy ends before the replay's last row and takes the
 * resumed tokens. 0, or a status after failing the request. */
int stage_recovery_kv_admit(struct stage_core *core, struct stage_req *req,
                            const struct wire_request *msg);
/* Stage 0: frees a request's kept copies. */
void stage_recovery_kv_drop(struct stage_core *core, struct stage_req *req);
/* Stage 0, replaying `*req`: when the KV copies make it the cheaper way, restores its own KV
 * to m positions, sends every later stage its copy (cut to m) and returns m; else 0 (the
 * slot emptied for a full replay). *req may move to another slot. */
int stage_recovery_kv_restore(struct stage_core *core, struct stage_req **req);
/* Stage 0: empties a held request's KV slot for its replay (it may move to another slot:
 * returns where it is now). */
struct stage_req *stage_recovery_fresh_slot(struct stage_core *core, struct stage_req *req);

/* Stage 0: req's Request down the ring again, cold (its prompt, the tokens it has as
 * resume_tokens, its block keys with none cached); on failure the request is failed with
 * "stage 0: <what> request N: ..." and the status returned. */
int stage_recovery_send_request(struct stage_core *core, struct stage_req *req, const char *what);
/* Stage 0: queues the replay's prefill from position `from` (0 = all of it). */
int stage_recovery_queue_prefill_from(struct stage_core *core, struct stage_req *req, int from);

#endif
