/* The stage core: one pipeline stage's request state machine, independent of any I/O.
 *
 * A pipeline is a ring of S stages. Stage r owns decoder layers [layer_start, layer_end)
 * and a KV cache with `max_batch` slots (one per active request):
 *
 *   client -> stage 0 -> stage 1 -> ... -> stage S-1 --(TokenResult)--> stage 0 -> client
 *
 * Stage 0 embeds prompt chunks and fed-back tokens; the last stage applies the final norm,
 * lm_head and the request's sampler and sends the token back to stage 0, which streams it
 * to the client and either feeds it as the next decode step or ends the request. With S = 1
 * the one stage is first and last and the token loops back internally.
 *
 * The core speaks only in encoded wire frames (wire/message.h), so the TCP driver
 * (strata-stage) and the simulator (sim/) carry the same bytes. A driver:
 *   1. feeds every received frame to stage_core_on_frame(), saying which link it came on;
 *   2. calls stage_core_step() while stage_core_has_work() to run one microbatch each;
 *   3. drains stage_core_pop_frame() and sends each frame on the link it names;
 *   4. drains stage_core_pop_result() for finished / failed requests (logging, --out);
 *   5. reports a dead or closed link with stage_core_on_link_down().
 *
 * Links, as seen from stage r:
 *   STAGE_LINK_PREV   upstream: stage r-1 sends activations here; errors travelling back
 *                     go out on it. For stage 0 it is the ring link from the last stage
 *                     (TokenResults arrive on it).
 *   STAGE_LINK_NEXT   downstream: activations, final TokenResults and cancels go to
 *                     stage r+1; for the last stage it is the ring link to stage 0
 *                     (TokenResults go out on it).
 *   STAGE_LINK_CLIENT stage 0 only: one of several clients, told apart by `client_id`
 *                     (a number the driver chooses per connection).
 *
 * Messages (all frames are wire Frames; see runtime/stage/request.h for the client side):
 *   - Request (client -> stage 0 -> ... -> last): the wire Request (prompt ids, max_tokens,
 *     sampling, stop ids; nonce != 0; Qwen3-VL: image grids, vision embeddings, DeepStack).
 *     Each stage that admits it forwards the same frame to the next stage at once, ahead of
 *     the request's first activation, so every stage opens the request before its hidden
 *     rows arrive (stage 0 forwards a VL request expanded and without its vision tensors;
 *     stage_core_vl.c). Refused with an Error frame naming
 *     the limit (to the client on stage 0, upstream on later stages) when no KV slot is
 *     free (--max-batch) or prompt + max_tokens does not fit --max-seq.
 *   - Activation (stage r -> r+1): F32 [T, H] hidden rows of one request, lossless; for a
 *     Qwen3-VL request also position_ids I32 [3, T] and, in prefill while layers < K
 *     follow, deepstack [K - layer_end, T, H] + visual_mask (stage_core_vl.c).
 *     step = tokens generated so far (0 for every prefill chunk), pos = first cache
 *     position. On receipt the request must be open here, stage_to must equal this stage
 *     and (step, pos) must continue the request exactly; otherwise the request fails with
 *     an Error (never a silent miscompute).
 *   - TokenResult (last -> stage 0 -> client): the token sampled at `step`. When stage 0
 *     ends a request (stop id, max tokens) it sends the final TokenResult (finish = Stop or
 *     Length) to the client and forward through the pipeline, so every stage frees the
 *     request's KV slot; the last stage then reports the request's tokens and logits.
 *   - Control Cancel (client -> stage 0 -> ... -> last): frees the request everywhere.
 *   - Control Ping (any link): answered with a Pong on the same link (the TCP driver's
 *     keepalive for dead-peer detection); Pong, Drain and Shutdown are ignored here.
 *   - Control Reset (stage 0 -> ... -> last -> stage 0) and Request.resume_tokens: in-flight
 *     recovery after a stage died (stage_core_recovery_tick below; stage_recovery.c).
 *   - Control Describe (client -> stage 0 -> ... -> last -> stage 0 -> client): each stage
 *     appends its StageInfo; stage 0 answers the client (stage_describe.c).
 *   - Error (between stages, and stage 0 -> client): a failed request. A stage that fails a
 *     request sends an Error both ways (upstream errors stop at stage 0, which tells the
 *     client; downstream errors travel the ring to stage 0); a stage forwards an Error only
 *     for a request it still holds, so each error ends after at most one lap. Nonce 0 is
 *     reserved: an Error with nonce 0 is about the connection (the driver sends one before
 *     dropping a connection that delivered a bad frame); received from a stage it makes
 *     stage_core_on_frame() fail with STRATA_EPEER, so the driver drops that link too.
 *   - KvBlock (with send_kv): after a request's last prefill chunk the stage sends its KV
 *     for that request on NEXT right after the activation; a receiving core hands
 *     KvBlocks addressed to it to the driver as frames with link STAGE_LINK_LOCAL (for
 *     --kv-out). The last stage sends its KV too (to stage 0), and blocks of stages r >= 1
 *     travel on to stage 0, which keeps the latest per stage and request for recovery; a
 *     block addressed from and to the same stage r is r's own KV sent back by stage 0 for a
 *     replay, restored there (stage_recovery_kv.c).
 *
 * Batching: stage_core_step() takes pending work in arrival order, at most one item per
 * request (a prefill chunk or a decode row), up to `max_batch_tokens` rows, and runs it as
 * one backend forward call (runtime/stage/backend.h). Stage 0 additionally caps a microbatch at
 * ceil(N / S) of its N active requests, so the requests travel the ring as S staggered groups: with
 * S stages and >= S requests every stage has a group to compute at the same time. Stage 0
 * cuts each prompt into chunks of min(chunk_size, ceil(prompt_len / S)) rows, so even a
 * short prompt's chunks stream through the stages one after another: stage r starts
 * after r chunks, not r whole prompts, and no stage holds a returning token behind a whole
 * prompt's prefill. Within its cap stage 0 always takes its oldest item, at most one prompt
 * chunk, and decode rows only when no other prompt chunk is queued (prompts first: every
 * request starts decoding early, so none is left to finish alone on an idle ring; see
 * stage_core_step.c).
 * Measured with strata-sim (fixed 500 us per row and layer, 100 us links, 8 layers, 16-token
 * prompts, 32 tokens): S requests on S = 2, 4, 8 stages keep the stages 89%, 88% and 85%
 * busy (the bound: each request's token loop crosses S links per step), 2S requests 95%,
 * 96% and 98%.
 *
 * Deterministic: the same sequence of calls gives the same frames and results, and (by
 * reference/model.h's contract) a request's tokens and logits do not depend on the split,
 * on batching or on timing.
 *
 * Memory (one arena per role, no malloc per message once warm): stage_core_init allocates
 * the microbatch buffers (the backend holds the KV cache), stage 0's prompt rows [max_batch,
 * max_seq] and max_batch work items; work items are recycled with their hidden-row buffers and the
 * outgoing frames share one reused buffer (runtime/stage/stage_pool.c). Still allocated per
 * request (not per item or frame): its generated-token array and kept logits (both handed
 * to the caller in its stage_result), its result record, and with send_kv the packed KV.
 *
 * Threading: a core is used by one thread at a time; different cores are independent. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_CORE_H
#define STRATA_RUNTIME_STAGE_STAGE_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/backend.h"

enum stage_link {
    STAGE_LINK_PREV = 0,
    STAGE_LINK_NEXT = 1,
    STAGE_LINK_CLIENT = 2,
    STAGE_LINK_LOCAL = 3 /* output only: for the driver itself (received KvBlocks) */
};

struct oracle_draft; /* runtime/stage/oracle_draft.h */

struct stage_core_options {
    /* What this stage computes with: its weights, its role (layer range, embedding,
     * head) and its KV slots (max_batch = num_slots, max_seq). Borrowed: the caller frees
     * it after the core (runtime/stage/stage_open.h does both). */
    struct stage_backend *backend;
    int stage_index;      /* r, 0 <= r < num_stages */
    int num_stages;       /* S >= 1 */
    int chunk_size;       /* prefill rows per chunk on stage 0; 0 -> 64 */
    int max_batch_tokens; /* rows per microbatch; 0 -> chunk_size + max_batch */
    int keep_logits;      /* last stage: keep every sampled step's logits for results */
    int send_kv;          /* send a KvBlock after each request's prefill */
    /* Stage 0 of S > 1: when the ring breaks, hold the in-flight requests this long (ms) for
     * the ring to re-form, then replay them (stage_recovery.c); 0 = fail them at once. */
    int recovery_timeout_ms;
    /* Stage 0: speculative decoding for the requests that leave it to the stage
     * (runtime/stage/stage_speculate.c): enum wire_speculate OFF (or 0, DEFAULT) or NGRAM,
     * with at most speculate_k drafts per step (0: 4; at most 16). A request's own
     * Request.speculate / speculate_k win. The output is the same either way, bit for bit. */
    int speculate, speculate_k;
    /* Stage 0 of S > 1: decode steps of one request in flight at once (0 or 1: one; at most
     * 4): each later one is drafted on the guess that those before it are accepted whole, so
     * the stages work on one request together; a step whose guess fails is dropped. */
    int speculate_waves;
    /* Benchmarks only (runtime/stage/oracle_draft.h): drafts from a recorded run for the
     * requests that leave speculation to the stage, instead of speculate's. Borrowed. */
    const struct oracle_draft *oracle;
    /* Stage 0: the draft model of WIRE_SPECULATE_DRAFT (NULL: none, and such requests are
     * refused): a whole smaller model (embedding, every layer, head) with the target's vocabulary,
     * KV slots for every request and max_seq positions. Borrowed (stage_open opens and frees it).
     */
    struct stage_backend *draft;
    /* Stage 0: the driver's clock in seconds (monotonic, fine-grained), with which the core
     * times its decode steps to budget drafts under load (runtime/stage/step_cost.h). NULL:
     * no budget, the drafts as the requests ask (a simulator keeps its virtual time). */
    double (*now_sec)(void);
};

struct stage_core; /* opaque */

/* Allocates activation buffers, prompt rows and work items (see "Memory" above). Checks
 * the backend's role against this stage's place in the ring (layer range within the
 * model, stage 0 from layer 0 with the embedding, the last stage to layer L with the head)
 * with a clear message (STRATA_ERANGE / STRATA_EINVAL). */
int stage_core_init(struct stage_core **out, const struct stage_core_options *opt);
void stage_core_free(struct stage_core *core); /* accepts NULL */

/* Handles one received frame [len] (copied; the caller keeps its buffer). Returns 0 when
 * the frame was consumed, including when it made a request fail (that failure goes out
 * as Error frames and a result). Returns a negative status only when the frame itself is
 * unusable (does not verify, wrong protocol version, a message kind that makes no sense on
 * this link): the driver should log strata_last_error() and drop that connection. */
int stage_core_on_frame(struct stage_core *core, enum stage_link from, uint32_t client_id,
                        const uint8_t *frame, size_t len);

struct stage_request; /* runtime/stage/request.h */

/* Stage 0: submits a request in process, exactly as if client `client_id` had sent its
 * Request frame (same checks, same refusals as an Error to that client). The entry for a
 * producer in the same process, e.g. a vision stage feeding a Qwen3-VL request's images
 * (req->vision: grids, merged embeddings, DeepStack). Fails only when the request cannot
 * be encoded (STRATA_EINVAL) or this is not stage 0. */
int stage_core_submit(struct stage_core *core, uint32_t client_id, const struct stage_request *req);

/* A link died (closed, reset, timed out). Every request this stage holds that depends on
 * it fails: for PREV / NEXT that is every active request (each uses every stage); for a
 * client, that client's requests. Errors go out on the remaining links. `reason` is
 * included in the error messages. */
int stage_core_on_link_down(struct stage_core *core, enum stage_link link, uint32_t client_id,
                            const char *reason);

/* Cancels one request locally as if a Control Cancel had arrived from upstream (stage 0:
 * from its client). Unknown nonces are ignored. */
int stage_core_cancel(struct stage_core *core, uint64_t nonce);

/* 1 when stage_core_step() would run something. */
int stage_core_has_work(const struct stage_core *core);

/* The driver ran out of work and will wait for frames: the backend stops keeping threads
 * ready for the next microbatch (stage_backend_idle), so a pipeline's idle stages leave the
 * cores to the one computing. */
void stage_core_idle(struct stage_core *core);

/* Runs one microbatch. Returns the number of requests it advanced (0: nothing to do) or a
 * negative status on an internal failure (the affected requests have already failed). */
int stage_core_step(struct stage_core *core);

/* One outgoing frame. `data` points into the core's reused outgoing buffer (64-byte
 * aligned): it stays valid until the next call into this core (any stage_core_* function
 * taking it, pop_frame included). A driver that keeps a frame longer copies it. */
struct stage_frame {
    enum stage_link link;
    uint32_t client_id;  /* STAGE_LINK_CLIENT only */
    const uint8_t *data; /* [len] one encoded wire Frame (no length prefix) */
    size_t len;
};

/* Pops the oldest outgoing frame: returns 1 and fills `out`, or 0 when none is queued. The
 * previous popped frame's bytes are dead from this call on. */
int stage_core_pop_frame(struct stage_core *core, struct stage_frame *out);

enum stage_finish {
    STAGE_FINISH_STOP = 1,      /* a stop id was generated */
    STAGE_FINISH_LENGTH = 2,    /* max_tokens reached */
    STAGE_FINISH_CANCELLED = 3, /* cancelled by the client */
    STAGE_FINISH_ERROR = 4      /* failed: see status and message */
};

/* What one stage knows about a request when it leaves the stage. */
struct stage_result {
    uint64_t nonce;
    enum stage_finish finish;
    int status;        /* 0, or the STRATA_E* code of the failure */
    char message[256]; /* the failure, "" otherwise */
    int prompt_len;
    int n_tokens;          /* generated tokens known here (stage 0 and the last stage) */
    int32_t *tokens;       /* [n_tokens] or NULL */
    int vocab;             /* V */
    float *logits;         /* last stage with keep_logits: [n_tokens][V], else NULL */
    int drafted, accepted; /* stage 0: draft tokens its decode steps carried, and accepted */
};

/* Pops the oldest finished request record: 1 and fills `out` (free with
 * stage_result_free), or 0 when none. Nothing is lost silently: when memory ran out for
 * an outgoing frame or a record, a last record with nonce 0, STAGE_FINISH_ERROR and
 * STRATA_ENOMEM says how many and which was first. */
int stage_core_pop_result(struct stage_core *core, struct stage_result *out);
void stage_result_free(struct stage_result *result);

struct stage_core_stats {
    int active_requests; /* holding a KV slot */
    int free_slots;
    uint64_t microbatches; /* stage_core_step() calls that ran work */
    uint64_t rows;         /* hidden rows computed */
    /* What those rows attended to (what the performance model prices attention by): the KV
     * positions of one-row items (decode), and the (query, key) pairs of longer ones
     * (prefill chunks and draft rows: n rows after c positions attend to n·c + n(n+1)/2). */
    uint64_t attn_decode_positions, attn_prefill_rows, attn_prefill_pairs;
    uint64_t frames_in, frames_out;
    uint64_t refused; /* requests refused by admission control */
    uint64_t lost;    /* frames or results that could not be queued (out of memory) */
    /* Recovery (stage 0): requests held for a broken ring now, requests replayed so far,
     * and replayed requests that got their first new token so far. */
    int held_requests;
    uint64_t replayed;
    uint64_t recovered;
    /* KV-restoring recovery: stage 0, replays that started from KV copies and the prefill
     * rows they did not recompute; other stages, KV copies restored here. */
    uint64_t kv_restored;
    uint64_t kv_rows_saved;
    /* Admission queue (stage 0): waiting now; since start queued, admitted from the queue,
     * refused because it was full or their deadline passed, and the admitted ones' total
     * wait (ms, the driver's clock). */
    int queue_depth;
    uint64_t queued, queue_admitted, queue_full, queue_expired;
    int64_t queue_waited_ms;
    /* Prefix reuse (stage 0, since start): requests that looked their prompt up in the KV
     * cache, those that reused blocks, the prompt tokens reused and looked up. */
    uint64_t prefix_lookups, prefix_hits, prefix_cached_tokens, prefix_prompt_tokens;
    uint64_t prefix_fallbacks; /* checks that came back marked: sent again cold */
    /* Speculative decoding (stage 0, since start): decode steps sent with drafts, drafts
     * sent, drafts accepted (each accepted one is a token that took no trip of its own). */
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_withheld;
};
void stage_core_get_stats(const struct stage_core *core, struct stage_core_stats *out);

/* Stage 0: prefix reuse on (the default) or off (every prompt prefilled in full and nothing
 * kept for later requests; runtime/stage/stage_prefix_internal.h). */
void stage_core_set_prefix_cache(struct stage_core *core, int on);

/* In-flight recovery (stage_recovery.c; design there). Stage 0 with recovery_timeout_ms > 0
 * holds the requests of a broken ring instead of failing them. The driver calls this
 * regularly (every loop) with the time and whether both of stage 0's ring links are up:
 * it fails holds older than the timeout (an Error naming it to the client), and while
 * requests are held and the links are up sends a Control Reset around the ring every
 * 100 ms; its return proves the ring whole (every stage has dropped the held requests),
 * and stage 0 replays each held request as a prefill of prompt + the tokens generated so
 * far, resuming at the next step. Returns the number of requests still held. */
int stage_core_recovery_tick(struct stage_core *core, int64_t now_ms, int ring_up);
/* Stage 0's admission queue (stage_admission_internal.h): at most max_queue requests wait
 * for a KV slot, each at most timeout_ms (0: no deadline; the driver's clock is the one
 * stage_core_describe_tick gives); max_queue 0 (the default) refuses at once. STRATA_EINVAL
 * while requests wait. */
int stage_core_set_admission(struct stage_core *core, int max_queue, int timeout_ms);

/* Sets recovery_timeout_ms after init (strata-stage's --recovery-timeout-ms). */
void stage_core_set_recovery_timeout(struct stage_core *core, int timeout_ms);
/* KV-restoring recovery (stage_recovery_kv.c). With send_kv on the later stages, stage 0
 * keeps each one's latest KvBlock per request (at most keep_bytes in all) and a replay
 * restores every stage's KV from them, recomputing only the rows after the copies. */
enum stage_kv_recovery {
    STAGE_KV_RECOVERY_AUTO = 0,    /* restore when sending the copies is cheaper (the rule
                                    * in stage_recovery_kv.c) */
    STAGE_KV_RECOVERY_RESTORE = 1, /* restore whenever every copy is there */
    STAGE_KV_RECOVERY_REPLAY = 2   /* always recompute the whole prefill */
};
void stage_core_set_kv_recovery(struct stage_core *core, enum stage_kv_recovery mode,
                                size_t keep_bytes);
/* The driver's measurements for the AUTO rule: nanoseconds per prefill row this stage
 * computes, and bytes per second its next link sends; 0 = not measured yet. */
void stage_core_set_recovery_costs(struct stage_core *core, double row_ns, double link_bytes_per_s);
/* Fails every held request at once with `why` (stage 0 shutting down). */
void stage_core_fail_held(struct stage_core *core, const char *why);

/* KV bytes the backend holds (all slots at max_seq). */
size_t stage_core_kv_bytes(const struct stage_core *core);

/* Where this stage sits and what it computes: read by the Hello, the startup summary and
 * logs, so nothing can announce another range than the backend computes. */
struct stage_core_info {
    int stage_index, num_stages;
    int num_layers;          /* L of the model */
    struct stage_role role;  /* the backend's layer range and roles */
    int max_seq, max_batch;  /* the backend's KV slots */
    const char *device_kind; /* "cpu", ... */
};
void stage_core_get_info(const struct stage_core *core, struct stage_core_info *out);

/* Ring describe (stage_describe.c; design there): what the pipeline's stages are, asked by a
 * client with a Control Describe (nonce != 0) to stage 0 and answered with one StageInfo per
 * stage in ring order, or an Error with the same nonce. */
/* What this stage's entry says beyond the core's info (stage_open.c sets it): grid degrees
 * (0 = 1), CPU threads and the weights dtype (NULL = "bf16"). */
void stage_core_set_describe(struct stage_core *core, int tp, int kvp, int num_threads,
                             const char *weights_dtype);
/* The link onwards as the driver dialled it ("host:port"), or NULL while it is down: the
 * entry's `next`, so a reader can draw the ring and find which stage stopped answering. */
void stage_core_set_next_link(struct stage_core *core, const char *address);
struct wire_stage_info; /* wire/message.h */
/* This stage's entry; its strings point into the core (valid while it lives). */
void stage_core_describe_self(struct stage_core *core, struct wire_stage_info *out);
/* Driver tick (every loop, like stage_core_recovery_tick): the time and whether stage 0's
 * ring links are down. A describe that arrives while one is down, or that is in flight when
 * one goes down, fails at once (an Error naming the link); one that has not come back round
 * the ring after timeout_ms fails with STRATA_ETIMEOUT. Returns the describes in flight. */
int stage_core_describe_tick(struct stage_core *core, int64_t now_ms, int prev_down, int next_down,
                             int timeout_ms);

/* Restores a KvBlock frame (as written by --kv-out) into a fresh slot: only when the
 * block's layer range equals this stage's (STRATA_ERANGE with both ranges otherwise).
 * Reports the restored nonce and positions. The slot is then held for that nonce: its
 * Request (forwarded from upstream) supplies the parameters, and an Activation that
 * continues at the restored position resumes the request there; a Cancel frees it. (Stage-0 resume
 * of a migrated request is not implemented: stage 0 always prefills from position 0.) */
int stage_core_restore_kv(struct stage_core *core, uint64_t *nonce, int *positions,
                          const uint8_t *frame, size_t len);

#endif
