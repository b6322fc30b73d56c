/* Stage core, compute side: forms one microbatch from the pending work (arrival order, at
 * most one item per request, bounded rows), runs it through the stage's layers with a
 * single backend forward call, and turns the result into outgoing activations (or,
 * on the last stage, sampled tokens). Also KV restore. Design: stage_core.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_core_internal.h"
#include "runtime/stage/kv_block.h"

int stage_core_has_work(const struct stage_core *core) {
    return core->work.head != NULL;
}

void stage_core_idle(struct stage_core *core) {
    stage_backend_idle(core->be);
}

/* How many requests one microbatch may hold. Stage 0 is the pipeline's scheduler: it cuts
 * its N active requests into S groups of ceil(N / S), so the groups travel the ring one
 * behind the other and, with N >= S, every stage has a group to compute at once (one big
 * batch would visit the stages in turn and leave S - 1 of them idle). Later stages take
 * whatever has arrived. */
static int batch_limit(const struct stage_core *core) {
    int active = 0, S = core->opt.num_stages;
    if (!core->is_first || S == 1) return core->max_batch;
    for (int i = 0; i < core->max_batch; i++)
        active += core->reqs[i].active;
    return active <= S ? 1 : (active + S - 1) / S;
}

/* Collects each request's first queued item (a request's items run in order, one per
 * microbatch) into core->picked in queue order; returns how many. Drops items of requests
 * no longer held (cannot happen: release() drops them; never spin on one). */
static int collect_candidates(struct stage_core *core) {
    struct stage_item **link = &core->work.head;
    int n = 0;
    for (int i = 0; i < core->max_batch; i++)
        core->reqs[i].picked = 0;
    core->work.tail = NULL;
    while (*link) {
        struct stage_item *it = *link;
        struct stage_req *req = stage_find(core, it->nonce);
        if (!req) {
            *link = it->next;
            stage_item_put(core, it);
            continue;
        }
        it->taken = 0;
        if (!req->picked) core->picked[n++] = it;
        req->picked = 1;
        core->work.tail = it;
        link = &it->next;
    }
    return n;
}

/* Whether candidate i (in queue order) joins the microbatch being formed, given the rows
 * and prompt chunks taken so far; `chunks_behind` counts the prompt chunks among all
 * candidates but the oldest. Stage 0 of a pipeline (the scheduler):
 *   - always takes the oldest item, so an item is passed over at most as many times as
 *     items were queued before it;
 *   - takes at most one prompt chunk: a chunk is sized to stream through the stages
 *     (prefill_chunk), and a microbatch of several stalls the next stage for as long as
 *     the extra chunks take;
 *   - adds decode rows only when no prompt chunk is queued but the oldest item. A chunk
 *     keeps the stages after it as busy as a decode row would, while a request that
 *     starts decoding late also finishes late, alone on a ring whose hops then leave the
 *     stages idle (prompts first gave the fewest bubbles in strata-sim).
 * Other stages take whatever has arrived, within the row budget. */
static int joins(const struct stage_core *core, int i, int rows, int chunks, int chunks_behind) {
    const struct stage_item *it = core->picked[i];
    if (rows + it->n_tokens > core->opt.max_batch_tokens) return 0;
    if (!core->is_first || core->opt.num_stages == 1 || i == 0) return 1;
    return it->step == 0 ? chunks == 0 : chunks_behind == 0;
}

/* Picks the microbatch into core->picked (in queue order) and unlinks it from the queue;
 * returns its size. */
static int pick_items(struct stage_core *core, int *rows_out) {
    int n = 0, rows = 0, chunks = 0, chunks_behind = 0, limit = batch_limit(core);
    int n_cand = collect_candidates(core);
    struct stage_item **link = &core->work.head;
    for (int i = 1; i < n_cand; i++)
        chunks_behind += core->picked[i]->step == 0;
    for (int i = 0; i < n_cand && n < limit; i++) {
        struct stage_item *it = core->picked[i];
        if (!joins(core, i, rows, chunks, chunks_behind)) continue;
        it->taken = 1;
        n++;
        rows += it->n_tokens;
        chunks += it->step == 0;
    }
    n = 0;
    core->work.tail = NULL;
    while (*link) {
        struct stage_item *it = *link;
        if (it->taken) {
            *link = it->next;
            it->next = NULL;
            core->picked[n++] = it;
        } else {
            core->work.tail = it;
            link = &it->next;
        }
    }
    *rows_out = rows;
    return n;
}

static void send_activation(struct stage_core *core, const struct stage_item *it,
                            const struct stage_req *req, const float *hidden,
                            const struct forward_item *fi) {
    struct wire_activation msg;
    int rc;
    memset(&msg, 0, sizeof msg);
    msg.stage_from = core->opt.stage_index;
    msg.stage_to = core->opt.stage_index + 1;
    msg.step = it->step;
    msg.pos = (uint64_t)it->pos;
    msg.nonce = it->nonce;
    msg.hidden.defined = 1;
    msg.hidden.dtype = WIRE_DTYPE_F32;
    msg.hidden.ndim = 2;
    msg.hidden.shape[0] = it->n_tokens;
    msg.hidden.shape[1] = core->hidden_size;
    msg.hidden.codec = WIRE_CODEC_NONE;
    msg.hidden.data = hidden;
    msg.hidden.nbytes = sizeof(float) * (size_t)it->n_tokens * core->hidden_size;
    if (it->step > 0 && it->n_tokens > 1) { /* a decode step's drafts travel with its rows */
        msg.draft_ids = core->is_first ? it->tokens + 1 : it->drafts;
        msg.num_draft_ids = (size_t)it->n_tokens - 1;
    }
    /* With several steps in flight, the id row 0 feeds: the last stage drops a step drafted on
     * a guess that the step before it did not confirm. */
    if (it->step > 0 && core->is_first && core->spec.waves > 1) {
        msg.has_fed_id = 1;
        msg.fed_id = it->tokens ? it->tokens[0] : it->token;
    } else if (it->step > 0 && it->has_fed_id) {
        msg.has_fed_id = 1;
        msg.fed_id = it->fed_id;
    }
    stage_vl_attach(core, fi, &msg); /* M-RoPE positions, DeepStack rows (Qwen3-VL) */
    rc = wire_build_activation(&core->arena, &msg);
    if (rc == 0) rc = stage_emit_arena(core, STAGE_LINK_NEXT, 0);
    if (rc < 0)
        stage_fail(core, (struct stage_req *)req, rc, 1, 1, "stage %d: sending activation: %s",
                   core->opt.stage_index, strata_last_error());
}

static void send_kv(struct stage_core *core, struct stage_req *req, uint64_t step) {
    struct kv_handoff pack;
    struct wire_kv_block block;
    int rc = stage_backend_kv_pack(core->be, &pack, &req->slot, 1);
    if (rc == 0) {
        kv_block_from_handoff(&block, &pack);
        block.stage_from = core->opt.stage_index;
        block.stage_to = (core->opt.stage_index + 1) % core->opt.num_stages;
        block.step = step;
        block.nonce = req->nonce;
        rc = wire_build_kv_block(&core->arena, &block);
    }
    if (rc == 0) rc = stage_emit_arena(core, STAGE_LINK_NEXT, 0);
    kv_handoff_free(&pack);
    if (rc < 0)
        stage_fail(core, req, rc, 1, 1, "stage %d: sending KV: %s", core->opt.stage_index,
                   strata_last_error());
}

/* Stores logits row `step` [V] of a request, growing its buffer geometrically (a request
 * that stops early never pays for max_tokens rows). */
int stage_keep_logits_row(struct stage_req *req, uint64_t step, const float *row, int V) {
    if (step >= (uint64_t)req->params.max_tokens) return 0;
    if ((int)step >= req->logits_cap) {
        int cap = req->logits_cap ? req->logits_cap * 2 : 16;
        float *grown;
        if (cap > req->params.max_tokens) cap = req->params.max_tokens;
        if (cap <= (int)step) cap = (int)step + 1;
        grown = realloc(req->logits, sizeof(float) * (size_t)cap * V);
        if (!grown) return STRATA_ENOMEM;
        req->logits = grown;
        req->logits_cap = cap;
    }
    memcpy(req->logits + step * (size_t)V, row, sizeof(float) * V);
    return 0;
}

/* 1 when every row of the k picked in `which` samples greedily and no logits are kept:
 * then the backend's argmax gives the tokens (on a device, n ids come back instead of
 * n x V logits) and they are sampler_sample's at temperature 0, which draws nothing. */
static int all_greedy(struct stage_core *core, const int *which, int k) {
    if (core->opt.keep_logits) return 0;
    for (int j = 0; j < k; j++) {
        struct stage_req *req = stage_find(core, core->picked[which[j]]->nonce);
        if (req && req->sampler.params.temperature > 0.0f) return 0;
    }
    return 1;
}

/* Rows of a picked item that get logits: the last row of a prefill chunk that ends the
 * prompt, every row of a decode step (its fed token's and its drafts'), none else. */
static int rows_to_sample(const struct stage_item *it, const struct stage_req *req, int row_off) {
    if (!req || row_off < 0) return 0;
    if (it->step == 0) return it->pos + it->n_tokens < stage_prefill_len(req) ? 0 : 1;
    return it->n_tokens;
}

/* Last stage: one item's sampled rows [n] (logits [n, V], or the greedy ids [n]) -> its
 * tokens, to stage 0 (or, when S = 1, straight into its token loop). */
static void take_rows(struct stage_core *core, struct stage_item *it, int rc, const float *logits,
                      const int32_t *ids, int n) {
    struct stage_req *req = stage_find(core, it->nonce);
    int32_t out[1 + WIRE_SPECULATE_MAX_K];
    int m;
    if (!req) return;
    if (rc < 0) {
        stage_fail(core, req, rc, 1, 1, "stage %d: logits: %s", core->opt.stage_index,
                   strata_last_error());
        return;
    }
    /* A prefill (a replay's too) ends with the step after its resumed tokens. */
    const uint64_t step = it->step == 0 ? (uint64_t)req->params.resume_len : it->step;
    if ((m = stage_spec_verify(core, req, it, step, logits, ids, n, out)) < 0) return;
    if (core->is_first) {
        stage_on_tokens(core, req, step, out, m); /* S = 1: the ring is local */
        return;
    }
    for (int i = 0; i < m; i++)
        req->tokens[req->n_generated++] = out[i];
    if ((rc = stage_spec_keep(core, req, it->pos + it->n_tokens)) < 0) {
        stage_fail(core, req, rc, 1, 1, "stage %d: dropping rejected draft rows: %s",
                   core->opt.stage_index, strata_last_error());
        return;
    }
    struct wire_token_result msg;
    memset(&msg, 0, sizeof msg);
    msg.nonce = req->nonce;
    msg.step = step;
    msg.tokens = out;
    msg.num_tokens = (size_t)m;
    rc = wire_build_token_result(&core->arena, &msg);
    if (rc == 0) rc = stage_emit_arena(core, STAGE_LINK_NEXT, 0);
    if (rc < 0)
        stage_fail(core, req, rc, 1, 1, "stage %d: sending token: %s", core->opt.stage_index,
                   strata_last_error());
}

/* Last stage: logits for the rows that end a prefill or are a decode step, then sampling;
 * in groups of whole items of at most logit_rows rows. */
static void sample_rows(struct stage_core *core, int n, const int *row_off) {
    int H = core->hidden_size, V = core->vocab;
    int which[n > 0 ? n : 1], first[n > 0 ? n : 1], count[n > 0 ? n : 1];
    int32_t ids[core->logit_rows];
    if (core->opt.keep_logits) stage_recovery_replay_logits(core, n, row_off);
    for (int i = 0; i < n;) {
        int k = 0, items = 0, rc, greedy;
        for (; i < n; i++) {
            struct stage_item *it = core->picked[i];
            const int rows = rows_to_sample(it, stage_find(core, it->nonce), row_off[i]);
            if (rows == 0) continue;
            if (k + rows > core->logit_rows) break;
            memcpy(core->last_rows + (size_t)k * H,
                   core->hidden + (size_t)(row_off[i] + it->n_tokens - rows) * H,
                   sizeof(float) * (size_t)rows * H);
            which[items] = i;
            first[items] = k;
            count[items++] = rows;
            k += rows;
        }
        if (k == 0) continue;
        /* A row sampled at temperature > 0 needs the whole distribution (top-k / top-p rank
         * every id, the softmax sums over all of them), so such a batch gathers the logits;
         * under TP an all-greedy batch moves only each rank's best (value, id) pair. */
        greedy = all_greedy(core, which, items);
        if (greedy)
            rc = stage_backend_argmax(core->be, ids, core->last_rows, k, core->logits);
        else
            rc = stage_backend_logits(core->be, core->logits, core->last_rows, k);
        for (int j = 0; j < items; j++)
            take_rows(core, core->picked[which[j]], rc, core->logits + (size_t)first[j] * V,
                      greedy ? ids + first[j] : NULL, count[j]);
    }
}

int stage_core_step(struct stage_core *core) {
    stage_admission_pump(core);
    int H = core->hidden_size, rows = 0, n, n_items = 0, off = 0, rc = 0;
    int row_off[core->max_batch], item_of[core->max_batch];
    n = pick_items(core, &rows);
    if (n == 0) return 0;
    for (int i = 0; i < n; i++) {
        struct stage_item *it = core->picked[i];
        struct stage_req *req = stage_find(core, it->nonce);
        float *dst = core->hidden + (size_t)off * H;
        row_off[i] = -1;
        if (core->is_last && !core->is_first && req && stage_spec_stale(req, it))
            continue; /* drafted on a guess the step before it did not confirm */
        if (core->is_first) {
            const int32_t *ids = it->tokens ? it->tokens : &it->token;
            rc = stage_backend_embed(core->be, dst, ids, it->n_tokens);
            if (rc < 0) {
                stage_fail(core, req, rc, 0, 1, "stage 0: embedding: %s", strata_last_error());
                continue;
            }
        } else {
            memcpy(dst, it->hidden, sizeof(float) * (size_t)it->n_tokens * H);
        }
        core->items[n_items] =
            (struct forward_item){.slot = req->slot, .pos = it->pos, .n_tokens = it->n_tokens};
        if (core->is_first && req->vl)
            stage_vl_fill(core, req, it, dst, off, &core->items[n_items]);
        else if (!core->is_first)
            stage_vl_item(core, it, &core->items[n_items]);
        item_of[i] = n_items;
        row_off[i] = off;
        off += it->n_tokens;
        n_items++;
    }
    if (n_items > 0) {
        /* Stage 0 times its decode-only microbatches: the draft budget (step_cost.h) */
        int decode_only = core->is_first && core->opt.now_sec != NULL;
        for (int i = 0; decode_only && i < n; i++)
            decode_only = core->picked[i]->step > 0;
        const double t0 = decode_only ? core->opt.now_sec() : 0;
        rc = stage_backend_forward(core->be, core->hidden, core->items, n_items);
        if (decode_only && rc == 0) step_cost_add(&core->spec.cost, off, core->opt.now_sec() - t0);
        if (rc < 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", strata_last_error());
            for (int i = 0; i < n; i++) {
                struct stage_req *req = stage_find(core, core->picked[i]->nonce);
                if (req && row_off[i] >= 0)
                    stage_fail(core, req, rc, 1, 1, "stage %d: forward failed: %s",
                               core->opt.stage_index, why);
            }
        } else {
            core->stats.microbatches++;
            core->stats.rows += (uint64_t)off;
            for (int k = 0; k < n_items; k++) {
                const uint64_t p = (uint64_t)core->items[k].pos,
                               t = (uint64_t)core->items[k].n_tokens;
                if (t == 1)
                    core->stats.attn_decode_positions += p + 1;
                else {
                    core->stats.attn_prefill_rows += t;
                    core->stats.attn_prefill_pairs += t * p + t * (t + 1) / 2;
                }
            }
            if (core->is_last) {
                sample_rows(core, n, row_off);
                /* The last stage's KV goes to stage 0, which keeps it for a replay
                 * (stage_recovery_kv.c); after its token, which stage 0 needs first. */
                for (int i = 0; core->opt.send_kv && core->opt.num_stages > 1 && i < n; i++) {
                    struct stage_item *it = core->picked[i];
                    struct stage_req *req = stage_find(core, it->nonce);
                    if (req && row_off[i] >= 0 && it->step == 0 &&
                        it->pos + it->n_tokens == stage_prefill_len(req))
                        send_kv(core, req, it->step);
                }
            } else {
                for (int i = 0; i < n; i++) {
                    struct stage_item *it = core->picked[i];
                    struct stage_req *req = stage_find(core, it->nonce);
                    if (!req || row_off[i] < 0) continue;
                    send_activation(core, it, req, core->hidden + (size_t)row_off[i] * H,
                                    &core->items[item_of[i]]);
                    req = stage_find(core, it->nonce);
                    if (req && core->opt.send_kv && it->step == 0 &&
                        it->pos + it->n_tokens == stage_prefill_len(req))
                        send_kv(core, req, it->step);
                }
            }
        }
    }
    for (int i = 0; i < n; i++)
        stage_item_put(core, core->picked[i]);
    return rc < 0 ? rc : n;
}

int stage_core_restore_kv(struct stage_core *core, uint64_t *nonce, int *positions,
                          const uint8_t *frame, size_t len) {
    const struct stage_role *role = &core->be->role;
    struct wire_kv_block block;
    struct kv_handoff kv;
    struct stage_req *req;
    int slot, rc = wire_read_kv_block(&block, frame, len);
    if (rc < 0) return rc;
    if (block.layer_start != role->layer_start || block.layer_end != role->layer_end)
        return strata_set_error(STRATA_ERANGE,
                                "KV block holds layers [%d, %d) but this stage owns [%d, %d): "
                                "a cache is restored only into an equal layer range",
                                block.layer_start, block.layer_end, role->layer_start,
                                role->layer_end);
    if (block.nonce == 0)
        return strata_set_error(STRATA_EFORMAT, "KV block has the reserved request nonce 0");
    if (block.num_lengths != 1)
        return strata_set_error(STRATA_EFORMAT, "KV block holds %zu requests, expected 1",
                                block.num_lengths);
    if (stage_find(core, block.nonce))
        return strata_set_error(STRATA_EINVAL, "request nonce %llu is already active",
                                (unsigned long long)block.nonce);
    rc = kv_block_to_handoff(&kv, &block);
    if (rc < 0) return rc;
    rc = stage_backend_kv_acquire(core->be, &slot);
    if (rc < 0)
        return strata_set_error(rc, "no free KV slot to restore into (--max-batch %d)",
                                core->max_batch);
    rc = stage_backend_kv_restore(core->be, &slot, 1, &kv);
    if (rc < 0) {
        stage_backend_kv_release(core->be, slot);
        return rc;
    }
    req = &core->reqs[slot];
    memset(req, 0, sizeof *req);
    req->active = 1;
    req->restored = 1;
    req->nonce = block.nonce;
    req->slot = slot;
    req->recv_pos = block.lengths[0];
    *nonce = block.nonce;
    *positions = block.lengths[0];
    return 0;
}
