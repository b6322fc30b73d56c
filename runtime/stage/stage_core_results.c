/* Stage core, how requests end and what the core hands out: the outgoing Error, TokenResult
 * and Control frames, the result records the driver pops (from a pool: ending a request
 * allocates nothing), release (a request's slot, items and buffers freed, its nonce
 * remembered) and stage_fail (Error frames up, down and to the client, then release).
 * Apart from stage_core.c (admission, frames in, cancel, link loss) because every part of
 * the core ends requests the same way - the message side, the step, recovery, describe -
 * and this is the one owner of that; declared in stage_core_internal.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_core_internal.h"

void stage_free_req_buffers(struct stage_core *core, struct stage_req *req) {
    stage_recovery_kv_drop(core, req);
    stage_spec_drop(core, req);
    stage_vl_free(req->vl);
    free(req->keys);
    free(req->tokens);
    free(req->logits);
    memset(req, 0, sizeof *req);
}

/* Queues a copy of the arena's frame for `link`. */
int stage_emit_arena(struct stage_core *core, enum stage_link link, uint32_t client_id) {
    return stage_emit_raw(core, link, client_id, wire_arena_frame(&core->arena),
                          wire_arena_frame_len(&core->arena));
}

/* A frame or result the core could not queue (out of memory) is never dropped silently:
 * it is counted and described, and stage_core_pop_result reports the loss. */
void stage_note_lost(struct stage_core *core, const char *what, uint64_t nonce) {
    if (core->outbox.lost++ == 0)
        snprintf(core->outbox.lost_first, sizeof core->outbox.lost_first, "%s for request %llu: %s",
                 what, (unsigned long long)nonce, strata_last_error());
    core->stats.lost++;
}

void stage_emit_error(struct stage_core *core, enum stage_link link, uint32_t client_id, int code,
                      uint64_t nonce, const char *message) {
    struct wire_error msg = {.code = code, .message = message, .nonce = nonce};
    if (wire_build_error(&core->arena, &msg) < 0 || stage_emit_arena(core, link, client_id) < 0)
        stage_note_lost(core, "an Error frame", nonce);
}

void stage_emit_token(struct stage_core *core, enum stage_link link, uint32_t client_id,
                      uint64_t nonce, uint64_t step, int32_t token, enum wire_finish finish,
                      const struct stage_token_fields *fields) {
    struct wire_token_result msg;
    memset(&msg, 0, sizeof msg);
    if (fields) {
        msg.cached_tokens = fields->cached;
        msg.accepted_tokens = fields->accepted;
        msg.rejected_tokens = fields->rejected;
        msg.prompt_tokens = fields->prompt;
        msg.block_keys = fields->block_keys;
        msg.num_block_keys = fields->num_block_keys > 0 ? (size_t)fields->num_block_keys : 0;
    }
    msg.nonce = nonce;
    msg.step = step;
    msg.tokens = &token;
    msg.num_tokens = 1;
    msg.finish = finish;
    if (wire_build_token_result(&core->arena, &msg) < 0 ||
        stage_emit_arena(core, link, client_id) < 0)
        stage_note_lost(core, "a TokenResult frame", nonce);
}

void stage_emit_control(struct stage_core *core, enum stage_link link, uint32_t client_id,
                        enum wire_control_kind kind, uint64_t nonce, uint64_t seq) {
    struct wire_control msg = {.kind = kind, .nonce = nonce, .seq = seq};
    if (wire_build_control(&core->arena, &msg) < 0 || stage_emit_arena(core, link, client_id) < 0)
        stage_note_lost(core, "a Control frame", nonce);
}

/* A cleared result record: from the pool filled at init (stage_pool.c), so ending a
 * request needs no allocation while results are drained; NULL (loss noted) only when the
 * pool is empty and memory is out. */
static struct stage_result_node *result_node(struct stage_core *core, uint64_t nonce) {
    struct stage_result_node *node = core->outbox.free_results;
    if (node)
        core->outbox.free_results = node->next;
    else
        node = malloc(sizeof *node);
    if (!node) {
        strata_set_error(STRATA_ENOMEM, "out of memory for a result record");
        stage_note_lost(core, "a result", nonce);
        return NULL;
    }
    memset(node, 0, sizeof *node);
    return node;
}

static void push_result(struct stage_core *core, struct stage_result_node *node) {
    if (core->outbox.res_tail)
        core->outbox.res_tail->next = node;
    else
        core->outbox.res_head = node;
    core->outbox.res_tail = node;
}

/* A request that never got a slot here (refused): a result for the driver's log. */
void stage_push_refusal(struct stage_core *core, uint64_t nonce, int code, const char *msg) {
    struct stage_result_node *node = result_node(core, nonce);
    if (!node) return;
    node->result.nonce = nonce;
    node->result.finish = STAGE_FINISH_ERROR;
    node->result.status = code;
    node->result.vocab = core->vocab;
    snprintf(node->result.message, sizeof node->result.message, "%s", msg);
    push_result(core, node);
}

/* Ends a request here: result (taking its tokens and logits), queued items dropped, KV
 * slot freed, nonce remembered so late frames for it are dropped quietly. */
void stage_release(struct stage_core *core, struct stage_req *req, enum stage_finish finish,
                   int status, const char *message) {
    struct stage_result_node *node = result_node(core, req->nonce);
    stage_drop_items(core, req->nonce);
    if (node) {
        struct stage_result *r = &node->result;
        r->nonce = req->nonce;
        r->finish = finish;
        r->status = status;
        snprintf(r->message, sizeof r->message, "%s", message ? message : "");
        r->prompt_len = req->params.prompt_len;
        r->vocab = core->vocab;
        r->drafted = req->spec_drafted;
        r->accepted = req->spec_accepted;
        if (core->is_first || core->is_last) {
            r->n_tokens = req->n_generated;
            r->tokens = req->tokens;
            req->tokens = NULL;
        }
        if (req->logits) {
            r->logits = req->logits;
            req->logits = NULL;
        }
        push_result(core, node);
    }
    core->recent_dead[core->recent_dead_next] = req->nonce;
    core->recent_dead_next = (core->recent_dead_next + 1) % STAGE_RECENT_DEAD;
    if (finish == STAGE_FINISH_STOP || finish == STAGE_FINISH_LENGTH) stage_prefix_keep(core, req);
    stage_backend_kv_release(core->be, req->slot);
    stage_free_req_buffers(core, req);
}

void stage_fail(struct stage_core *core, struct stage_req *req, int code, int up, int down,
                const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (core->is_first)
        stage_emit_error(core, STAGE_LINK_CLIENT, req->client_id, code, req->nonce, message);
    if (up && !core->is_first)
        stage_emit_error(core, STAGE_LINK_PREV, 0, code, req->nonce, message);
    if (down && core->opt.num_stages > 1)
        stage_emit_error(core, STAGE_LINK_NEXT, 0, code, req->nonce, message);
    stage_release(core, req, STAGE_FINISH_ERROR, code, message);
}

int stage_core_pop_result(struct stage_core *core, struct stage_result *out) {
    struct stage_result_node *node = core->outbox.res_head;
    memset(out, 0, sizeof *out);
    if (!node) {
        if (core->outbox.lost == 0) return 0;
        /* What could not be queued, reported once all real records are out. */
        out->finish = STAGE_FINISH_ERROR;
        out->status = STRATA_ENOMEM;
        out->vocab = core->vocab;
        snprintf(out->message, sizeof out->message,
                 "stage %d: %llu frame(s) or result(s) could not be queued (out of memory); "
                 "the first: %.140s",
                 core->opt.stage_index, (unsigned long long)core->outbox.lost,
                 core->outbox.lost_first);
        core->outbox.lost = 0;
        return 1;
    }
    core->outbox.res_head = node->next;
    if (!core->outbox.res_head) core->outbox.res_tail = NULL;
    *out = node->result;
    node->next = core->outbox.free_results;
    core->outbox.free_results = node;
    return 1;
}

void stage_result_free(struct stage_result *result) {
    if (!result) return;
    free(result->tokens);
    free(result->logits);
    result->tokens = NULL;
    result->logits = NULL;
}
