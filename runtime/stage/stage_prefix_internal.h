/* Prefix reuse in the stage core (stage_prefix.c): which prompt blocks a request takes from
 * the KV cache and which it leaves there.
 *
 * Stage 0 decides and every stage applies the same decision. Stage 0 keys the prompt's full
 * blocks of 16 positions with a hash chain over the token ids (SipHash-2-4 under a key of
 * its own, drawn at start: a client cannot make two prefixes collide), looks up how many
 * leading blocks its pool holds (leaving at least the last prompt token to compute, whose
 * row gives the first token), and sends the keys and that count with the Request. Each
 * stage attaches the same blocks to the request's slot and starts its prefill after them.
 * When a request finishes normally (stop or length: every stage has written every prompt
 * position) each stage keeps the prompt's blocks under the keys, cached until the pool
 * needs them (least recently used first); a cancelled or failed request keeps nothing.
 * The answer's blocks are kept too: stage 0 continues the chain over the generated tokens
 * whose KV every stage wrote (all but the last) and sends those keys with the finish, so the
 * next turn of a chat, whose prompt holds the answer, reuses it instead of prefilling it
 * again. Those positions were computed by decode steps (and verification rows), which give
 * the bits a prefill of the same ids gives (reference/ops.h: a row's result does not depend
 * on the rows beside it), so a turn that reuses them equals a cold one.
 *
 * Why a later stage normally finds the blocks stage 0 found: all stages see the same
 * requests, finishes and attaches in the same order (stage 0 sends them down the ring in
 * order), a later stage's own allocations only lag stage 0's, and each pool evicts least
 * recently used first; so a pool holding at least as many blocks as stage 0's holds at
 * least what stage 0's holds. But a stage may have restarted with an empty pool, or have a
 * smaller one; so it is checked, never assumed: stage 0 sends a Control PrefixCheck right
 * behind the Request and holds the prefill until it comes back round the ring. A stage that
 * lacks a block admits nothing, forwards nothing of the Request, and marks the check (seq 1).
 * A clean check lets stage 0 start the prefill after the blocks; a marked one makes it
 * cancel the request on the stages that did attach, forget every key of its own pool (so
 * the next requests go cold and the pools agree again) and send the Request again cold,
 * under the same nonce, the client seeing only the delay. Never a silent recompute of
 * something else.
 *
 * A Qwen3-VL prompt's image tokens all have one id, so a block that holds some of an image's
 * rows also chains that image's digest: SipHash of its grid, its merged vision embeddings and
 * its DeepStack rows, which are everything the image contributes to the KV (its M-RoPE
 * positions follow from the grid, and the positions after it from the chain). Two requests
 * with the same text and different pictures share only the blocks before the first picture.
 * Recovery replays start cold. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_PREFIX_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_PREFIX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

struct stage_core;
struct stage_req;
struct stage_vl;
struct wire_request;

struct stage_prefix {
    int off;         /* stage 0: --no-prefix-cache (no keys, nothing looked up or kept) */
    uint64_t key[2]; /* stage 0: SipHash key of the block chain */
    /* Stage 0, since start: requests looked up, of them those that reused blocks, and the
     * prompt tokens they reused (of prompt_tokens looked up). */
    uint64_t lookups, hits, cached_tokens, prompt_tokens, fallbacks;
    /* Later stages: nonces whose cached blocks were not all here (the next PrefixCheck for
     * each is marked), a small ring: a check follows its Request at once. */
    uint64_t missed[16];
    int missed_next;
};

/* Stage 0 at init: draws the key. */
void stage_prefix_init(struct stage_core *core);

/* Stage 0: the keys of prompt [prompt_len]'s full blocks into *keys (malloc'd; n_keys of
 * them; NULL and 0 when there are none; vl: the request's vision inputs or NULL, whose
 * expanded ids the prompt is then) and how many leading ones the pool holds, *cached
 * (at most (prompt_len - 1) / 16); *cost: the positions the request's reservation counts
 * (need less the attached blocks, plus those of them the attach takes from the available).
 * 0 or STRATA_ENOMEM. */
int stage_prefix_plan(struct stage_core *core, const int32_t *prompt, int prompt_len,
                      const struct stage_vl *vl, int64_t need, uint64_t **keys, int *n_keys,
                      int *cached, int64_t *cost);

/* At admission, after the slot is acquired: attaches `cached` leading blocks of keys [n_keys]
 * (taking over keys: freed with the request) and sets the request to continue after them.
 * STRATA_ENOTFOUND with `why` when this stage lacks one of them. */
int stage_prefix_attach(struct stage_core *core, struct stage_req *req, uint64_t *keys, int n_keys,
                        int cached, char *why, size_t why_cap);

/* Stage 0: the Request it forwards (fwd, a copy of the client's) carries req's keys and
 * cached count. */
void stage_prefix_forward_fields(const struct stage_req *req, struct wire_request *fwd);

/* Stage 0 at a normal finish: the keys of the full blocks after the prompt's whose KV every
 * stage wrote (the prompt and every generated token but the last) follow the prompt's in
 * req->keys [req->n_answer_keys], for every stage to keep (chained as the next turn's plan
 * will chain them: a picture's rows in the prompt's last blocks chain its digest). None with
 * the prefix cache off, or when memory is short (the answer is then recomputed next turn). */
void stage_prefix_answer(struct stage_core *core, struct stage_req *req);

/* A later stage, with the finish (step: the last token's) that carries them: the answer's
 * keys [n] follow the prompt's; ignored unless they name only whole blocks of positions this
 * stage wrote. */
void stage_prefix_take_answer(struct stage_req *req, const uint64_t *keys, size_t n, uint64_t step);

/* At a normal finish, before the slot is released: keeps the prompt's blocks and the
 * answer's. */
void stage_prefix_keep(struct stage_core *core, struct stage_req *req);

/* A later stage that could not attach a request's cached blocks: remembered for its check. */
void stage_prefix_note_miss(struct stage_core *core, uint64_t nonce);

/* A PrefixCheck arrived (msg's nonce and seq): later stages mark and forward it; stage 0
 * starts the request's prefill, or falls back to a cold one. */
void stage_prefix_on_check(struct stage_core *core, uint64_t nonce, uint64_t seq);

/* Stage 0, after forwarding a request with cached blocks: sends its check and holds the
 * prefill (S = 1: starts it at once). */
void stage_prefix_start(struct stage_core *core, struct stage_req *req);

#endif
