/* Speculative decoding through the pipeline: the stage core's part (design in
 * stage_speculate.c). Its state in the core; per request, the fields spec_* of struct
 * stage_req (stage_core_internal.h). Not for other modules: use stage_core.h. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_SPECULATE_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_SPECULATE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/step_cost.h"
#include "wire/message.h"

#define STAGE_SPECULATE_DEFAULT_K 4
#define STAGE_SPEC_MAX_WAVES 4 /* decode steps of one request in flight at most */

/* Stage 0: one decode step in flight: its first position, rows, whether row 0's id is a
 * guess (a later wave's), and the ids its rows feed. */
struct stage_spec_wave {
    int pos, rows, guessed;
    int32_t ids[1 + WIRE_SPECULATE_MAX_K];
};

struct stage_speculate {
    /* Stage 0's default for requests that leave it to the stage (Request.speculate
     * Default): WIRE_SPECULATE_OFF or _NGRAM, and drafts per step. */
    enum wire_speculate mode;
    int k;
    int waves; /* decode steps of one request in flight (1: a step waits for the one before) */
    const struct oracle_draft *oracle; /* benchmarks: drafts from a recorded run instead */
    /* The draft model (borrowed; NULL: none) and its scratch: hidden rows [rows, H of the
     * draft model] and logits [rows, V] for its argmax. */
    struct stage_backend *draft;
    float *draft_hidden, *draft_logits;
    int draft_rows;
    /* Stage 0, since start: decode steps sent with drafts, drafts sent, drafts accepted. */
    uint64_t steps, drafted, accepted;
    /* Stage 0 with a clock (stage_core_options.now_sec): its decode steps' cost by rows, the
     * draft budget under load; drafts withheld by it since start. */
    struct step_cost cost;
    uint64_t withheld;
};

struct stage_core;
struct stage_core_options;
struct stage_backend;
struct stage_req;
struct stage_item;

/* A draft model fit to draft for the target: the same vocabulary, the whole model, room for
 * every request at max_seq. 0, or STRATA_EINVAL naming what differs. */
int stage_spec_check_draft(const struct stage_core_options *opt);
/* Stage 0: takes the draft model (may be NULL) and allocates its scratch. */
int stage_spec_init_draft(struct stage_core *core, struct stage_backend *draft);
void stage_spec_free(struct stage_core *core);
/* Gives back a request's slot in the draft model (if it holds one). */
void stage_spec_drop(struct stage_core *core, struct stage_req *req);
/* Stage 0: whether a Request's speculation can be served here: STRATA_EINVAL (message set)
 * for draft-model drafts on a stage without a draft model. */
int stage_spec_check_request(const struct stage_core *core, const struct wire_request *msg);

/* Stage 0: the drafts per step of an admitted request, from its Request and the default. */
void stage_spec_admit(struct stage_core *core, struct stage_req *req,
                      const struct wire_request *msg);

/* Stage 0, after the tokens of the oldest step in flight (n of them, from `step`... already
 * taken): keeps the later steps when the oldest was accepted whole and the next one's guessed
 * first id is the last token, else drops them (and the rejected rows' KV); then tops the steps
 * in flight up to the request's waves. 0, or a negative status (the request has failed). */
int stage_spec_next(struct stage_core *core, struct stage_req *req, const int32_t *tokens, int n);
/* Stage 0: the rows the oldest step in flight has (1 when none is). */
int stage_spec_head_rows(const struct stage_req *req);
/* Last stage: 1 when decode step `it` of req was drafted on a guess that turned out wrong
 * (it starts elsewhere, or feeds another id, than the last verified step left): drop it. */
int stage_spec_stale(const struct stage_req *req, const struct stage_item *it);
/* Last stage: the next decode step must start at pos and feed id. */
void stage_spec_expect(struct stage_req *req, int pos, int32_t id);

/* Stage 0: a step with drafts came back with `accepted` of them right: the next steps draft
 * more after a full hit, fewer after a partial one, and none for a few steps after a total
 * miss (a draft that misses costs its row on every stage). */
void stage_spec_after(struct stage_req *req, int drafted, int accepted);

/* Stages r > 0: a decode step's activation at `pos`, before it is queued. After a step with
 * drafts it may start inside that step (the rows from pos on were rejected): they are
 * dropped here. Returns 0, or a negative status with `why` filled when pos continues neither
 * way. */
int stage_spec_rewind(struct stage_core *core, struct stage_req *req, int pos, int waves, char *why,
                      size_t why_cap);

/* Last stage, once a step's tokens are sampled (the step's rows ended at KV position end):
 * drops the rows past the last accepted one and expects the next step at that position,
 * feeding the last token. */
int stage_spec_keep(struct stage_core *core, struct stage_req *req, int end);

/* Last stage: samples a decode step's rows in order, rows [n] of logits [n, V] (or the
 * greedy ids [n]), accepting each draft that equals the token sampled before it; writes the
 * tokens (the accepted drafts' and the one after them) to out and returns how many, or a
 * negative status (the request has failed then). Each token's logits row is kept as a step
 * without drafts keeps it, and the sampler draws once per token, as it would step by step. */
int stage_spec_verify(struct stage_core *core, struct stage_req *req, const struct stage_item *it,
                      uint64_t step, const float *logits, const int32_t *ids, int n, int32_t *out);

#endif
