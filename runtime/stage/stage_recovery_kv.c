/* KV-restoring recovery: a replay that restores the KV handoff instead of recomputing it.
 *
 * stage_recovery.c replays a held request as a prefill of prompt + the n tokens generated
 * so far through every stage, because a Reset drops the request everywhere. That prefill
 * recomputes what the KV handoff (--send-kv) already carried: each stage's KV of the prompt,
 * sent right after the prompt's last chunk. This file keeps those blocks where the replay
 * starts, and a replay restores them and recomputes only the rows after them.
 *
 * Where the copies live: at stage 0, which runs the replay. With --send-kv every stage sends
 * its block after each prefill (the last stage too: to stage 0, its next hop), and stages
 * r >= 1 pass blocks of other stages r' >= 1 on toward stage 0 (the block of stage r crosses
 * S - r links; stage 0's own block stops at stage 1: stage 0 keeps its KV in its own slot
 * while a request is held). Stage 0 keeps the latest block per stage and request: one frame
 * each, freed when the request ends at stage 0, at most keep_bytes in all (--kv-keep-mb; a
 * block past the cap is not kept, and that request falls back to the full replay). A later
 * block (the prefill of a replay) replaces the earlier one. Why stage 0 and not the next
 * stage (where the handoff lands): the copies then reach the replacement down the ring in
 * FIFO order ahead of the replay's Request, so no stage waits or races for its KV, and
 * every stage - the survivors dropped theirs at the Reset like before - restores, not only
 * the replaced one; and stage 0 alone decides, knowing exactly which copies it has.
 *
 * The replay (stage_recovery_kv_restore, called by stage_recovery.c's replay for each held
 * request): with a copy from every stage 1..S-1 it restores m = min(the copies' positions,
 * own positions, P - 1) positions, where P is the prompt length: row P - 1 and later are
 * recomputed so that the last stage with --out gets the logits of steps 0..n-1 again (it
 * dropped them at the Reset). Stage 0 packs its own slot and restores it cut to m; for
 * each stage r >= 1 it sends r's block readdressed from r to r (lengths = m), which the
 * stages before r forward and r restores into a fresh slot (stage_core_restore_kv) before
 * the Request arrives; then the Request (resume_tokens as before) and prefill chunks of
 * rows [m, P + n). Bit-identical to the undisturbed run: the restore copies the cache's f32
 * values exactly, and a row's result does not depend on how the rows before it were
 * chunked (tests/reference:invariants_test; tests/pipeline/pipeline_kv_recovery_test.sh
 * compares tokens and every logit).
 *
 * Where that is cheaper (STAGE_KV_RECOVERY_AUTO): sending the copies costs about
 * bytes / link rate (all of them cross stage 0's next link, one after another); not
 * recomputing m rows saves about m x the time stage 0 takes per prefill row (the stages
 * run the replay's chunks as a pipeline, so one stage's time per row is the pipeline's).
 * Restore iff bytes / link_rate < m x row_time, both measured by the driver (stage 0's
 * large sends on its next link and its microbatches of >= 8 rows); with either not measured
 * yet it restores (the copy is exact either way). --kv-recovery restore|replay forces one.
 *
 * Not restored (full replay): a request without a copy from every later stage (no
 * --send-kv there, over the cap, the break before the last stage's prefill ended),
 * Qwen3-VL requests (their image rows are replayed as stage_recovery.c describes), and a
 * stage 0 that died (the client's resubmission finds no copies at the new stage 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/kv_block.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_core_internal.h"

void stage_core_set_kv_recovery(struct stage_core *core, enum stage_kv_recovery mode,
                                size_t keep_bytes) {
    core->recovery.kv_mode = mode;
    core->recovery.kv_keep_cap = keep_bytes;
}

void stage_core_set_recovery_costs(struct stage_core *core, double row_ns,
                                   double link_bytes_per_s) {
    core->recovery.row_ns = row_ns > 0 ? row_ns : 0;
    core->recovery.link_bytes_per_s = link_bytes_per_s > 0 ? link_bytes_per_s : 0;
}

void stage_recovery_kv_drop(struct stage_core *core, struct stage_req *req) {
    if (!req->kv_copies) return;
    for (int r = 0; r < core->opt.num_stages; r++) {
        core->recovery.kv_kept_bytes -= req->kv_copies[r].len;
        free(req->kv_copies[r].frame);
    }
    free(req->kv_copies);
    req->kv_copies = NULL;
}

/* Stage 0: keeps stage r's latest block for its request (within the cap). */
static void keep_copy(struct stage_core *core, const struct wire_kv_block *msg,
                      const uint8_t *frame, size_t len) {
    struct stage_req *req = stage_find(core, msg->nonce);
    int r = msg->stage_from;
    struct stage_kv_copy *c;
    uint8_t *copy;
    if (!req || req->vl || core->opt.recovery_timeout_ms <= 0 ||
        core->recovery.kv_mode == STAGE_KV_RECOVERY_REPLAY || msg->num_lengths != 1 || r < 1)
        return;
    if (!req->kv_copies) {
        req->kv_copies = calloc((size_t)core->opt.num_stages, sizeof *req->kv_copies);
        if (!req->kv_copies) return; /* no copy: that request replays in full */
    }
    c = &req->kv_copies[r];
    if (core->recovery.kv_kept_bytes - c->len + len > core->recovery.kv_keep_cap)
        return; /* keeps the older */
    copy = malloc(len);
    if (!copy) return;
    memcpy(copy, frame, len);
    core->recovery.kv_kept_bytes = core->recovery.kv_kept_bytes - c->len + len;
    free(c->frame);
    *c = (struct stage_kv_copy){.frame = copy, .len = len, .positions = msg->lengths[0]};
}

/* Stage r >= 1: its own KV sent back by stage 0 for a replay. A stale request of that nonce
 * here (a Reset not seen, a client's resubmission) gives way. On failure the Error goes
 * upstream; the Request that follows then finds no restored KV and fails at the first
 * activation's position check, so the request ends with an error either way. */
static void restore_copy(struct stage_core *core, uint64_t nonce, const uint8_t *frame,
                         size_t len) {
    struct stage_req *old = stage_find(core, nonce), *req;
    uint64_t got;
    int positions, rc;
    if (old)
        stage_release(core, old, STAGE_FINISH_CANCELLED, STRATA_ECANCELED,
                      "replaced by its KV copy (recovery replay)");
    rc = stage_core_restore_kv(core, &got, &positions, frame, len);
    if (rc < 0) {
        char why[512];
        snprintf(why, sizeof why, "stage %d: restoring request %llu's KV copy for its replay: %s",
                 core->opt.stage_index, (unsigned long long)nonce, strata_last_error());
        stage_emit_error(core, STAGE_LINK_PREV, 0, rc, nonce, why);
        return;
    }
    req = stage_find(core, got);
    if (req) req->kv_recovered = 1;
    core->stats.kv_restored++;
}

int stage_recovery_kv_admit(struct stage_core *core, struct stage_req *req,
                            const struct wire_request *msg) {
    if (!req->kv_recovered) return 0;
    if (req->recv_pos >= stage_prefill_len(req)) {
        stage_fail(core, req, STRATA_EINVAL, 1, 1,
                   "stage %d: request %llu's KV copy holds %d positions, its replay only %d",
                   core->opt.stage_index, (unsigned long long)req->nonce, req->recv_pos,
                   stage_prefill_len(req));
        return STRATA_EINVAL;
    }
    /* Tokens so far and the sampler at step n, as for any replay (stage_recovery.c). */
    return req->params.resume_len > 0 ? stage_recovery_admit_resumed(core, req, msg) : 0;
}

int stage_recovery_on_kv_block(struct stage_core *core, const struct wire_kv_block *msg,
                               const uint8_t *frame, size_t len) {
    int me = core->opt.stage_index, S = core->opt.num_stages;
    if (msg->stage_from < 0 || msg->stage_from >= S || msg->stage_to < 0 || msg->stage_to >= S)
        return strata_set_error(STRATA_EFORMAT,
                                "stage %d: KV block from stage %d to stage %d in a ring of %d", me,
                                msg->stage_from, msg->stage_to, S);
    if (msg->stage_from == me && msg->stage_to == me && !core->is_first) {
        restore_copy(core, msg->nonce, frame, len);
        return 0;
    }
    if (core->is_first && msg->stage_from >= 1) keep_copy(core, msg, frame, len);
    if (msg->stage_to == me && stage_emit_raw(core, STAGE_LINK_LOCAL, 0, frame, len) < 0)
        return 0; /* counted as lost (stage_emit_raw) */
    if (!core->is_first && msg->stage_from != 0)
        stage_emit_raw(core, STAGE_LINK_NEXT, 0, frame, len);
    return 0;
}

/* Stage 0: positions every stage can restore for `req`, or 0 for a full replay. */
static int restore_point(struct stage_core *core, const struct stage_req *req, size_t *bytes) {
    int m = req->params.prompt_len - 1;
    *bytes = 0;
    if (!req->kv_copies || req->vl || core->recovery.kv_mode == STAGE_KV_RECOVERY_REPLAY) return 0;
    for (int r = 1; r < core->opt.num_stages; r++) {
        const struct stage_kv_copy *c = &req->kv_copies[r];
        if (!c->frame) return 0;
        if (c->positions < m) m = c->positions;
        *bytes += c->len;
    }
    if (m <= 0) return 0;
    /* The rule (file comment): restore iff sending is faster than recomputing m rows. */
    if (core->recovery.kv_mode == STAGE_KV_RECOVERY_AUTO && core->recovery.row_ns > 0 &&
        core->recovery.link_bytes_per_s > 0 &&
        (double)*bytes / core->recovery.link_bytes_per_s * 1e9 >= (double)m * core->recovery.row_ns)
        return 0;
    return m;
}

/* Stage 0: stage r's copy readdressed r -> r, cut to m positions, down the ring. */
static int send_copy(struct stage_core *core, const struct stage_kv_copy *c, int r, int m) {
    struct wire_kv_block block;
    int32_t length = m;
    int rc = wire_read_kv_block(&block, c->frame, c->len);
    if (rc < 0) return rc;
    block.stage_from = r;
    block.stage_to = r;
    block.lengths = &length;
    block.num_lengths = 1;
    rc = wire_build_kv_block(&core->arena, &block);
    return rc < 0 ? rc : stage_emit_arena(core, STAGE_LINK_NEXT, 0);
}

int stage_recovery_kv_restore(struct stage_core *core, struct stage_req **reqp) {
    struct stage_req *req = *reqp;
    struct kv_handoff own;
    size_t bytes;
    int m = restore_point(core, req, &bytes), rc = 0;
    memset(&own, 0, sizeof own);
    if (m > 0 && (stage_backend_kv_pack(core->be, &own, &req->slot, 1) < 0 || own.lengths[0] < m))
        m = 0; /* cannot read its own KV back: the full replay */
    *reqp = req = stage_recovery_fresh_slot(core, req);
    if (m > 0) {
        int32_t length = m;
        own.lengths = &length;
        rc = stage_backend_kv_restore(core->be, &req->slot, 1, &own);
        own.lengths = NULL;
        for (int r = 1; rc == 0 && r < core->opt.num_stages; r++)
            rc = send_copy(core, &req->kv_copies[r], r, m);
    }
    kv_handoff_free(&own);
    if (rc < 0) {
        stage_fail(core, req, rc, 0, 1, "stage 0: restoring request %llu's KV copies: %s",
                   (unsigned long long)req->nonce, strata_last_error());
        return rc;
    }
    if (m > 0) {
        core->stats.kv_restored++;
        core->stats.kv_rows_saved += (uint64_t)m;
    }
    return m;
}
