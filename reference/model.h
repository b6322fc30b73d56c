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
#include "runtime/model/decoder_io.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

struct reference_model; /* opaque */

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
    enum reference_weights_dtype weights_dtype; /* default (0): as stored */
};

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

/* Bytes of activation scratch currently held (grown on demand by forward/logits), and the
 * number of matmul threads. */
size_t reference_model_scratch_bytes(const struct reference_model *m);
int reference_model_num_threads(const struct reference_model *m);

/* hidden [n, H] = embed_tokens[tokens[i]]; error on token id outside [0, V). */
int reference_embed(const struct reference_model *m, float *hidden, const int32_t *tokens, int n);

/* struct forward_item (one request's rows of a microbatch): runtime/model/decoder_io.h. */

/* Runs the owned layers over hidden [sum n_tokens, H] in place (rows in item order),
 * appending each item's keys/values to its slot in `kv`. Fails (STRATA_ERANGE) if any item
 * would exceed the slot's capacity or does not continue exactly at the slot's length. */
int reference_forward(struct reference_model *m, struct kv_cache *kv, float *hidden,
                      const struct forward_item *items, int n_items);

/* logits [n, V] = lm_head(RMSNorm_final(hidden [n, H])); requires with_head. */
int reference_logits(struct reference_model *m, float *logits, const float *hidden, int n);

#endif
