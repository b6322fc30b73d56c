/* Private state of the stage core, shared by stage_core.c (messages, requests),
 * stage_core_results.c (outgoing frames, results, ending requests), stage_core_step.c (the
 * microbatch) and the files named below. The ring describe and recovery own their state
 * (stage_describe_internal.h, stage_recovery_internal.h), which the core composes. Not for
 * other modules: use stage_core.h. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_CORE_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_CORE_INTERNAL_H

#include <stdint.h>

#include "reference/sampler.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/request.h"
#include "runtime/stage/spec_pace.h"
#include "runtime/stage/stage_admission_internal.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_describe_internal.h"
#include "runtime/stage/stage_prefix_internal.h"
#include "runtime/stage/stage_recovery_internal.h"
#include "runtime/stage/stage_speculate_internal.h"
#include "wire/message.h"

#define STAGE_RECENT_DEAD 64 /* remembered nonces of requests that ended here */
/* Stage 0: a Qwen3-VL request's vision inputs, checked against the model and laid out for
 * the expanded prompt (one allocation; stage_core_vl.c). */
struct stage_vl {
    int prompt_len;        /* expanded prompt rows */
    int n_image_tokens;    /* image-pad rows of the prompt */
    int num_deepstack;     /* K */
    int rope_delta;        /* decode position = cache index + rope_delta (spec §5.3) */
    int32_t *ids;          /* [prompt_len] expanded prompt ids */
    int32_t *positions;    /* [3, prompt_len] M-RoPE rows t, h, w (get_rope_index) */
    float *embeds;         /* [n_image_tokens, H] rows replacing the image-pad embeddings */
    float *deepstack;      /* [K, n_image_tokens, H] */
    int n_images;          /* images, in the order of their rows in embeds */
    struct vl_grid *grids; /* [n_images] */
};

/* One request held by this stage (it owns KV slot `slot`). */
struct stage_req {
    int active;
    int restored; /* holds restored KV, parameters (its Request) not known yet */
    uint64_t nonce;
    int slot;
    uint32_t client_id; /* stage 0: who asked */
    struct request_params params;
    int recv_pos;    /* positions received / queued so far (next expected pos) */
    int n_generated; /* tokens known here (stage 0: received; last: sampled) */
    int32_t *tokens; /* [params.max_tokens] */
    float *logits;   /* last stage with keep_logits: [logits_cap][V], grown on demand */
    int logits_cap;
    int32_t *prompt; /* stage 0: [prompt_len], the slot's row of core->prompts */
    struct sampler sampler;
    struct stage_vl *vl; /* stage 0, Qwen3-VL requests: vision inputs (else NULL) */
    int picked;          /* scratch: its first queued item is known while a microbatch is formed */
    /* Recovery (stage 0, stage_recovery.c): waiting for the ring to re-form since
     * held_at_ms (-1: not stamped yet), and why; replayed and not yet given a new token. */
    int held;
    int64_t held_at_ms;
    int replaying;
    char held_why[200];
    /* Stage 0 (stage_recovery_kv.c): the latest KvBlock frame of each later stage for this
     * request ([num_stages], entry 0 unused; NULL until the first arrives). Other stages:
     * kv_recovered = its KV was restored from such a copy for a replay (dropped by a Reset). */
    struct stage_kv_copy *kv_copies;
    int kv_recovered;
    /* Prefix reuse (stage_prefix.c): the prompt's full blocks' keys [n_keys] (NULL: none)
     * and how many leading blocks were attached from the cache; at a normal finish the
     * answer's full blocks' keys follow them [n_answer_keys]. */
    uint64_t *keys;
    int n_keys, cached_blocks, n_answer_keys;
    int prefix_wait; /* stage 0: its PrefixCheck is out; the prefill waits for it */
    /* Speculative decoding (stage_speculate.c). Stage 0: drafts per step (0: none) and
     * spec_ids, the ids of the step in flight (the fed token, then its drafts). Every stage:
     * the last decode step's first position and rows; with rows > 1 (drafts) the next step
     * may start at any of its positions after the first, and the rows from there on (the
     * rejected drafts') are dropped. 0 rows: nothing to drop. */
    struct spec_pace pace;           /* stage 0: drafts per step */
    int spec_waves;                  /* stage 0: decode steps it may have in flight (>= 1) */
    int spec_drafted, spec_accepted; /* stage 0: this request's drafts so far, accepted */
    int spec_oracle;                 /* stage 0: its drafts come from core->spec.oracle */
    /* Stage 0 with a draft model: the request's slot there (while drafting is set) and the
     * positions of its sequence that slot holds. */
    int spec_model; /* its drafts come from the draft model */
    int drafting, draft_slot, draft_len;
    int spec_pos, spec_rows;
    /* Stage 0: the decode steps in flight, oldest first (a ring: wave_head, n_waves); more
     * than one only with --speculate-waves, each later one drafted on the guess that the
     * ones before it are accepted whole. */
    struct stage_spec_wave waves[STAGE_SPEC_MAX_WAVES];
    int wave_head, n_waves;
    /* Last stage: where the next decode step must start and the id it must feed (a step that
     * does not was drafted on a wrong guess: it is dropped). */
    int expect_set, expect_pos;
    int32_t expect_id;
};

/* One kept KvBlock frame (stage 0): `len` bytes, covering KV positions [0, positions). */
struct stage_kv_copy {
    uint8_t *frame;
    size_t len;
    int positions;
};

/* Positions a request prefills (step 0 activations): its prompt, plus on a recovery replay
 * the tokens generated before the break (the last row is sampled as step resume_len). */
static inline int stage_prefill_len(const struct stage_req *req) {
    return req->params.prompt_len + req->params.resume_len;
}

/* A unit of pending work: one prefill chunk or one decode row of one request. */
struct stage_item {
    uint64_t nonce;
    uint64_t step;
    int pos;
    int n_tokens;
    const int32_t *tokens; /* stage 0: [n_tokens] ids (into the request's prompt or `token`) */
    int32_t token;         /* stage 0 decode: the fed-back token */
    float *hidden;         /* other stages: [n_tokens, H] copied from the frame */
    size_t hidden_cap;     /* floats allocated at `hidden` (kept when the item is recycled) */
    /* Other stages, Qwen3-VL rows received with the hidden rows (buffers kept on recycle):
     * M-RoPE positions [3, n_tokens] when has_positions; with num_deepstack > 0 the
     * DeepStack features [num_deepstack, n_tokens, H] of absolute layers (rows of layers
     * before this stage are unused) and the visual mask [n_tokens]. */
    int has_positions;
    int num_deepstack;
    int32_t *positions;
    size_t positions_cap;
    uint8_t *visual;
    size_t visual_cap;
    float *deepstack;
    size_t deepstack_cap;
    /* Other stages: a decode step's draft ids (rows 1 .. n_tokens - 1; stage 0's are in
     * `tokens`), from the activation. */
    int n_drafts;
    int32_t drafts[WIRE_SPECULATE_MAX_K];
    int has_fed_id; /* other stages: the activation said which id row 0 fed */
    int32_t fed_id;
    int taken; /* scratch: chosen for the microbatch being formed */
    struct stage_item *next;
};

/* One queued outgoing frame: bytes [offset, offset + len) of the queue's buffer. */
struct stage_out_desc {
    enum stage_link link;
    uint32_t client_id;
    size_t offset;
    size_t len;
};

/* Outgoing frames, reused buffers (see stage_pool.c). */
struct stage_out_queue {
    uint8_t *bytes; /* [cap], 64-byte aligned; frames in [descs[head].offset, used) */
    size_t cap, used;
    struct stage_out_desc *descs; /* [descs_cap]; queued: [head, head + count) */
    size_t descs_cap, head, count;
};

struct stage_result_node {
    struct stage_result result;
    struct stage_result_node *next;
};

/* Pending work items in arrival order, and the recycled ones (stage_pool.c). */
struct stage_work {
    struct stage_item *head, *tail;
    struct stage_item *free_items;
};

/* What the core hands its driver (stage_core_results.c, stage_pool.c): outgoing frames,
 * result records (and their pool), and what could not be queued since the last report. */
struct stage_outbox {
    struct stage_out_queue frames;
    struct stage_result_node *res_head, *res_tail;
    struct stage_result_node *free_results;
    uint64_t lost;
    char lost_first[320]; /* the first of them */
};

struct stage_core {
    struct stage_core_options opt;
    struct stage_backend *be; /* borrowed (opt.backend): weights, role, KV slots */
    int max_batch;            /* KV slots (the backend's) */
    int max_seq;              /* KV positions per slot (the backend's) */
    int hidden_size;          /* H */
    int vocab;                /* V */
    int is_first, is_last;
    struct stage_req *reqs; /* [max_batch], indexed by KV slot */
    struct stage_work work;
    struct stage_outbox outbox;
    uint64_t recent_dead[STAGE_RECENT_DEAD];
    int recent_dead_next;
    struct wire_arena arena;
    /* Microbatch buffers. */
    int32_t *prompts;           /* stage 0: [max_batch, max_seq] prompt ids, row = KV slot */
    float *hidden;              /* [max_batch_tokens, H] */
    float *last_rows;           /* [logit_rows, H] rows that get logits (last stage) */
    float *logits;              /* [logit_rows, V] */
    void *sampler_scratch;      /* [2 * V * 4] bytes */
    struct forward_item *items; /* [max_batch] */
    struct stage_item **picked; /* [max_batch] */
    /* Stage 0 of a Qwen3-VL model: one microbatch's M-RoPE positions, visual mask and
     * DeepStack rows, each item at its row offset (stage_core_vl.c). */
    int32_t *vl_positions; /* [3 * max_batch_tokens] */
    uint8_t *vl_visual;    /* [max_batch_tokens] */
    float *vl_deepstack;   /* [K * max_batch_tokens * H] */
    struct stage_core_stats stats;
    int64_t clock_ms;                 /* the driver's clock as of its last tick */
    struct stage_admission admission; /* stage_admission_internal.h */
    struct stage_recovery recovery;   /* stage_recovery_internal.h */
    struct stage_describe describe;   /* stage_describe_internal.h */
    struct stage_prefix prefix;       /* stage_prefix_internal.h */
    struct stage_speculate spec;      /* stage_speculate_internal.h */
    int logit_rows;                   /* rows last_rows and logits hold */
};

/* Any client, for stage_admission_leave. */
#define STAGE_ANY_CLIENT UINT32_MAX

/* stage_core.c helpers used by the step, recovery and the admission queue. */
/* Stage 0: a waiting Request frame admitted from the queue (as on arrival, but it never
 * waits again: refused if no slot after all). */
void stage_admit_waiting(struct stage_core *core, uint32_t client_id, const uint8_t *frame,
                         size_t len);
/* 1 when a KV slot holds no request. */
int stage_has_free_slot(const struct stage_core *core);
/* Stage 0: 1 when a request filling `need` KV positions could start now (a free slot, and
 * the pool's blocks for its reservation). */
int stage_can_start(struct stage_core *core, int64_t need);
struct stage_req *stage_find(struct stage_core *core, uint64_t nonce);
/* Queues one unit of work: stage 0 passes token ids (`tokens` or the single `token`), other
 * stages the received hidden rows (decoded into the item's reused buffer). */
int stage_enqueue(struct stage_core *core, uint64_t nonce, uint64_t step, int pos, int n_tokens,
                  const int32_t *tokens, int32_t token, const struct wire_tensor *hidden);
/* 1 when `nonce` ended here lately (its late frames are dropped quietly). */
int stage_recently_ended(const struct stage_core *core, uint64_t nonce);

/* stage_core_decode.c: a running request's frames (0, or a negative status for a frame
 * that is unusable as stage_core_on_frame says). */
int stage_on_activation(struct stage_core *core, const struct wire_activation *msg);
int stage_on_token_result(struct stage_core *core, const struct wire_token_result *msg);
/* Stage 0: n >= 1 tokens for `req` from `step` on (from the ring, or local when S = 1): one,
 * or after a step with drafts the accepted drafts' tokens and the one after them. */
void stage_on_tokens(struct stage_core *core, struct stage_req *req, uint64_t step,
                     const int32_t *tokens, int n);
int stage_enqueue_ids(struct stage_core *core, uint64_t nonce, int pos, int n_tokens,
                      const int32_t *tokens);
int stage_prefill_chunk(const struct stage_core *core, int rows);

/* stage_core_results.c: outgoing frames, result records, ending a request. */
/* Queues a copy of the arena's frame for `link`. */
int stage_emit_arena(struct stage_core *core, enum stage_link link, uint32_t client_id);
void stage_emit_error(struct stage_core *core, enum stage_link link, uint32_t client_id, int code,
                      uint64_t nonce, const char *message);
/* What a TokenResult carries beyond its token: what stage 0 tells a client with each token
 * (prompt positions from the KV cache, the request's draft tokens so far, accepted and
 * rejected, and the prompt's positions as run), or between stages, with a finish, the
 * answer's block keys (stage_prefix_internal.h). */
struct stage_token_fields {
    int cached, accepted, rejected, prompt;
    const uint64_t *block_keys;
    int num_block_keys;
};
void stage_emit_token(struct stage_core *core, enum stage_link link, uint32_t client_id,
                      uint64_t nonce, uint64_t step, int32_t token, enum wire_finish finish,
                      const struct stage_token_fields *fields); /* NULL: none */
void stage_emit_control(struct stage_core *core, enum stage_link link, uint32_t client_id,
                        enum wire_control_kind kind, uint64_t nonce, uint64_t seq);
/* Counts a frame or result that could not be queued (stage_core_pop_result reports it). */
void stage_note_lost(struct stage_core *core, const char *what, uint64_t nonce);
/* A request that never got a slot here (refused): a result for the driver's log. */
void stage_push_refusal(struct stage_core *core, uint64_t nonce, int code, const char *msg);
/* Ends a request here without error frames (its result says why). */
void stage_release(struct stage_core *core, struct stage_req *req, enum stage_finish finish,
                   int status, const char *message);
/* Fails a request: Error frames upstream (up), downstream (down) and to its client on
 * stage 0, a result, and the slot freed. */
void stage_fail(struct stage_core *core, struct stage_req *req, int code, int up, int down,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Frees a request's buffers (KV copies, vision inputs, tokens, logits) and clears it. */
void stage_free_req_buffers(struct stage_core *core, struct stage_req *req);

/* stage_core_vl.c: Qwen3-VL inputs through the pipeline (design in that file). */
int stage_vl_init(struct stage_core *core);
void stage_vl_free_core(struct stage_core *core);
int stage_vl_prepare(const struct stage_core *core, struct stage_vl **out, int *prompt_len,
                     const struct wire_request *msg);
void stage_vl_free(struct stage_vl *vl);
/* The Request stage 0 forwards (fwd, a copy of the client's) carries req's expanded prompt
 * and no vision tensors. */
void stage_vl_forward_fields(const struct stage_req *req, struct wire_request *fwd);
void stage_vl_fill(struct stage_core *core, const struct stage_req *req,
                   const struct stage_item *it, float *hidden, int row_off,
                   struct forward_item *fi);
int stage_vl_check_activation(const struct stage_core *core, const struct wire_activation *msg,
                              int rows);
int stage_vl_take_activation(struct stage_core *core, struct stage_item *it,
                             const struct wire_activation *msg);
void stage_vl_item(const struct stage_core *core, const struct stage_item *it,
                   struct forward_item *fi);
void stage_vl_attach(const struct stage_core *core, const struct forward_item *fi,
                     struct wire_activation *msg);

/* stage_core_step.c: stores logits row `step` [V] of a request (--out). */
int stage_keep_logits_row(struct stage_req *req, uint64_t step, const float *row, int V);

/* stage_pool.c: work items and the outgoing frame queue. */
int stage_pool_init(struct stage_core *core, int num_items);
void stage_pool_free(struct stage_core *core); /* queued and free items, frame queue */
/* A cleared work item whose hidden buffer holds at least [hidden_rows, H] floats; NULL
 * (with the error set) when out of memory. */
struct stage_item *stage_item_get(struct stage_core *core, int hidden_rows);
/* Returns an item to the free list (accepts NULL). */
void stage_item_put(struct stage_core *core, struct stage_item *item);
/* Queues a copy of frame [len] for `link` in the outgoing frame queue. */
int stage_emit_raw(struct stage_core *core, enum stage_link link, uint32_t client_id,
                   const uint8_t *frame, size_t len);

#endif
