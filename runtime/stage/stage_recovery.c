/* In-flight recovery: a pipeline request survives a stage that dies and comes back.
 *
 * Stage 0 knows everything a request needs to be rebuilt: its prompt and the tokens the
 * last stage has sent back so far. So when the ring breaks (one of stage 0's ring links
 * drops, or an Error with STRATA_EPEER - "a link was lost" - comes back for a request),
 * stage 0 with recovery_timeout_ms > 0 does not fail its requests: it *holds* them (their
 * queued work dropped, their tokens kept, the client told nothing). The other stages fail
 * and free them as before (their links went down or the Error reached them).
 *
 * Re-forming (stage_core_recovery_tick, driven by the driver's loop): while requests are
 * held and both of stage 0's links are up, stage 0 holds every request it has and sends a
 * Control Reset (seq = attempt number) down the ring every 100 ms. Each stage drops every
 * request it still holds and forwards the Reset; the last stage sends it back to stage 0.
 * Its return proves two things at once: the ring is whole again (a stage without a next
 * link drops the frame, and a later attempt goes round), and every frame a stage emitted
 * for the old requests has reached stage 0 before it (links are FIFO and each stage
 * forwards the Reset after what it sent earlier), so nothing stale can arrive after it.
 * Stage 0 ignores tokens and errors for held requests until then.
 *
 * Replay: stage 0 then sends each held request's Request again with `resume_tokens` = the
 * n tokens generated so far, and queues a prefill of prompt + those n tokens (P + n rows, in
 * chunks like any prompt; step 0 activations). Every stage admits it as new; the last stage
 * samples the prefill's last row as step n (what the decode step n would have given, by
 * the reference decoder's contract that chunking and batching never change a row's result
 * - checked end to end by tests/pipeline/pipeline_recovery_test.sh, which compares tokens and
 * every logit with an undisturbed run) and the request continues at step n + 1. Tokens
 * 0..n-1 are not sent again: stage 0 expects step n next.
 *
 * Sampling state: reference/sampler.c draws one splitmix64 value per token at temperature
 * > 0 from a running state seeded by the request's seed, so the last stage's sampler after
 * n tokens is sampler_skip(n) of a fresh one. With --out (keep_logits) the last stage instead
 * computes the logits of the replayed rows of steps 0..n-1 (kept for --out) and samples them
 * in order, and checks each token against the one stage 0 sent: a replay that diverges fails
 * the request with an error rather than continuing silently.
 *
 * Bounds: a held request fails with STRATA_ETIMEOUT and a message naming the break and the
 * timeout once it has been held recovery_timeout_ms. Requests restored from a KvBlock at
 * startup (--kv-restore) are not held: they fail at once as before. Qwen3-VL requests
 * are: stage 0 keeps their vision inputs (req->vl), and a replay chunk's rows past the
 * prompt are text rows at their decode positions (stage_vl_fill).
 *
 * KV copies: with send_kv on every stage, stage 0 keeps each later stage's KV block per
 * request, and a replay restores every stage's KV from them and prefills only the rows after
 * (stage_recovery_kv.c, which also has the rule for when that is cheaper).
 *
 * Stage 0 dying: stage 0 holds what a replay needs, so when it dies the client resubmits
 * (runtime/stage/client.h, strata-client --reconnect-timeout-ms): the same Request to the
 * new stage 0 with `resume_tokens` = the tokens it received. Stage 0 admits it as a replay;
 * the other stages drop a stale copy of the nonce when a resumed Request for it arrives
 * (stage_recovery_drop_stale). */
#include <stdio.h>
#include <string.h>

#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_core_internal.h"

#define RESET_RETRY_MS 100 /* a Reset that did not come back is sent again after this */

void stage_drop_items(struct stage_core *core, uint64_t nonce) {
    struct stage_item **link = &core->work.head;
    core->work.tail = NULL;
    while (*link) {
        struct stage_item *it = *link;
        if (it->nonce == nonce) {
            *link = it->next;
            stage_item_put(core, it);
        } else {
            core->work.tail = it;
            link = &it->next;
        }
    }
}

int stage_recovery_hold(struct stage_core *core, struct stage_req *req, const char *why) {
    if (!core->is_first || core->opt.num_stages < 2 || core->opt.recovery_timeout_ms <= 0 ||
        req->restored)
        return 0;
    stage_drop_items(core, req->nonce);
    if (!req->held) {
        req->held = 1;
        req->held_at_ms = -1;
        snprintf(req->held_why, sizeof req->held_why, "%s", why ? why : "a link was lost");
    }
    req->replaying = 0;
    return 1;
}

/* Stage 0: empties a held request's KV slot for the replay. The backend hands out the
 * lowest free slot, so the request may move to another slot (its record and prompt row
 * follow; core->reqs is indexed by slot). Returns where it is now. */
struct stage_req *stage_recovery_fresh_slot(struct stage_core *core, struct stage_req *req) {
    int old = req->slot, slot;
    struct stage_req *dst;
    stage_backend_kv_release(core->be, old);
    if (stage_backend_kv_acquire(core->be, &slot) < 0 || slot == old) {
        req->slot = old; /* cannot fail: a slot was just freed (this one when it is lowest) */
        slot = old;
    }
    /* Cannot fail either: the blocks it held and was promised were just given back. */
    stage_backend_kv_reserve(core->be, slot, req->params.prompt_len + req->params.max_tokens - 1);
    if (slot == old) return req;
    dst = &core->reqs[slot];
    *dst = *req;
    dst->slot = slot;
    dst->prompt = core->prompts + (size_t)slot * (size_t)core->max_seq;
    memcpy(dst->prompt, req->prompt, sizeof(int32_t) * (size_t)req->params.prompt_len);
    memset(req, 0, sizeof *req);
    return dst;
}

int stage_recovery_send_request(struct stage_core *core, struct stage_req *req, const char *what) {
    const struct request_params *p = &req->params;
    struct wire_request msg = {.nonce = req->nonce,
                               .prompt = req->prompt,
                               .prompt_len = (size_t)p->prompt_len,
                               .max_tokens = p->max_tokens,
                               .temperature = p->sampling.temperature,
                               .top_k = p->sampling.top_k,
                               .top_p = p->sampling.top_p,
                               .seed = p->sampling.seed,
                               .stop_ids = p->stop_ids,
                               .num_stop_ids = (size_t)p->num_stop_ids,
                               .resume_tokens = req->tokens,
                               .num_resume_tokens = (size_t)req->n_generated,
                               /* Cold, but every stage keeps the prompt's blocks when it
                                * finishes, as stage 0 does (stage_prefix_internal.h). */
                               .block_keys = req->keys,
                               .num_block_keys = (size_t)req->n_keys};
    int rc = wire_build_request(&core->arena, &msg);
    if (rc == 0) rc = stage_emit_arena(core, STAGE_LINK_NEXT, 0);
    if (rc < 0)
        stage_fail(core, req, rc, 0, 0, "stage 0: %s request %llu: %s", what,
                   (unsigned long long)req->nonce, strata_last_error());
    return rc;
}

/* Stage 0: one held request goes round again, from step n = tokens known. A Qwen3-VL
 * request's Request goes on as stage 0 first forwarded it (the expanded prompt, no vision
 * tensors: stage_vl_forward_fields); stage 0 still holds its vision inputs (req->vl), and
 * the replay's image rows carry them like the first prefill's did. */
static void replay(struct stage_core *core, struct stage_req *req) {
    req->held = 0;
    req->prefix_wait = 0; /* a replay is cold (stage_prefix_internal.h) */
    req->cached_blocks = 0;
    /* A fresh slot, or with KV copies one restored to m positions (stage_recovery_kv.c). */
    int m = stage_recovery_kv_restore(core, &req);
    if (m < 0) return; /* failed, and gone */
    if (stage_recovery_send_request(core, req, "replaying") < 0) return;
    req->params.resume_len = req->n_generated;
    req->replaying = 1;
    core->stats.replayed++;
    stage_recovery_queue_prefill_from(core, req, m);
}

int stage_recovery_queue_prefill(struct stage_core *core, struct stage_req *req) {
    return stage_recovery_queue_prefill_from(core, req, 0);
}

int stage_recovery_queue_prefill_from(struct stage_core *core, struct stage_req *req, int from) {
    int P = req->params.prompt_len, n = req->params.resume_len, R = P + n;
    int chunk = stage_prefill_chunk(core, R - from);
    /* The resumed tokens follow the prompt in the slot's row (admit checked that prompt +
     * max_tokens - 1 >= R positions fit max_seq). */
    if (n > 0) memcpy(req->prompt + P, req->tokens, sizeof(int32_t) * (size_t)n);
    req->spec_rows = 0; /* a prefill: no step with drafts in flight */
    req->n_waves = 0;
    for (int pos = from; pos < R; pos += chunk) {
        int rows = R - pos < chunk ? R - pos : chunk;
        if (stage_enqueue_ids(core, req->nonce, pos, rows, req->prompt + pos) < 0) {
            stage_fail(core, req, STRATA_ENOMEM, 0, 1, "stage 0: %s", strata_last_error());
            return STRATA_ENOMEM;
        }
    }
    req->recv_pos = R;
    return 0;
}

void stage_recovery_on_reset(struct stage_core *core, enum stage_link from, uint64_t seq) {
    (void)from;
    if (!core->is_first) {
        for (int i = 0; i < core->max_batch; i++)
            if (core->reqs[i].active && (!core->reqs[i].restored || core->reqs[i].kv_recovered))
                stage_release(core, &core->reqs[i], STAGE_FINISH_CANCELLED, STRATA_ECANCELED,
                              "dropped by stage 0's ring reset (stage 0 replays it)");
        stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_RESET, 0, seq);
        return;
    }
    if (!core->recovery.reset_pending || seq != core->recovery.reset_epoch)
        return; /* an older attempt */
    core->recovery.reset_pending = 0;
    for (int i = 0; i < core->max_batch; i++)
        if (core->reqs[i].active && core->reqs[i].held) replay(core, &core->reqs[i]);
}

int stage_core_recovery_tick(struct stage_core *core, int64_t now_ms, int ring_up) {
    int held = 0;
    if (!core->is_first || core->opt.num_stages < 2) return 0;
    for (int i = 0; i < core->max_batch; i++) {
        struct stage_req *req = &core->reqs[i];
        if (!req->active || !req->held) continue;
        if (req->held_at_ms < 0) req->held_at_ms = now_ms;
        if (now_ms - req->held_at_ms >= core->opt.recovery_timeout_ms) {
            stage_fail(core, req, STRATA_ETIMEOUT, 0, 0,
                       "stage 0: request %llu: the pipeline broke (%s) and did not re-form "
                       "within --recovery-timeout-ms %d",
                       (unsigned long long)req->nonce, req->held_why,
                       core->opt.recovery_timeout_ms);
            continue;
        }
        held++;
    }
    if (held == 0) {
        core->recovery.reset_pending = 0;
        return 0;
    }
    if (ring_up && (!core->recovery.reset_pending ||
                    now_ms - core->recovery.reset_sent_ms >= RESET_RETRY_MS)) {
        /* Every request in flight is dropped downstream by the Reset: hold them all. */
        for (int i = 0; i < core->max_batch; i++)
            if (core->reqs[i].active && !core->reqs[i].held &&
                !stage_recovery_hold(core, &core->reqs[i], "the ring was reset"))
                stage_fail(core, &core->reqs[i], STRATA_EPEER, 0, 1,
                           "stage 0: request %llu cannot be replayed after a ring break "
                           "(requests restored from a KV block are not recovered)",
                           (unsigned long long)core->reqs[i].nonce);
        core->recovery.reset_epoch++;
        core->recovery.reset_sent_ms = now_ms;
        core->recovery.reset_pending = 1;
        stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_RESET, 0,
                           core->recovery.reset_epoch);
    }
    return held;
}

void stage_core_set_recovery_timeout(struct stage_core *core, int timeout_ms) {
    core->opt.recovery_timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

void stage_core_fail_held(struct stage_core *core, const char *why) {
    for (int i = 0; i < core->max_batch; i++) {
        struct stage_req *req = &core->reqs[i];
        if (req->active && req->held)
            stage_fail(core, req, STRATA_EPEER, 0, 0, "stage 0: request %llu: %s (held after: %s)",
                       (unsigned long long)req->nonce, why, req->held_why);
    }
}

void stage_recovery_drop_stale(struct stage_core *core, const struct wire_request *msg) {
    struct stage_req *req = stage_find(core, msg->nonce);
    if (req && !req->restored && !core->is_first)
        stage_release(core, req, STAGE_FINISH_CANCELLED, STRATA_ECANCELED,
                      "replaced by its recovery replay");
}

int stage_recovery_admit_resumed(struct stage_core *core, struct stage_req *req,
                                 const struct wire_request *msg) {
    int n = (int)msg->num_resume_tokens;
    for (int i = 0; i < n; i++) {
        if (msg->resume_tokens[i] < 0 || msg->resume_tokens[i] >= core->vocab) {
            stage_fail(core, req, STRATA_EINVAL, 1, 1,
                       "stage %d: resume token %d at step %d is outside the vocabulary [0, %d)",
                       core->opt.stage_index, msg->resume_tokens[i], i, core->vocab);
            return STRATA_EINVAL;
        }
    }
    memcpy(req->tokens, msg->resume_tokens, sizeof(int32_t) * (size_t)n);
    req->n_generated = n;
    /* The sampler continues at step n; with --out the replayed rows are sampled instead
     * (stage_recovery_replay_logits), which also checks them. */
    if (core->is_last && !core->opt.keep_logits) sampler_skip(&req->sampler, n);
    if (core->is_first) {
        req->replaying = 1; /* a client's resubmission after stage 0 died */
        core->stats.replayed++;
    }
    return 0;
}

/* One replayed prefill item's rows [lo, hi) (absolute positions) that give the logits of
 * steps 0..n-1: logits, kept, sampled and checked against stage 0's tokens. 0, or -1 when
 * the request failed (it is gone). */
static int replay_rows(struct stage_core *core, struct stage_req *req, const float *hidden, int lo,
                       int hi) {
    int H = core->hidden_size, V = core->vocab, P = req->params.prompt_len;
    for (int p = lo; p < hi;) {
        int k = hi - p < core->max_batch ? hi - p : core->max_batch;
        int rc;
        memcpy(core->last_rows, hidden + (size_t)(p - lo) * H, sizeof(float) * (size_t)k * H);
        rc = stage_backend_logits(core->be, core->logits, core->last_rows, k);
        if (rc < 0) {
            stage_fail(core, req, rc, 1, 1, "stage %d: logits: %s", core->opt.stage_index,
                       strata_last_error());
            return -1;
        }
        for (int j = 0; j < k; j++, p++) {
            const float *row = core->logits + (size_t)j * V;
            int step = p - P + 1;
            int token = sampler_sample(&req->sampler, row, V, core->sampler_scratch);
            if (stage_keep_logits_row(req, (uint64_t)step, row, V) < 0) {
                stage_fail(core, req, STRATA_ENOMEM, 1, 1, "stage %d: out of memory for logits",
                           core->opt.stage_index);
                return -1;
            }
            if (token != req->tokens[step]) {
                stage_fail(core, req, STRATA_EINVAL, 1, 1,
                           "stage %d: the replay of request %llu diverged at step %d: token %d, "
                           "stage 0 has %d (a recomputed row differs: determinism broken)",
                           core->opt.stage_index, (unsigned long long)req->nonce, step, token,
                           req->tokens[step]);
                return -1;
            }
        }
    }
    return 0;
}

void stage_recovery_replay_logits(struct stage_core *core, int n, const int *row_off) {
    for (int i = 0; i < n; i++) {
        struct stage_item *it = core->picked[i];
        struct stage_req *req = stage_find(core, it->nonce);
        int P, R, lo, hi;
        if (!req || row_off[i] < 0 || it->step != 0 || req->params.resume_len == 0) continue;
        /* Row at position p gives the logits of step p - P + 1; steps < n were generated
         * before the break: rows [P - 1, R - 1). */
        P = req->params.prompt_len;
        R = stage_prefill_len(req);
        lo = it->pos > P - 1 ? it->pos : P - 1;
        hi = it->pos + it->n_tokens < R - 1 ? it->pos + it->n_tokens : R - 1;
        if (lo < hi)
            replay_rows(core, req,
                        core->hidden + (size_t)(row_off[i] + lo - it->pos) * core->hidden_size, lo,
                        hi);
    }
}
