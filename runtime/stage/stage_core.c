/* Stage core, message side: the core's life, request admission, the frame dispatch, error /
 * cancel propagation and lost links. A running request's activations and returning tokens
 * are stage_core_decode.c's; ending requests (outgoing frames, result records, release,
 * stage_fail) is stage_core_results.c; the microbatch itself is in stage_core_step.c.
 * Design and message rules: stage_core.h. */
#include "runtime/stage/stage_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_plan.h"
#include "runtime/stage/stage_core_internal.h"
#include "wire/codec.h"

/* The backend's role must be the one this stage plays in an S-stage ring that covers
 * [0, L): stage 0 embeds from layer 0, the last stage ends at L and holds the head. */
static int check_role(const struct stage_core_options *opt) {
    const struct stage_backend *be = opt->backend;
    return stage_role_check(&be->role, be->cfg->num_layers, opt->stage_index, opt->num_stages);
}

int stage_core_init(struct stage_core **out, const struct stage_core_options *opt) {
    struct stage_core *core = NULL;
    const struct stage_backend *be = opt->backend;
    int rc;
    *out = NULL;
    if (!be || !be->cfg)
        return strata_set_error(STRATA_EINVAL, "stage core needs a backend with a config");
    rc = check_role(opt);
    if (rc < 0) return rc;
    if (opt->speculate < 0 || opt->speculate > WIRE_SPECULATE_DRAFT || opt->speculate_k < 0 ||
        opt->speculate_k > WIRE_SPECULATE_MAX_K)
        return strata_set_error(STRATA_EINVAL,
                                "speculation mode %d with %d drafts per step (off, ngram or "
                                "draft, 0..%d drafts)",
                                opt->speculate, opt->speculate_k, WIRE_SPECULATE_MAX_K);
    if ((rc = stage_spec_check_draft(opt)) < 0) return rc;
    if (opt->speculate_waves < 0 || opt->speculate_waves > STAGE_SPEC_MAX_WAVES)
        return strata_set_error(STRATA_EINVAL, "%d decode steps in flight (1..%d)",
                                opt->speculate_waves, STAGE_SPEC_MAX_WAVES);
    if (be->max_seq < 1 || be->num_slots < 1 || opt->chunk_size < 0 || opt->max_batch_tokens < 0)
        return strata_set_error(STRATA_EINVAL,
                                "max_seq (%d) and max_batch (%d) must be >= 1, chunk sizes >= 0",
                                be->max_seq, be->num_slots);
    core = calloc(1, sizeof *core);
    if (!core) return strata_set_error(STRATA_ENOMEM, "out of memory for the stage core");
    core->opt = *opt;
    core->be = opt->backend;
    core->max_batch = be->num_slots;
    core->max_seq = be->max_seq;
    if (core->opt.chunk_size == 0) core->opt.chunk_size = STAGE_PLAN_DEFAULT_CHUNK;
    if (core->opt.max_batch_tokens == 0)
        core->opt.max_batch_tokens = core->opt.chunk_size + core->max_batch;
    if (core->opt.max_batch_tokens < core->opt.chunk_size)
        core->opt.max_batch_tokens = core->opt.chunk_size;
    core->hidden_size = be->cfg->hidden_size;
    core->vocab = be->cfg->vocab_size;
    core->is_first = opt->stage_index == 0;
    core->is_last = opt->stage_index == opt->num_stages - 1;
    if (core->is_first) stage_prefix_init(core);
    core->spec.mode = opt->speculate == WIRE_SPECULATE_DEFAULT
                          ? WIRE_SPECULATE_OFF
                          : (enum wire_speculate)opt->speculate;
    core->spec.k = opt->speculate_k > 0 ? opt->speculate_k : STAGE_SPECULATE_DEFAULT_K;
    core->spec.oracle = opt->oracle;
    core->spec.waves = opt->speculate_waves > 1 ? opt->speculate_waves : 1;
    if (core->is_first && (rc = stage_spec_init_draft(core, opt->draft)) < 0) goto fail;
    rc = wire_arena_init(&core->arena, 0);
    if (rc < 0) goto fail;
    rc = stage_pool_init(core, core->max_batch);
    if (rc < 0) goto fail;
    rc = STRATA_ENOMEM;
    core->reqs = calloc((size_t)core->max_batch, sizeof *core->reqs);
    core->hidden = malloc(sizeof(float) * (size_t)core->opt.max_batch_tokens * core->hidden_size);
    core->items = calloc((size_t)core->max_batch, sizeof *core->items);
    core->picked = calloc((size_t)core->max_batch, sizeof *core->picked);
    if (!core->reqs || !core->hidden || !core->items || !core->picked) {
        strata_set_error(rc, "out of memory for stage buffers");
        goto fail;
    }
    if (core->is_first) {
        core->prompts = malloc(sizeof(int32_t) * (size_t)core->max_batch * (size_t)core->max_seq);
        if (!core->prompts) {
            strata_set_error(rc, "out of memory for the prompt rows");
            goto fail;
        }
    }
    rc = stage_vl_init(core);
    if (rc < 0) goto fail;
    if (core->is_last) {
        /* A decode step with drafts needs logits for each of its rows at once. */
        core->logit_rows =
            core->max_batch > 1 + WIRE_SPECULATE_MAX_K ? core->max_batch : 1 + WIRE_SPECULATE_MAX_K;
        core->last_rows = malloc(sizeof(float) * (size_t)core->logit_rows * core->hidden_size);
        core->logits = malloc(sizeof(float) * (size_t)core->logit_rows * core->vocab);
        core->sampler_scratch = malloc((size_t)core->vocab * 8);
        if (!core->last_rows || !core->logits || !core->sampler_scratch) {
            strata_set_error(rc, "out of memory for logits buffers");
            goto fail;
        }
    }
    *out = core;
    return 0;
fail:
    stage_core_free(core);
    return rc;
}

void stage_core_free(struct stage_core *core) {
    if (!core) return;
    stage_spec_free(core);
    stage_admission_free(core);
    stage_pool_free(core);
    for (struct stage_result_node *n = core->outbox.res_head, *next; n; n = next) {
        next = n->next;
        stage_result_free(&n->result);
        free(n);
    }
    for (struct stage_result_node *n = core->outbox.free_results, *next; n; n = next) {
        next = n->next;
        free(n);
    }
    if (core->reqs)
        for (int i = 0; i < core->max_batch; i++)
            stage_free_req_buffers(core, &core->reqs[i]);
    free(core->reqs);
    free(core->hidden);
    free(core->items);
    free(core->picked);
    free(core->last_rows);
    free(core->logits);
    free(core->sampler_scratch);
    free(core->prompts);
    stage_vl_free_core(core);
    wire_arena_free(&core->arena);
    free(core);
}

struct stage_req *stage_find(struct stage_core *core, uint64_t nonce) {
    for (int i = 0; i < core->max_batch; i++)
        if (core->reqs[i].active && core->reqs[i].nonce == nonce) return &core->reqs[i];
    return NULL;
}

int stage_recently_ended(const struct stage_core *core, uint64_t nonce) {
    for (int i = 0; i < STAGE_RECENT_DEAD; i++)
        if (core->recent_dead[i] == nonce && nonce != 0) return 1;
    return 0;
}

/* Queues one unit of work: stage 0 passes token ids (`tokens` or the single `token`),
 * other stages the received hidden rows (decoded into the item's reused buffer). */
int stage_enqueue(struct stage_core *core, uint64_t nonce, uint64_t step, int pos, int n_tokens,
                  const int32_t *tokens, int32_t token, const struct wire_tensor *hidden) {
    struct stage_item *it = stage_item_get(core, hidden ? n_tokens : 0);
    if (!it) return STRATA_ENOMEM;
    if (hidden) {
        int rc = wire_tensor_decode_f32(it->hidden, hidden);
        if (rc < 0) {
            stage_item_put(core, it);
            return rc;
        }
    }
    it->nonce = nonce;
    it->step = step;
    it->pos = pos;
    it->n_tokens = n_tokens;
    it->token = token;
    it->tokens = tokens;
    if (core->work.tail)
        core->work.tail->next = it;
    else
        core->work.head = it;
    core->work.tail = it;
    return 0;
}

/* The KV positions a request fills at most: its prompt and every token but the last. */
static int64_t kv_need(const struct request_params *params) {
    return (int64_t)params->prompt_len + params->max_tokens - 1;
}

/* STRATA_ERANGE (with `why`) when a request cannot fit a slot's --max-seq positions. */
static int check_fit(const struct stage_core *core, const struct request_params *params, char *why,
                     size_t why_cap) {
    const int64_t need = kv_need(params);
    if (need <= core->max_seq) return 0;
    snprintf(why, why_cap,
             "stage %d: request needs %lld KV positions (prompt %d + max_tokens %d - 1) but "
             "--max-seq is %d",
             core->opt.stage_index, (long long)need, params->prompt_len, params->max_tokens,
             core->max_seq);
    return STRATA_ERANGE;
}

/* Claims a slot for a new request, with `cached` leading blocks of keys [n_keys] (taken over:
 * freed with the request or here) attached from the cache (stage_prefix.c); on refusal fills
 * `why` and returns the status. */
static int admit(struct stage_core *core, struct stage_req **out, uint64_t nonce,
                 const struct request_params *params, uint64_t *keys, int n_keys, int cached,
                 char *why, size_t why_cap) {
    int slot;
    struct stage_req *req;
    *out = NULL;
    if (stage_find(core, nonce)) {
        free(keys);
        snprintf(why, why_cap, "stage %d: request nonce %llu is already active",
                 core->opt.stage_index, (unsigned long long)nonce);
        return STRATA_EINVAL;
    }
    int rc = check_fit(core, params, why, why_cap);
    if (rc < 0) {
        free(keys);
        return rc;
    }
    rc = stage_backend_kv_acquire(core->be, &slot);
    if (rc < 0) free(keys);
    if (rc < 0) {
        if (rc == STRATA_EBUSY)
            snprintf(why, why_cap,
                     "stage %d: request refused: all %d KV slots are in use (--max-batch %d)",
                     core->opt.stage_index, core->max_batch, core->max_batch);
        else /* e.g. a TP / KVP group that has failed: its own message */
            snprintf(why, why_cap, "stage %d: request refused: %s", core->opt.stage_index,
                     strata_last_error());
        core->stats.refused++;
        return rc;
    }
    req = &core->reqs[slot];
    memset(req, 0, sizeof *req);
    req->active = 1;
    req->nonce = nonce;
    req->slot = slot;
    req->params = *params;
    req->tokens = calloc((size_t)params->max_tokens, sizeof *req->tokens);
    if (!req->tokens) {
        free(keys);
        stage_backend_kv_release(core->be, slot);
        stage_free_req_buffers(core, req);
        snprintf(why, why_cap, "stage %d: out of memory for a request of %d tokens",
                 core->opt.stage_index, params->max_tokens);
        return STRATA_ENOMEM;
    }
    /* The cached prefix first (it holds blocks the reservation then need not count), then
     * the rest of the request's run promised. */
    rc = stage_prefix_attach(core, req, keys, n_keys, cached, why, why_cap);
    if (rc == 0 && (rc = stage_backend_kv_reserve(core->be, slot, (int)kv_need(params))) < 0)
        snprintf(why, why_cap, "stage %d: request refused: %s", core->opt.stage_index,
                 strata_last_error());
    if (rc < 0) {
        stage_backend_kv_release(core->be, slot);
        stage_free_req_buffers(core, req);
        core->stats.refused++;
        return rc;
    }
    if (core->is_last) sampler_init(&req->sampler, &params->sampling);
    *out = req;
    return 0;
}

/* Sends the Request frame [len] on to the next stage (the request was admitted here). */
static int forward_request(struct stage_core *core, struct stage_req *req, const uint8_t *frame,
                           size_t len) {
    if (core->is_last) return 0;
    if (stage_emit_raw(core, STAGE_LINK_NEXT, 0, frame, len) == 0) return 0;
    stage_fail(core, req, STRATA_ENOMEM, 1, 0, "stage %d: forwarding the request: %s",
               core->opt.stage_index, strata_last_error());
    return -1;
}

/* Stage 0: rows per prefill chunk of a prompt (stage_plan.h's rule, which the performance
 * model prices): at least S chunks, so a stage never holds a token behind a whole prompt's
 * prefill. */
static int prefill_chunk(const struct stage_core *core, int prompt_len) {
    return stage_plan_prefill_chunk(prompt_len, core->opt.num_stages, core->opt.chunk_size);
}

int stage_has_free_slot(const struct stage_core *core) {
    for (int i = 0; i < core->max_batch; i++)
        if (!core->reqs[i].active) return 1;
    return 0;
}

int stage_can_start(struct stage_core *core, int64_t need) {
    return stage_has_free_slot(core) && stage_backend_kv_reserve(core->be, -1, (int)need) == 0;
}

/* Stage 0: a Request from a client. Admitted: forwarded down the pipeline at once and its
 * prompt queued in chunks. Refused: an Error with its nonce to the client. */
static int on_client_request(struct stage_core *core, uint32_t client_id,
                             const struct wire_request *msg, const uint8_t *frame, size_t len,
                             int from_queue) {
    struct request_params params;
    struct stage_req *req;
    struct stage_vl *vl = NULL;
    uint64_t *keys = NULL;
    int n_keys = 0, cached = 0;
    int64_t cost = 0;
    char why[512];
    int rc = request_params_from_wire(&params, msg);
    for (int i = 0; rc == 0 && i < params.prompt_len; i++)
        if (msg->prompt[i] < 0 || msg->prompt[i] >= core->vocab)
            rc = strata_set_error(STRATA_EINVAL,
                                  "prompt token %d at position %d is outside the "
                                  "vocabulary [0, %d)",
                                  msg->prompt[i], i, core->vocab);
    if (rc == 0) rc = stage_spec_check_request(core, msg);
    /* Qwen3-VL inputs: checked, prompt expanded, positions computed (stage_core_vl.c). */
    if (rc == 0) rc = stage_vl_prepare(core, &vl, &params.prompt_len, msg);

    if (rc < 0) {
        snprintf(why, sizeof why, "stage 0: bad request: %s", strata_last_error());
    } else if ((rc = check_fit(core, &params, why, sizeof why)) < 0) {
        /* refused before it could wait: it can never fit */
    } else if (params.resume_len == 0 &&
               (rc = stage_prefix_plan(core, vl ? vl->ids : msg->prompt, params.prompt_len, vl,
                                       kv_need(&params), &keys, &n_keys, &cached, &cost)) < 0) {
        snprintf(why, sizeof why, "stage 0: %s", strata_last_error());
    } else if (!from_queue && (stage_admission_waiting(core) > 0 ||
                               !stage_can_start(core, keys ? cost : kv_need(&params)))) {
        /* Every slot taken, too few KV blocks free, or others waiting first: the queue (its
         * vision inputs are prepared again when it is admitted). */
        stage_vl_free(vl);
        vl = NULL;
        free(keys); /* looked up again when it starts */
        keys = NULL;
        if ((rc = stage_admission_push(core, client_id, msg->nonce, frame, len,
                                       (int)kv_need(&params))) == 0)
            return 0;
        snprintf(why, sizeof why, "stage 0: %s", strata_last_error());
        core->stats.refused++;
    } else {
        rc = admit(core, &req, msg->nonce, &params, keys, n_keys, cached, why, sizeof why);
        keys = NULL; /* the request's now, or freed */
    }
    if (rc < 0) {
        free(keys);
        stage_vl_free(vl);
        stage_emit_error(core, STAGE_LINK_CLIENT, client_id, rc, msg->nonce, why);
        stage_push_refusal(core, msg->nonce, rc, why);
        return 0;
    }
    req->client_id = client_id;
    req->vl = vl;
    stage_spec_admit(core, req, msg);
    /* The slot's prompt row (admit() checked prompt_len <= max_seq). */
    req->prompt = core->prompts + (size_t)req->slot * (size_t)core->max_seq;
    memcpy(req->prompt, vl ? vl->ids : msg->prompt, sizeof(int32_t) * (size_t)params.prompt_len);
    /* Later stages get the expanded prompt and no vision tensors, and attach the same
     * blocks (stage_prefix.c); a plain text request goes on as it came. */
    if (vl || req->n_keys > 0) {
        struct wire_request fwd = *msg;
        if (vl) stage_vl_forward_fields(req, &fwd);
        stage_prefix_forward_fields(req, &fwd);
        if ((rc = wire_build_request(&core->arena, &fwd)) < 0) {
            stage_fail(core, req, rc, 0, 0, "stage 0: forwarding the request: %s",
                       strata_last_error());
            return 0;
        }
        frame = wire_arena_frame(&core->arena);
        len = wire_arena_frame_len(&core->arena);
    }
    if (params.resume_len > 0 && stage_recovery_admit_resumed(core, req, msg) < 0) return 0;
    if (forward_request(core, req, frame, len) < 0) return 0;
    /* The prompt (+ resumed tokens) in chunks, after the blocks taken from the cache once
     * every stage has them (stage_prefix.c). */
    stage_prefix_start(core, req);
    return 0;
}

/* Stages r > 0: the Request forwarded by stage r-1, ahead of the request's activations.
 * Opens the request here (admission control too: a refusal goes upstream as an Error), or
 * supplies the parameters of a request whose KV was restored (stage_core_restore_kv). */
static int on_forwarded_request(struct stage_core *core, const struct wire_request *msg,
                                const uint8_t *frame, size_t len) {
    int r = core->opt.stage_index;
    struct request_params params;
    struct stage_req *req;
    char why[512];
    int rc = request_params_from_wire(&params, msg);
    if (rc == 0 && params.resume_len > 0) stage_recovery_drop_stale(core, msg);
    req = stage_find(core, msg->nonce);
    if (rc == 0 && req && req->restored) {
        if (kv_need(&params) > core->max_seq) {
            stage_fail(core, req, STRATA_ERANGE, 1, 1,
                       "stage %d: restored request %llu needs %lld KV positions (prompt %d + "
                       "max_tokens %d - 1) but --max-seq is %d",
                       r, (unsigned long long)req->nonce, (long long)kv_need(&params),
                       params.prompt_len, params.max_tokens, core->max_seq);
            return 0;
        }
        /* Its restored positions hold blocks already; the rest of its run is promised now. */
        if (stage_backend_kv_reserve(core->be, req->slot, (int)kv_need(&params)) < 0) {
            stage_fail(core, req, STRATA_EBUSY, 1, 1, "stage %d: restored request %llu: %s", r,
                       (unsigned long long)req->nonce, strata_last_error());
            return 0;
        }
        req->tokens = calloc((size_t)params.max_tokens, sizeof *req->tokens);
        if (!req->tokens) {
            stage_fail(core, req, STRATA_ENOMEM, 1, 1, "stage %d: out of memory", r);
            return 0;
        }
        req->params = params;
        req->restored = 0;
        if (core->is_last) sampler_init(&req->sampler, &params.sampling);
        if (stage_recovery_kv_admit(core, req, msg) == 0) forward_request(core, req, frame, len);
        return 0;
    }
    uint64_t *keys = NULL;
    if (rc == 0 && msg->num_block_keys && !(keys = malloc(msg->num_block_keys * sizeof *keys)))
        rc = strata_set_error(STRATA_ENOMEM, "no memory for %zu block keys", msg->num_block_keys);
    if (keys) memcpy(keys, msg->block_keys, msg->num_block_keys * sizeof *keys);
    if (rc < 0)
        snprintf(why, sizeof why, "stage %d: bad request: %s", r, strata_last_error());
    else
        rc = admit(core, &req, msg->nonce, &params, keys, (int)msg->num_block_keys,
                   msg->cached_blocks, why, sizeof why);
    if (rc == STRATA_ENOTFOUND) { /* its cached blocks are not all here: the check says so, */
        stage_prefix_note_miss(core, msg->nonce); /* and stage 0 sends it again cold */
        return 0;
    }
    if (rc < 0) {
        stage_emit_error(core, STAGE_LINK_PREV, 0, rc, msg->nonce, why);
        stage_push_refusal(core, msg->nonce, rc, why);
        return 0;
    }
    if (params.resume_len > 0 && stage_recovery_admit_resumed(core, req, msg) < 0) return 0;
    forward_request(core, req, frame, len);
    return 0;
}

static void cancel_request(struct stage_core *core, struct stage_req *req, const char *why) {
    if (!core->is_last)
        stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_CANCEL, req->nonce, 0);
    if (core->is_first)
        stage_emit_error(core, STAGE_LINK_CLIENT, req->client_id, STRATA_ECANCELED, req->nonce,
                         why);
    stage_release(core, req, STAGE_FINISH_CANCELLED, STRATA_ECANCELED, why);
}

int stage_core_cancel(struct stage_core *core, uint64_t nonce) {
    struct stage_req *req = stage_find(core, nonce);
    if (req)
        cancel_request(core, req, "request cancelled");
    else
        stage_admission_leave(core, STAGE_ANY_CLIENT, nonce, 1, "request cancelled");
    stage_admission_pump(core);
    return 0;
}

void stage_admit_waiting(struct stage_core *core, uint32_t client_id, const uint8_t *frame,
                         size_t len) {
    struct wire_request msg;
    if (wire_read_request(&msg, frame, len) < 0) return; /* read once already: cannot fail */
    on_client_request(core, client_id, &msg, frame, len, 1);
}

static int on_error(struct stage_core *core, enum stage_link from, const struct wire_error *msg) {
    struct stage_req *req = stage_find(core, msg->nonce);
    int code = msg->code < 0 ? msg->code : STRATA_EPEER;
    if (msg->nonce == 0) /* about the connection: the peer closes it; the driver drops it too */
        return strata_set_error(
            STRATA_EPEER, "stage %d: the %s stage reported a connection error: %s",
            core->opt.stage_index, from == STAGE_LINK_PREV ? "previous" : "next",
            msg->message ? msg->message : "");
    if (!req || req->held) return 0;
    if (core->is_first && code == STRATA_EPEER &&
        stage_recovery_hold(core, req, msg->message ? msg->message : "a stage link was lost"))
        return 0; /* a link of the ring was lost: held for the replay */
    if (from == STAGE_LINK_PREV)
        stage_fail(core, req, code, 0, !core->is_first, "%s", msg->message ? msg->message : "");
    else
        stage_fail(core, req, code, 1, 0, "%s", msg->message ? msg->message : "");
    return 0;
}

static int on_frame(struct stage_core *core, enum stage_link from, uint32_t client_id,
                    const uint8_t *frame, size_t len) {
    enum wire_kind kind;
    int rc = wire_verify(&kind, NULL, frame, len);
    if (rc < 0) return rc;
    core->stats.frames_in++;
    if (kind == WIRE_KIND_CONTROL) {
        struct wire_control msg;
        rc = wire_read_control(&msg, frame, len);
        if (rc < 0) return rc;
        if (msg.kind == WIRE_CONTROL_PING)
            stage_emit_control(core, from, client_id, WIRE_CONTROL_PONG, msg.nonce, msg.seq);
        else if (msg.kind == WIRE_CONTROL_RESET && from == STAGE_LINK_PREV)
            stage_recovery_on_reset(core, from, msg.seq);
        else if (msg.kind == WIRE_CONTROL_DESCRIBE)
            return stage_describe_on_control(core, from, client_id, &msg);
        else if (msg.kind == WIRE_CONTROL_PREFIX_CHECK && from == STAGE_LINK_PREV)
            stage_prefix_on_check(core, msg.nonce, msg.seq);
        else if (msg.kind == WIRE_CONTROL_CANCEL && from != STAGE_LINK_NEXT) {
            struct stage_req *req = stage_find(core, msg.nonce);
            if (req && (from == STAGE_LINK_PREV || req->client_id == client_id))
                cancel_request(core, req, "request cancelled by the client");
            else if (!req && from == STAGE_LINK_CLIENT)
                stage_admission_leave(core, client_id, msg.nonce, 1,
                                      "request cancelled by the client while it waited");
        }
        return 0;
    }
    if (kind == WIRE_KIND_ERROR && from != STAGE_LINK_CLIENT) {
        struct wire_error msg;
        rc = wire_read_error(&msg, frame, len);
        return rc < 0 ? rc : on_error(core, from, &msg);
    }
    if (kind == WIRE_KIND_REQUEST && from == STAGE_LINK_CLIENT && core->is_first) {
        struct wire_request msg;
        rc = wire_read_request(&msg, frame, len);
        return rc < 0 ? rc : on_client_request(core, client_id, &msg, frame, len, 0);
    }
    if (kind == WIRE_KIND_REQUEST && from == STAGE_LINK_PREV && !core->is_first) {
        struct wire_request msg;
        rc = wire_read_request(&msg, frame, len);
        return rc < 0 ? rc : on_forwarded_request(core, &msg, frame, len);
    }
    if (kind == WIRE_KIND_ACTIVATION && from == STAGE_LINK_PREV && !core->is_first) {
        struct wire_activation msg;
        rc = wire_read_activation(&msg, frame, len);
        return rc < 0 ? rc : stage_on_activation(core, &msg);
    }
    if (kind == WIRE_KIND_TOKEN_RESULT && from == STAGE_LINK_PREV) {
        struct wire_token_result msg;
        rc = wire_read_token_result(&msg, frame, len);
        return rc < 0 ? rc : stage_on_token_result(core, &msg);
    }
    if (kind == WIRE_KIND_KV_BLOCK && from == STAGE_LINK_PREV) {
        struct wire_kv_block msg;
        rc = wire_read_kv_block(&msg, frame, len);
        return rc < 0 ? rc : stage_recovery_on_kv_block(core, &msg, frame, len);
    }
    return strata_set_error(STRATA_EFORMAT, "stage %d: a %s frame is not expected on the %s link",
                            core->opt.stage_index, wire_kind_name(kind),
                            from == STAGE_LINK_PREV   ? "upstream"
                            : from == STAGE_LINK_NEXT ? "downstream"
                                                      : "client");
}

int stage_core_on_frame(struct stage_core *core, enum stage_link from, uint32_t client_id,
                        const uint8_t *frame, size_t len) {
    int rc = on_frame(core, from, client_id, frame, len);
    stage_admission_pump(core); /* a finish, an error or a cancel may have freed a slot */
    return rc;
}

int stage_core_on_link_down(struct stage_core *core, enum stage_link link, uint32_t client_id,
                            const char *reason) {
    int r = core->opt.stage_index;
    stage_describe_on_link_down(core, link, client_id, reason);
    if (link == STAGE_LINK_CLIENT) stage_admission_leave(core, client_id, 0, 0, NULL);
    const char *what =
        link == STAGE_LINK_PREV
            ? (core->is_first ? "link from the last stage" : "link from the previous stage")
        : link == STAGE_LINK_NEXT ? (core->is_last ? "link to stage 0" : "link to the next stage")
                                  : "client connection";
    for (int i = 0; i < core->max_batch; i++) {
        struct stage_req *req = &core->reqs[i];
        if (!req->active) continue;
        if (link == STAGE_LINK_CLIENT) {
            if (core->is_first && req->client_id == client_id)
                cancel_request(core, req, "client disconnected");
        } else if (core->is_first && !req->held) {
            char why[200];
            snprintf(why, sizeof why, "stage 0: %s lost: %s", what, reason ? reason : "closed");
            if (!stage_recovery_hold(core, req, why))
                stage_fail(core, req, STRATA_EPEER, link == STAGE_LINK_NEXT,
                           link == STAGE_LINK_PREV, "%s", why);
        } else if (core->is_first) {
            continue; /* held already */
        } else if (link == STAGE_LINK_PREV) {
            stage_fail(core, req, STRATA_EPEER, 0, 1, "stage %d: %s lost: %s", r, what,
                       reason ? reason : "closed");
        } else if (link == STAGE_LINK_NEXT) {
            stage_fail(core, req, STRATA_EPEER, 1, 0, "stage %d: %s lost: %s", r, what,
                       reason ? reason : "closed");
        }
    }
    stage_admission_pump(core);
    return 0;
}

void stage_core_get_stats(const struct stage_core *core, struct stage_core_stats *out) {
    *out = core->stats;
    out->active_requests = 0;
    for (int i = 0; i < core->max_batch; i++)
        out->active_requests += core->reqs[i].active;
    out->free_slots = core->max_batch - out->active_requests;
    out->held_requests = 0;
    for (int i = 0; i < core->max_batch; i++)
        out->held_requests += core->reqs[i].active && core->reqs[i].held;
    const struct stage_admission *a = &core->admission;
    out->queue_depth = a->count;
    out->queued = a->queued;
    out->queue_admitted = a->admitted;
    out->queue_full = a->refused_full;
    out->queue_expired = a->expired;
    out->queue_waited_ms = a->waited_ms;
    out->prefix_lookups = core->prefix.lookups;
    out->prefix_hits = core->prefix.hits;
    out->prefix_cached_tokens = core->prefix.cached_tokens;
    out->prefix_prompt_tokens = core->prefix.prompt_tokens;
    out->prefix_fallbacks = core->prefix.fallbacks;
    out->spec_steps = core->spec.steps;
    out->spec_drafted = core->spec.drafted;
    out->spec_accepted = core->spec.accepted;
    out->spec_withheld = core->spec.withheld;
}

void stage_core_set_prefix_cache(struct stage_core *core, int on) {
    core->prefix.off = !on;
}

size_t stage_core_kv_bytes(const struct stage_core *core) {
    return stage_backend_kv_bytes(core->be);
}

void stage_core_get_info(const struct stage_core *core, struct stage_core_info *out) {
    *out = (struct stage_core_info){.stage_index = core->opt.stage_index,
                                    .num_stages = core->opt.num_stages,
                                    .num_layers = core->be->cfg->num_layers,
                                    .role = core->be->role,
                                    .max_seq = core->max_seq,
                                    .max_batch = core->max_batch,
                                    .device_kind = core->be->device_kind};
}

/* Wrappers of static helpers above for stage_recovery.c. */
int stage_enqueue_ids(struct stage_core *core, uint64_t nonce, int pos, int n_tokens,
                      const int32_t *tokens) {
    return stage_enqueue(core, nonce, 0, pos, n_tokens, tokens, 0, NULL);
}

int stage_prefill_chunk(const struct stage_core *core, int rows) {
    return prefill_chunk(core, rows);
}
