/* The CPU reference decoder for Qwen3 / Qwen3-MoE (and the Qwen3-VL text stack): the
 * numerical truth for every stage split and backend, and the CPU backend of a stage.
 *
 * A `reference_model` owns the weights of one contiguous layer range [layer_start,
 * layer_end) plus, optionally, the token embedding (first stage) and the final norm +
 * lm_head (last stage; the embedding is reused when tied). The same layer code runs a
 * prefill of many tokens and a decode of one token, for one request or a microbatch of
 * several requests (each with its own KV slot).
 *
 * Determinism contract (the pipeline's split equality depends on it): every output
 * element is computed with a fixed reduction order that does not depend on the thread
 * count, on how many rows/requests are in the batch, or on which rows sit next to it.
 * So [0,k) then [k,L) equals [0,L) bit for bit, 1 thread equals N threads, and a request
 * batched with others equals the same request run alone.
 *
 * Threads: a model owns its worker pool and activation scratch, so one thread at a time
 * calls forward/logits on it; separate models (stages) may run concurrently.
 *
 * Math: shared spec qwen3-architecture.md §3 (layer), §4 (MoE), §5.1 (M-RoPE), §5.4
 * (DeepStack add after a layer's output). Activations and the KV cache are fp32. */
#ifndef STRATA_REFERENCE_MODEL_H
#define STRATA_REFERENCE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "reference/kv_cache.h"
#include "runtime/base/progress.h"
#include "runtime/model/decoder_io.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"

struct reference_model; /* opaque */

/* Tensor parallelism (Megatron-LM; the slices are runtime/model/tp_shard.h's): the group's
 * collectives, supplied by the caller (the stage backend wires them to wire/collective.h,
 * a test to threads), so the decoder needs no network. Every rank of a TP group makes the
 * same calls in the same order with the same n. Each returns 0 or a negative STRATA_E*
 * status with the message set; a failure fails the forward / logits call.
 *   allreduce_sum: data [n] <- Σ over ranks in rank order (bit-identical on every rank).
 *   allgather:     out [tp·n] <- every rank's in [n], rank r's at out + r·n. */
struct reference_collective {
    void *ctx;
    int (*allreduce_sum)(void *ctx, float *data, size_t n);
    int (*allgather)(void *ctx, float *out, const float *in, size_t n);
};

/* KV parallelism (Medha): kvp <= 1 = the model holds every KV position. Else it is KVP rank
 * `rank` and holds the positions kvp_token_range() gives it (runtime/model/tp_shard.h;
 * `tokens` per rank, `max_seq` in all); its KV cache holds only those (kv_cache max_seq =
 * their count) while positions and lengths stay global. Attention runs over the held keys;
 * the partials are all-gathered over `coll` (allgather only) and merged in rank order
 * (ops.h attention_merge). Everything else is replicated on the KVP ranks. */
struct reference_kvp {
    int kvp, rank, tokens, max_seq;
    struct reference_collective coll;
};

/* The weights the matmuls read: as stored in the checkpoint (bf16, or f32 / f16 widened to
 * f32), or quantised once at load to q8 blocks (reference/ops_q8.h: `--weights-dtype q8`).
 * q8 covers every layer projection, the experts and the lm_head (tied or not: a tied head
 * gets its own q8 copy); the embedding stays as stored (a row gather), and so do the MoE
 * router (as llama.cpp keeps ffn_gate_inp unquantised) and every norm / bias vector. q8 gives
 * other logits than bf16 (measured on the goldens: tests/reference/q8_golden_test), but keeps
 * the determinism contract below. */
enum reference_weights_dtype { REFERENCE_WEIGHTS_STORED = 0, REFERENCE_WEIGHTS_Q8 = 1 };

/* "bf16" (as stored; the default) or "q8" -> *out; STRATA_EINVAL naming the choices. */
int reference_weights_dtype_parse(enum reference_weights_dtype *out, const char *name);
const char *reference_weights_dtype_name(enum reference_weights_dtype dtype); /* "bf16", "q8" */

struct reference_load_options {
    int layer_start; /* first owned decoder layer */
    int layer_end;   /* one past the last owned layer; layer_start < layer_end <= L,
                        or layer_start == layer_end == 0 for a head/embed-only model */
    int with_embed;  /* own embed_tokens (first stage) */
    int with_head;   /* own final norm + lm_head (last stage) */
    int num_threads; /* worker threads for matmuls (>= 1) */
    /* NULL or tp == 1: the whole model. Else this rank's shard: only its slice of each
     * tensor is read from the checkpoint; q/k/v, gate/up (and expert) rows, o/down (and
     * expert down) columns, whole experts or expert columns per the shard's MoE mode, and
     * the vocabulary rows of the embedding and LM head. `coll` is then required. */
    const struct tp_shard *tp;
    struct reference_collective coll;
    struct reference_kvp kvp;                   /* KV parallelism (see struct reference_kvp) */
    enum reference_weights_dtype weights_dtype; /* default (0): as stored */
    /* Default (0): the bf16 / f32 matrices the forward pass streams are moved once into
     * huge-page-advised anonymous memory (reference/weight_arena.h: it streams 20-35% faster
     * than the file's page cache here); file pages are dropped and loader copies freed, so
     * the resident set does not grow. 1: they stay where the loader put them (mostly the
     * mmapped file), for A/B benchmarks. */
    int weights_in_file;
    /* fn NULL: no reports. Else called from the loading thread at tensor granularity
     * (runtime/base/progress.h's contract): total = the stored bytes of the tensors this
     * model holds (its TP slices); a tensor counts as done once its bytes have been read:
     * at placement when it is widened, transposed or sliced into a copy (or stays in the
     * file: weights_in_file), else when it is copied into the huge-page arena or quantised
     * (where a mmapped checkpoint is paged in). Phases: "reading tensors", "copying to huge
     * pages", "quantising to q8". */
    struct strata_progress progress;
};

/* KV heads this model's cache must hold (num_kv_heads, or the shard's part under TP), and
 * the positions per slot (the caller's max_seq, or this KVP rank's share of it). */
int reference_model_kv_heads(const struct reference_model *m);
int reference_model_kv_positions(const struct reference_model *m, int max_seq);
/* Of a sequence's first `positions` positions, how many this rank's cache holds (all of
 * them, or under KVP those in its range). */
int reference_model_kv_held(const struct reference_model *m, int positions);
/* The first global position this rank's cache holds (0 without KVP). */
int reference_model_kv_first(const struct reference_model *m);

/* Loads the owned tensors from `st`. Every missing or mis-shaped tensor is listed
 * together in one error message before failing (STRATA_ENOTFOUND / STRATA_EFORMAT). */
int reference_model_load(struct reference_model **out, const struct model_config *cfg,
                         const struct safetensors *st, const struct reference_load_options *opt);
void reference_model_free(struct reference_model *m);

/* Bytes of weights owned (as stored) and bytes of any widened copies made at load. */
size_t reference_model_weight_bytes(const struct reference_model *m);
size_t reference_model_extra_bytes(const struct reference_model *m);
int reference_model_num_tensors(const struct reference_model *m);
/* With REFERENCE_WEIGHTS_Q8: bytes of the q8 copies, and (*replaced) the bytes of the stored
 * matrices they replace (no longer read after load); 0 and 0 otherwise. */
size_t reference_model_q8_bytes(const struct reference_model *m, size_t *replaced);
const struct model_config *reference_model_config(const struct reference_model *m);
/* Bytes of bf16 / f32 matrices moved into the huge-page arena at load (0 with weights_in_file
 * or q8), and (*huge) the bytes of the arena (q8's too) that the kernel backs with transparent
 * huge pages now. */
size_t reference_model_copied_bytes(const struct reference_model *m, size_t *huge);

/* Bytes of activation scratch currently held (grown on demand by forward/logits), and the
 * number of matmul threads. */
size_t reference_model_scratch_bytes(const struct reference_model *m);
int reference_model_num_threads(const struct reference_model *m);
/* No forward for a while (thread_pool_park): the matmul threads sleep instead of spinning. */
void reference_model_park_threads(struct reference_model *m);

/* hidden [n, H] = embed_tokens[tokens[i]]; error on token id outside [0, V) (checked before
 * any collective, so every TP rank refuses alike). Under TP the rank owning a token's row
 * writes it, the others zeros, and an all-reduce sums them: x + 0 = x, so the rows equal
 * TP = 1's (up to the sign of a zero). */
int reference_embed(const struct reference_model *m, float *hidden, const int32_t *tokens, int n);

/* struct forward_item (one request's rows of a microbatch): runtime/model/decoder_io.h. */

/* Runs the owned layers over hidden [sum n_tokens, H] in place (rows in item order),
 * appending each item's keys/values to its slot in `kv`. Fails (STRATA_ERANGE) if any item
 * would exceed the slot's capacity or does not continue exactly at the slot's length. */
int reference_forward(struct reference_model *m, struct kv_cache *kv, float *hidden,
                      const struct forward_item *items, int n_items);

/* logits [n, V] = lm_head(RMSNorm_final(hidden [n, H])); requires with_head.
 * Under TP every rank computes its vocabulary rows and an all-gather assembles [n, V] on
 * every rank; each logit is one whole dot product, so they equal TP = 1's bit for bit. */
int reference_logits(struct reference_model *m, float *logits, const float *hidden, int n);

/* ids [n] = the greedy ids of the same logits, argmax() of each row exactly (sampler.h), without
 * assembling them: under TP each rank reduces its vocabulary rows to (largest value, lowest
 * id) per row and only those pairs are all-gathered (allgather of 2 floats per row; every rank
 * gets the same ids). For greedy requests whose logits are not kept (model_head.c). */
int reference_logits_argmax(struct reference_model *m, int32_t *ids, const float *hidden, int n);

#endif
