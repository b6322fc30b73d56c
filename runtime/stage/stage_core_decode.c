/* Stage core, a running request's data path: hidden rows arriving on stages r > 0 (checked
 * against the request, rewound into a step's drafts when speculating) and its tokens coming
 * back on stage 0 (to the client, the finish, the next decode step). Design: stage_core.h;
 * admission and the rest of the messages: stage_core.c. */
#include <stdio.h>
#include <string.h>

#include "reference/kv_blocks.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_core_internal.h"

/* Stages r > 0: hidden rows from stage r-1, checked against the request's state. */
int stage_on_activation(struct stage_core *core, const struct wire_activation *msg) {
    int r = core->opt.stage_index, rc, rows;
    struct stage_req *req = stage_find(core, msg->nonce);
    char why[512];
    uint64_t want_step;
    if (msg->nonce == 0)
        return strata_set_error(STRATA_EFORMAT,
                                "stage %d: activation with the reserved nonce 0 from stage %d", r,
                                msg->stage_from);
    if (!req) {
        if (stage_recently_ended(core, msg->nonce)) return 0;
        snprintf(why, sizeof why,
                 "stage %d: activation for unknown request nonce %llu (step %llu, pos %llu)", r,
                 (unsigned long long)msg->nonce, (unsigned long long)msg->step,
                 (unsigned long long)msg->pos);
        stage_emit_error(core, STAGE_LINK_PREV, 0, STRATA_EFORMAT, msg->nonce, why);
        return 0;
    }
    if (req->restored) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1,
                   "stage %d: an activation for restored request %llu arrived before its Request",
                   r, (unsigned long long)req->nonce);
        return 0;
    }
    rows = msg->hidden.ndim == 2 && msg->hidden.shape[0] >= 1 &&
                   msg->hidden.shape[0] <= core->opt.max_batch_tokens
               ? (int)msg->hidden.shape[0]
               : -1;
    if (msg->stage_to != r || msg->stage_from != r - 1) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1,
                   "stage %d: activation addressed from stage %d to stage %d, expected %d -> %d", r,
                   msg->stage_from, msg->stage_to, r - 1, r);
        return 0;
    }
    /* A decode step may start inside the previous one's drafts: their rows are dropped. */
    if (req->recv_pos >= stage_prefill_len(req) && msg->step > 0 &&
        msg->pos <= (uint64_t)req->recv_pos &&
        (rc = stage_spec_rewind(core, req, (int)msg->pos, msg->has_fed_id, why, sizeof why)) < 0) {
        stage_fail(core, req, rc, 1, 1, "%s", why);
        return 0;
    }
    want_step = req->recv_pos < stage_prefill_len(req)
                    ? 0
                    : (uint64_t)(req->recv_pos - req->params.prompt_len + 1);
    if (msg->step != want_step || msg->pos != (uint64_t)req->recv_pos) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1,
                   "stage %d: activation for nonce %llu at step %llu pos %llu, expected step %llu "
                   "pos %d",
                   r, (unsigned long long)msg->nonce, (unsigned long long)msg->step,
                   (unsigned long long)msg->pos, (unsigned long long)want_step, req->recv_pos);
        return 0;
    }
    if (msg->hidden.dtype != WIRE_DTYPE_F32 || rows < 1 ||
        msg->hidden.shape[1] != core->hidden_size || rows > core->opt.max_batch_tokens ||
        (want_step == 0 && req->recv_pos + rows > stage_prefill_len(req)) ||
        (want_step > 0 && (size_t)rows != 1 + msg->num_draft_ids) ||
        (want_step == 0 && msg->num_draft_ids > 0) || req->recv_pos + rows > core->max_seq ||
        (want_step > 0 && want_step + (uint64_t)rows > (uint64_t)req->params.max_tokens)) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1,
                   "stage %d: activation hidden for nonce %llu is not F32 [T, %d] with 1 <= T <= "
                   "%d fitting the request (got %s rank %d, T %d, %zu draft ids)",
                   r, (unsigned long long)msg->nonce, core->hidden_size, core->opt.max_batch_tokens,
                   wire_dtype_name(msg->hidden.dtype), msg->hidden.ndim, rows, msg->num_draft_ids);
        return 0;
    }
    if (stage_vl_check_activation(core, msg, rows) < 0) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1, "stage %d: nonce %llu: %s", r,
                   (unsigned long long)msg->nonce, strata_last_error());
        return 0;
    }
    rc = stage_enqueue(core, req->nonce, msg->step, req->recv_pos, rows, NULL, 0, &msg->hidden);
    if (rc == 0) rc = stage_vl_take_activation(core, core->work.tail, msg);
    if (rc < 0) {
        stage_fail(core, req, rc, 1, 1, "stage %d: %s", r, strata_last_error());
        return 0;
    }
    core->work.tail->n_drafts = (int)msg->num_draft_ids;
    core->work.tail->has_fed_id = msg->has_fed_id;
    core->work.tail->fed_id = msg->fed_id;
    if (msg->num_draft_ids)
        memcpy(core->work.tail->drafts, msg->draft_ids, sizeof(int32_t) * msg->num_draft_ids);
    req->spec_pos = req->recv_pos;
    req->spec_rows = want_step > 0 ? rows : 0;
    req->recv_pos += rows;
    return 0;
}

/* Stage 0: one token for `req` at `step`, to its client; 1 when it ended the request. */
static int take_token(struct stage_core *core, struct stage_req *req, uint64_t step,
                      int32_t token) {
    enum wire_finish finish = WIRE_FINISH_NONE;
    req->tokens[req->n_generated++] = token;
    if (req->replaying) { /* the first new token of a replayed request */
        req->replaying = 0;
        core->stats.recovered++;
    }
    for (int i = 0; i < req->params.num_stop_ids; i++)
        if (token == req->params.stop_ids[i]) finish = WIRE_FINISH_STOP;
    if (finish == WIRE_FINISH_NONE && req->n_generated >= req->params.max_tokens)
        finish = WIRE_FINISH_LENGTH;
    const struct stage_token_fields counts = {.cached = req->cached_blocks * KV_BLOCK,
                                              .accepted = req->spec_accepted,
                                              .rejected = req->spec_drafted - req->spec_accepted,
                                              .prompt = req->params.prompt_len};
    stage_emit_token(core, STAGE_LINK_CLIENT, req->client_id, req->nonce, step, token, finish,
                     &counts);
    if (finish == WIRE_FINISH_NONE) return 0;
    /* The answer's blocks are kept with the prompt's, on every stage. */
    stage_prefix_answer(core, req);
    const struct stage_token_fields answer = {
        .block_keys = req->n_answer_keys ? req->keys + req->n_keys : NULL,
        .num_block_keys = req->n_answer_keys};
    if (core->opt.num_stages > 1)
        stage_emit_token(core, STAGE_LINK_NEXT, 0, req->nonce, step, token, finish, &answer);
    stage_release(core, req, finish == WIRE_FINISH_STOP ? STAGE_FINISH_STOP : STAGE_FINISH_LENGTH,
                  0, NULL);
    return 1;
}

void stage_on_tokens(struct stage_core *core, struct stage_req *req, uint64_t step,
                     const int32_t *tokens, int n) {
    const int most = stage_spec_head_rows(req); /* the oldest step in flight's rows */
    int rc;
    if (step != (uint64_t)req->n_generated || n < 1 || n > most) {
        stage_fail(core, req, STRATA_EFORMAT, 0, 1,
                   "stage 0: %d tokens for nonce %llu at step %llu, expected 1..%d at step %d", n,
                   (unsigned long long)req->nonce, (unsigned long long)step, most,
                   req->n_generated);
        return;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= core->vocab) {
            stage_fail(core, req, STRATA_EFORMAT, 0, 1, "stage 0: token %d outside [0, %d)",
                       tokens[i], core->vocab);
            return;
        }
    if (most > 1) {
        core->spec.accepted += (uint64_t)(n - 1);
        stage_spec_after(req, most - 1, n - 1);
    }
    for (int i = 0; i < n; i++)
        if (take_token(core, req, step + (uint64_t)i, tokens[i])) return;
    /* The next steps: the one feeding the last token (with drafts when speculating), or the
     * ones already in flight when their guess held. */
    if ((rc = stage_spec_next(core, req, tokens, n)) < 0)
        stage_fail(core, req, rc, 0, 1, "stage 0: the next decode step: %s", strata_last_error());
}

int stage_on_token_result(struct stage_core *core, const struct wire_token_result *msg) {
    struct stage_req *req = stage_find(core, msg->nonce);
    if (!req) return 0;      /* ended here already (cancelled or failed) */
    if (req->held) return 0; /* from the broken ring: the replay recomputes it */
    if (msg->num_tokens < 1 || msg->num_tokens > (core->is_first ? 1 + WIRE_SPECULATE_MAX_K : 1)) {
        stage_fail(core, req, STRATA_EFORMAT, 1, 1,
                   "stage %d: token result with %zu tokens, expected %s", core->opt.stage_index,
                   msg->num_tokens, core->is_first ? "1 .. 1 + drafts" : "1");
        return 0;
    }
    if (core->is_first) {
        stage_on_tokens(core, req, msg->step, msg->tokens, (int)msg->num_tokens);
        return 0;
    }
    if (msg->finish == WIRE_FINISH_STOP || msg->finish == WIRE_FINISH_LENGTH) {
        stage_prefix_take_answer(req, msg->block_keys, msg->num_block_keys, msg->step);
        const struct stage_token_fields answer = {.block_keys = msg->block_keys,
                                                  .num_block_keys = (int)msg->num_block_keys};
        if (!core->is_last)
            stage_emit_token(core, STAGE_LINK_NEXT, 0, msg->nonce, msg->step, msg->tokens[0],
                             msg->finish, &answer);
        stage_release(core, req,
                      msg->finish == WIRE_FINISH_STOP ? STAGE_FINISH_STOP : STAGE_FINISH_LENGTH, 0,
                      NULL);
        return 0;
    }
    stage_fail(core, req, STRATA_EFORMAT, 1, 1,
               "stage %d: unexpected token result (finish %d) for nonce %llu",
               core->opt.stage_index, (int)msg->finish, (unsigned long long)msg->nonce);
    return 0;
}
