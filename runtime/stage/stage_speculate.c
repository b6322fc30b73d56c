/* Speculative decoding through the pipeline, exact.
 *
 * A request decodes one token per trip round the ring: stage 0 feeds the last token, every
 * stage runs its layers on that one row, the last stage samples the next token and sends it
 * back. With drafts, stage 0 feeds the last token and k guesses of the tokens after it
 * (model-free: runtime/stage/ngram_draft.h) as one decode step of 1 + k rows, positions
 * p .. p + k; the rows travel the ring like a prefill chunk, their ids in the activation's
 * draft_ids. The last stage samples row 0 (the token after the fed one, as without drafts),
 * and while the token it sampled from row i equals draft i + 1, the draft was right and
 * row i + 1 was computed on the true sequence: it samples that row too. It sends back every
 * token it sampled (the accepted drafts' and one more) in one TokenResult, so a trip yields
 * 1 .. k + 1 tokens.
 *
 * Exact, not approximately: a row's logits do not depend on the other rows of its
 * microbatch (reference/model.h's contract, which batching and chunked prefill already
 * rely on), so an accepted row's logits are those a plain step would have computed, bit for
 * bit; and the sampler draws once per emitted token, in order, from those logits, so even
 * at temperature > 0 the tokens are the ones decoding without drafts gives with the same
 * seed. (For a draft that is one fixed token this "sample, then compare" rule is standard
 * speculative sampling: the draft is accepted with the target's probability of it, and a
 * rejected one is replaced by a sample of the target distribution without it.)
 *
 * Rejected rows: positions after the last accepted one hold KV of wrong tokens. Each stage
 * drops them (the backend's kv_truncate: the length goes back, the blocks stay the slot's)
 * before it writes there again: stage 0 when the tokens arrive, the last stage when it has
 * sampled them, the stages between when the next step's activation starts inside the
 * previous step (the only way they learn how many were accepted, at no extra message).
 * Positions never exceed the request's reservation: a step carries at most as many drafts
 * as tokens remain to generate after its first.
 *
 * What a miss costs: its rows, on every stage (for a memory-bound decode step on a CPU or a
 * GPU, far less than a step; on compute-bound hardware about a row's share). So stage 0
 * adapts a request's drafts per step to how they fare (runtime/stage/spec_pace.h): a request
 * whose drafts never land soon pays almost nothing. That matters under load: with 4 requests
 * batched on one 2-core stage, 4 wrong drafts per step for each (the oracle at 0.0, no
 * back-off) cut tokens/s 3x, since a batch of 20 rows is no longer bound by reading the
 * weights.
 *
 * Drafts from a draft model (strata-stage --draft-model DIR): a whole smaller model with the
 * same tokenizer on stage 0's device, with a KV slot per request. Each step it catches up on
 * the sequence (its KV keeps the positions whose fed token is still right: the prompt, the
 * accepted tokens and accepted drafts; the rest is dropped as the target's is) and then
 * proposes k tokens greedily, one forward each. A draft model that fails (memory) only ends
 * that request's drafting.
 *
 * Steps in flight. By default one step per request is in flight (the next step's input is
 * the last accepted token). With --speculate-waves W, stage 0 keeps up to W: each later step
 * ("wave") is drafted on the guess that the ones before it are accepted whole, its row 0
 * feeding a guessed token, so while the last stage verifies one step the stages before it
 * already compute the next ones (SpecPipe's idea). When the oldest step comes back accepted
 * whole and the next one's guess equals its last token, the next one stands; otherwise every
 * later step is void: stage 0 drops those it has not computed and truncates its KV, the last
 * stage drops each arriving step that does not start where the last verified step left off
 * or does not feed its last token (Activation.fed_id), and each stage between drops its
 * queued ones and their rows when the next valid step starts inside them. A void step's
 * tokens are never sampled, so the output stays exactly that of decoding without drafts. */
#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/ngram_draft.h"
#include "runtime/stage/oracle_draft.h"
#include "runtime/stage/spec_pace.h"
#include "runtime/stage/stage_core_internal.h"

int stage_spec_check_draft(const struct stage_core_options *opt) {
    const struct stage_backend *d = opt->draft, *be = opt->backend;
    if (!d)
        return opt->speculate == WIRE_SPECULATE_DRAFT && opt->stage_index == 0
                   ? strata_set_error(STRATA_EINVAL,
                                      "speculation by a draft model needs the draft model")
                   : 0;
    if (opt->stage_index != 0)
        return strata_set_error(STRATA_EINVAL, "a draft model belongs on stage 0, not stage %d",
                                opt->stage_index);
    if (!d->cfg || d->cfg->vocab_size != be->cfg->vocab_size) /* the wrong checkpoint */
        return strata_set_error(STRATA_EFORMAT,
                                "the draft model's vocabulary has %d ids, the model's %d: drafts "
                                "need the same tokenizer",
                                d->cfg ? d->cfg->vocab_size : 0, be->cfg->vocab_size);
    if (!d->role.with_embed || !d->role.with_head || d->role.layer_start != 0 ||
        d->role.layer_end != d->cfg->num_layers)
        return strata_set_error(STRATA_EINVAL,
                                "the draft model must be whole (embedding, layers [0, %d), head)",
                                d->cfg->num_layers);
    if (d->num_slots < be->num_slots || d->max_seq < be->max_seq)
        return strata_set_error(STRATA_EINVAL,
                                "the draft model holds %d requests of %d positions, the stage %d "
                                "of %d",
                                d->num_slots, d->max_seq, be->num_slots, be->max_seq);
    return 0;
}

int stage_spec_init_draft(struct stage_core *core, struct stage_backend *draft) {
    core->spec.draft = draft;
    if (!draft) return 0;
    core->spec.draft_rows = core->opt.chunk_size > 0 ? core->opt.chunk_size : 64;
    core->spec.draft_hidden =
        malloc(sizeof(float) * (size_t)core->spec.draft_rows * (size_t)draft->cfg->hidden_size);
    core->spec.draft_logits = malloc(sizeof(float) * (size_t)core->vocab);
    if (!core->spec.draft_hidden || !core->spec.draft_logits)
        return strata_set_error(STRATA_ENOMEM, "out of memory for the draft model's rows");
    return 0;
}

void stage_spec_free(struct stage_core *core) {
    free(core->spec.draft_hidden);
    free(core->spec.draft_logits);
}

void stage_spec_drop(struct stage_core *core, struct stage_req *req) {
    if (req->drafting) stage_backend_kv_release(core->spec.draft, req->draft_slot);
    req->drafting = 0;
}

int stage_spec_check_request(const struct stage_core *core, const struct wire_request *msg) {
    if (msg->speculate != WIRE_SPECULATE_DRAFT || core->spec.draft) return 0;
    return strata_set_error(STRATA_EINVAL,
                            "speculation by a draft model, but this pipeline has none "
                            "(strata-stage --draft-model DIR on stage 0)");
}

void stage_spec_admit(struct stage_core *core, struct stage_req *req,
                      const struct wire_request *msg) {
    enum wire_speculate mode = msg->speculate == WIRE_SPECULATE_DEFAULT
                                   ? core->spec.mode
                                   : (enum wire_speculate)msg->speculate;
    int k = 0;
    req->spec_oracle = msg->speculate == WIRE_SPECULATE_DEFAULT && core->spec.oracle;
    req->spec_model = !req->spec_oracle && mode == WIRE_SPECULATE_DRAFT && core->spec.draft;
    if (req->spec_oracle || req->spec_model) mode = WIRE_SPECULATE_NGRAM; /* k as for n-gram */
    if (mode == WIRE_SPECULATE_NGRAM)
        k = msg->speculate_k > 0 ? msg->speculate_k
            : core->spec.k > 0   ? core->spec.k
                                 : STAGE_SPECULATE_DEFAULT_K;
    spec_pace_start(&req->pace, k > WIRE_SPECULATE_MAX_K ? WIRE_SPECULATE_MAX_K : k);
    /* Steps in flight: the stage's, one where there is no pipeline to keep busy or the drafts
     * come from a draft model (its KV follows the confirmed tokens only). */
    req->spec_waves =
        core->opt.num_stages > 1 && !req->spec_model && req->pace.k > 0 ? core->spec.waves : 1;
}

void stage_spec_after(struct stage_req *req, int drafted, int accepted) {
    req->spec_accepted += accepted;
    /* Oracle drafts keep a fixed k: the benchmark sets their acceptance itself. */
    if (!req->spec_oracle) spec_pace_after(&req->pace, drafted, accepted);
}

/* Feeds the draft model req's sequence [n] (in req->prompt) from the first position its KV
 * does not hold right, then k - 1 of its own greedy tokens: k drafts into out. 0 drafts, and
 * no more for this request, when the draft model fails. */
static int draft_from_model(struct stage_core *core, struct stage_req *req, int n, int k,
                            int32_t *out) {
    struct stage_backend *d = core->spec.draft;
    const int H = d->cfg->hidden_size;
    float *hidden = core->spec.draft_hidden;
    int rc = 0, rows = 1;
    if (!req->drafting) {
        if ((rc = stage_backend_kv_acquire(d, &req->draft_slot)) < 0) goto off;
        req->drafting = 1;
        req->draft_len = 0;
    }
    /* Positions from n - 1 on were fed drafts (or nothing): the last token is fed again. */
    if (req->draft_len > n - 1) {
        if ((rc = stage_backend_kv_truncate(d, req->draft_slot, n - 1)) < 0) goto off;
        req->draft_len = n - 1;
    }
    for (int pos = req->draft_len; pos < n && rc == 0; pos += rows) {
        rows = n - pos < core->spec.draft_rows ? n - pos : core->spec.draft_rows;
        const struct forward_item item = {.slot = req->draft_slot, .pos = pos, .n_tokens = rows};
        if ((rc = stage_backend_embed(d, hidden, req->prompt + pos, rows)) == 0 &&
            (rc = stage_backend_forward(d, hidden, &item, 1)) == 0)
            req->draft_len = pos + rows;
    }
    for (int j = 0; j < k && rc == 0; j++) {
        if (j > 0) { /* the previous draft, fed */
            const struct forward_item item = {
                .slot = req->draft_slot, .pos = req->draft_len, .n_tokens = 1};
            rows = 1;
            if ((rc = stage_backend_embed(d, hidden, &out[j - 1], 1)) == 0 &&
                (rc = stage_backend_forward(d, hidden, &item, 1)) == 0)
                req->draft_len++;
        }
        if (rc == 0)
            rc = stage_backend_argmax(d, &out[j], hidden + (size_t)(rows - 1) * H, 1,
                                      core->spec.draft_logits);
    }
    if (rc == 0) return k;
off:
    stage_spec_drop(core, req);
    spec_pace_start(&req->pace, 0);
    return 0;
}

/* Up to k drafts for what follows req->prompt [n] (the confirmed sequence, then the ids the
 * steps in flight assume) into out; how many. */
static int draft(struct stage_core *core, struct stage_req *req, int n, int k, int32_t *out) {
    const int P = req->params.prompt_len;
    if (k <= 0 || n > core->max_seq) return 0;
    return req->spec_oracle
               ? oracle_draft(core->spec.oracle, req->prompt, P, n - P, k, core->vocab, out)
           : req->spec_model ? draft_from_model(core, req, n, k, out)
                             : ngram_draft(req->prompt, n, k, out);
}

/* The drafts req may have in its next step, of the k it asks (the adaptive count). A step of
 * every decoding request, each with its fed row and k drafts, should stay within the rows a
 * step measured as flat costs (step_cost_budget): there a draft costs nothing. Past it a
 * draft row costs every request time, and pays only when it is accepted often enough: with
 * T(r) the measured cost of r rows and D requests decoding, k drafts each are worth it at an
 * acceptance above (T(D (1 + k)) / T(D) - 1) / k (2 cores, 0.6B-sized model, 8 requests, 4
 * drafts: 40 rows cost 2.3x 8 rows, so about a third). A request keeps its k when its
 * acceptance so far (1 before its first draft) clears that; else it gets the budget's share.
 * Without a clock, or with one request decoding, the request's k stands. */
static int draft_budget(const struct stage_core *core, const struct stage_req *req, int k) {
    if (!core->opt.now_sec || k <= 0) return k;
    int decoding = 0;
    for (int s = 0; s < core->max_batch; s++)
        decoding += core->reqs[s].active && core->reqs[s].n_generated > 0;
    if (decoding <= 1) return k;
    const struct step_cost *c = &core->spec.cost;
    /* A step of the requests alone, now and then, so that one with drafts has something to be
     * compared with. */
    if (!step_cost_has_baseline(c, decoding)) return 0;
    const int fit = step_cost_budget(c) / decoding - 1;
    if (k <= fit) return k;
    const double plain = step_cost_sec(c, decoding), full = step_cost_sec(c, decoding * (1 + k));
    const double breakeven = plain > 0 ? (full / plain - 1) / k : 0;
    const double acceptance =
        req->spec_drafted > 0 ? (double)req->spec_accepted / req->spec_drafted : 1.0;
    if (acceptance >= breakeven) return k;
    return fit > 0 ? fit : 0;
}

int stage_spec_head_rows(const struct stage_req *req) {
    return req->n_waves ? req->waves[req->wave_head].rows : 1;
}

/* Adds the next decode step of req behind the ones in flight (the first one feeds the last
 * token) and queues it; 0 when there is nothing to add (no guess for a later wave, no room),
 * 1 when one was added, or a negative status. */
static int add_wave(struct stage_core *core, struct stage_req *req) {
    const int P = req->params.prompt_len, first = req->n_waves == 0;
    struct stage_spec_wave *w = &req->waves[(req->wave_head + req->n_waves) % STAGE_SPEC_MAX_WAVES];
    const struct stage_spec_wave *tail =
        first ? NULL : &req->waves[(req->wave_head + req->n_waves - 1) % STAGE_SPEC_MAX_WAVES];
    const int pos = tail ? tail->pos + tail->rows : P + req->n_generated - 1; /* w's start */
    /* Rows it may have: the request's positions end at prompt + max_tokens - 1 (its
     * reservation); a microbatch's rows; the drafts per step (with a guessed first id). */
    int room = P + req->params.max_tokens - 1 - pos;
    if (room > core->opt.max_batch_tokens) room = core->opt.max_batch_tokens;
    if (room < 1) return 0;
    if (!first && (req->pace.wait > 0 || req->pace.cur == 0)) return 0; /* no guessing now */
    int k = first ? spec_pace_next(&req->pace) : req->pace.cur;         /* drafts after row 0 */
    if (k > room - 1) k = room - 1;
    const int fit = draft_budget(core, req, k);
    if (k > fit) {
        core->spec.withheld += (uint64_t)(k - fit);
        k = fit;
    }
    if (!first && k == 0) return 0; /* a later wave is all guesses: none past the budget */
    /* The sequence the drafts follow, only when there are drafts to make: the prompt's row
     * holds the confirmed tokens after the prompt (a recovery replay writes them the same
     * way), then the ids the steps in flight assume (the oldest one's drafts, each later
     * one's ids). */
    int n = P + req->n_generated;
    if (k > 0 || !first) {
        memcpy(req->prompt + P, req->tokens, sizeof(int32_t) * (size_t)req->n_generated);
        for (int i = 0; i < req->n_waves; i++) {
            const struct stage_spec_wave *o =
                &req->waves[(req->wave_head + i) % STAGE_SPEC_MAX_WAVES];
            memcpy(req->prompt + n, o->ids + (i == 0),
                   sizeof(int32_t) * (size_t)(o->rows - (i == 0)));
            n += o->rows - (i == 0);
        }
    }
    int got;
    if (first) {
        w->ids[0] = req->tokens[req->n_generated - 1];
        got = draft(core, req, n, k, w->ids + 1);
    } else { /* a guess for the token after the steps before it, then its drafts */
        if ((got = draft(core, req, n, k + 1, w->ids) - 1) < 0) return 0;
    }
    w->pos = pos;
    w->rows = 1 + got;
    w->guessed = !first;
    if (got + !first > 0) {
        core->spec.steps++;
        core->spec.drafted += (uint64_t)(got + !first);
        req->spec_drafted += got + !first;
    }
    req->n_waves++;
    const int32_t *ids = w->rows > 1 || w->guessed ? w->ids : NULL;
    int rc = stage_enqueue(core, req->nonce, (uint64_t)(pos - P + 1), pos, w->rows, ids, w->ids[0],
                           NULL);
    return rc < 0 ? rc : 1;
}

int stage_spec_next(struct stage_core *core, struct stage_req *req, const int32_t *tokens, int n) {
    int cont = 0, rc;
    /* Rows past the accepted ones exist here when the oldest step had drafts or later steps
     * were computed: only then is there KV to drop. */
    const int dirty = stage_spec_head_rows(req) > 1 || req->n_waves > 1;
    if (req->n_waves > 1) {
        const struct stage_spec_wave *head = &req->waves[req->wave_head];
        const struct stage_spec_wave *next =
            &req->waves[(req->wave_head + 1) % STAGE_SPEC_MAX_WAVES];
        cont = n == head->rows && tokens[n - 1] == next->ids[0];
    }
    if (req->n_waves > 0) { /* the oldest step is done */
        req->wave_head = (req->wave_head + 1) % STAGE_SPEC_MAX_WAVES;
        req->n_waves--;
    }
    if (cont) { /* the next step's guess was right: it stands, as do its drafts so far */
        core->spec.accepted++;
        req->spec_accepted++;
    } else {
        /* The steps still in flight were drafted on a wrong guess: those not computed here yet
         * are dropped, the KV of those computed (and of rejected drafts) too; the later
         * stages drop theirs when the next step starts inside them. */
        if (req->n_waves > 0) stage_drop_items(core, req->nonce);
        req->n_waves = 0;
        if (dirty && (rc = stage_backend_kv_truncate(
                          core->be, req->slot, req->params.prompt_len + req->n_generated - 1)) < 0)
            return rc;
    }
    while (req->n_waves < (req->spec_waves > 0 ? req->spec_waves : 1))
        if ((rc = add_wave(core, req)) <= 0) return rc;
    return 0;
}

int stage_spec_stale(const struct stage_req *req, const struct stage_item *it) {
    return it->step > 0 && req->expect_set &&
           (it->pos != req->expect_pos || (it->has_fed_id && it->fed_id != req->expect_id));
}

void stage_spec_expect(struct stage_req *req, int pos, int32_t id) {
    req->expect_set = 1;
    req->expect_pos = pos;
    req->expect_id = id;
}

int stage_spec_rewind(struct stage_core *core, struct stage_req *req, int pos, int waves, char *why,
                      size_t why_cap) {
    if (pos == req->recv_pos) return 0;
    /* One step in flight: it may start inside the previous step's drafts. Several (the
     * activation names its fed id): anywhere after the prompt, since the steps between were
     * drafted on a wrong guess; those still queued here are dropped with their rows. */
    const int floor = waves                ? stage_prefill_len(req) + 1
                      : req->spec_rows > 1 ? req->spec_pos + 1
                                           : req->recv_pos;
    if (pos >= floor && pos < req->recv_pos) {
        if (waves) stage_drop_items(core, req->nonce);
        const int rc = stage_backend_kv_truncate(core->be, req->slot, pos);
        if (rc < 0) {
            snprintf(why, why_cap, "stage %d: dropping rejected draft rows: %s",
                     core->opt.stage_index, strata_last_error());
            return rc;
        }
        req->recv_pos = pos;
        return 0;
    }
    snprintf(why, why_cap, "stage %d: decode step for nonce %llu at pos %d, expected pos %d%s",
             core->opt.stage_index, (unsigned long long)req->nonce, pos, req->recv_pos,
             req->spec_rows > 1 ? " or inside the previous step's drafts" : "");
    return STRATA_EFORMAT;
}

int stage_spec_keep(struct stage_core *core, struct stage_req *req, int end) {
    const int keep = req->params.prompt_len + req->n_generated - 1;
    stage_spec_expect(req, keep, req->tokens[req->n_generated - 1]);
    /* The next step starts at keep (a step received already, drafted on a guess, is checked
     * against it when its turn comes); recv_pos follows when it arrives. */
    return keep < end ? stage_backend_kv_truncate(core->be, req->slot, keep) : 0;
}

static int is_stop(const struct stage_req *req, int32_t token) {
    for (int i = 0; i < req->params.num_stop_ids; i++)
        if (token == req->params.stop_ids[i]) return 1;
    return 0;
}

int stage_spec_verify(struct stage_core *core, struct stage_req *req, const struct stage_item *it,
                      uint64_t step, const float *logits, const int32_t *ids, int n, int32_t *out) {
    const int V = core->vocab;
    const int32_t *drafts = n < 2 ? NULL : core->is_first ? it->tokens + 1 : it->drafts;
    int m = 0;
    for (int r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * V;
        const int token =
            ids ? ids[r] : sampler_sample(&req->sampler, row, V, core->sampler_scratch);
        if (token < 0 || token >= V) {
            stage_fail(core, req, STRATA_EINVAL, 1, 1, "stage %d: sampling failed: %s",
                       core->opt.stage_index, strata_last_error());
            return STRATA_EINVAL;
        }
        if (core->opt.keep_logits && stage_keep_logits_row(req, step + (uint64_t)r, row, V) < 0) {
            stage_fail(core, req, STRATA_ENOMEM, 1, 1, "stage %d: out of memory for logits",
                       core->opt.stage_index);
            return STRATA_ENOMEM;
        }
        out[m++] = token;
        /* Row r + 1 was computed on draft r: its logits hold only when the draft is what
         * was sampled here; a stop ends the request at this token. */
        if (r + 1 == n || token != drafts[r] || is_stop(req, token)) break;
    }
    return m;
}
