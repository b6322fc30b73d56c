/* Private layout of struct reference_model, shared by model.c (forward pass) and
 * model_load.c (tensor loading). Not part of the contract in model.h. */
#ifndef STRATA_REFERENCE_MODEL_INTERNAL_H
#define STRATA_REFERENCE_MODEL_INTERNAL_H

#include "reference/layer_weights.h"
#include "reference/model.h"
#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "reference/weight_arena.h"

struct reference_model {
    struct model_config cfg;
    struct reference_load_options opt;
    struct thread_pool *pool;

    /* This rank's part of every layer (the whole model when tp == 1; tp_shard.h). */
    struct tp_shard shard;
    int tp;                     /* TP degree (1 = not split) */
    int nh, nkv;                /* query / KV heads held */
    int ffn;                    /* dense MLP columns held */
    int moe_ffn;                /* columns of each held expert */
    int vocab_start;            /* first embedding / lm_head row held */
    int vocab_n;                /* rows held */
    int leaves;                 /* matmul_split leaves of this rank's row-parallel columns */
    int experts_lo, experts_hi; /* MoE experts held: one node of the MoE sum's expert tree */
    int moe_split;              /* TP --moe split: each expert's columns are split */
    /* KV parallelism: this rank holds global positions [kvp_lo, kvp_lo + kvp_held). */
    int kvp, kvp_lo, kvp_held;

    struct ops_weight embed;   /* [V, H] when with_embed */
    struct ops_weight lm_head; /* [V, H] when with_head (may be the embedding) */
    int head_is_embed;
    const float *final_norm;      /* [H] when with_head */
    struct layer_weights *layers; /* [n_layers], absolute index layer_start + i */
    int n_layers;
    float *inv_freq; /* [D/2] */

    void **owned; /* heap copies made at load (f32 widenings, transposed experts) */
    int n_owned, cap_owned;
    size_t weight_bytes, extra_bytes;
    size_t q8_bytes, q8_replaced_bytes; /* REFERENCE_WEIGHTS_Q8: copies, stored bytes replaced */
    struct weight_arena arena; /* the streamed matrices' copies (bf16/f32 or q8), model_memory.c */
    size_t copied_bytes;       /* bf16/f32 matrix bytes moved into the arena */
    int num_tensors;
    uint64_t progress_done, progress_total; /* opt.progress's counts (model_load.c) */

    /* Activation scratch, grown on demand (rows = tokens in one forward call). */
    int cap_rows, cap_ctx;
    size_t scratch_bytes;
    float *norm;     /* [rows, H] */
    float *proj;     /* [rows, H] */
    float *q;        /* [rows, nh*D] */
    float *k, *v;    /* [rows, nkv*D] */
    float *attn;     /* [rows, nh*D] */
    float *ffn_gate; /* [rows, max(F, I)] */
    float *ffn_up;   /* [rows, max(F, I)] */
    float *rope_cos; /* [rows, D/2] */
    float *rope_sin; /* [rows, D/2] */
    float *scores;   /* attention(): [threads][attention_scratch_floats(ctx, ...)] */
    /* MoE (reference/forward.h's buffers): */
    float *router;        /* [rows, E] */
    int *moe_expert;      /* [rows, top_k] each slot's routed expert */
    float *moe_w;         /* [rows, top_k] and weight */
    float *moe_x;         /* [rows, top_k, H] grouped inputs, then the experts' outputs */
    int32_t *moe_row;     /* [rows, top_k] each grouped position's token row */
    int32_t *moe_slot;    /* [rows, top_k] each slot's grouped position (-1: not held) */
    int32_t *moe_offsets; /* [E + 1] each expert's grouped rows */
    float *tp_part;       /* TP: [tp, n] an all-gather of partials (tp_reduce, --moe split) */
    size_t cap_tp_part;
    float *logit_part; /* TP: [rows, vocab_n] this rank's logits, then [tp, rows, vocab_n] */
    size_t cap_logit_part;
    /* KVP, for a tile of cap_kvp_rows rows (reference/forward.h's buffers; kvp_parts is the
     * allocation the next three point into): */
    float *kvp_parts;   /* [kvp][rows][nh][D + 2] gathered partials */
    float *kvp_mine;    /* [rows][nh][D + 2] this rank's */
    float *kvp_max_all; /* [kvp][rows][nh] gathered maxima */
    float *kvp_max;     /* [rows][nh] this rank's, then the group's */
    float *kvp_scores;  /* [rows][nh][kvp_held] this rank's scores between the steps */
    int cap_kvp_rows;
};

int ref_load_weights(struct reference_model *m, const struct safetensors *st);

/* Adds `bytes` to the load's progress (capped at the total) and reports it to opt.progress;
 * ref_progress_done reports the total once if it was not reached (model_load.c). */
void ref_progress(struct reference_model *m, uint64_t bytes, const char *phase);
void ref_progress_done(struct reference_model *m, const char *phase);

/* Index of `data` in m->owned (a loader copy), or -1 (a view of the checkpoint's mapping). */
int ref_owned_index(const struct reference_model *m, const void *data);

/* REFERENCE_WEIGHTS_Q8: replaces the loaded matrices by q8 copies in m->arena (model_q8.c). */
int ref_quantize_weights(struct reference_model *m);

/* Calls fn on every placed matrix the forward pass streams, in its order: each layer's
 * q, k, v, o, (router when with_router), gate, up, down, experts' gate / up / down, then
 * the LM head (model_memory.c). Stops at the first nonzero return. */
typedef int (*ref_matrix_fn)(struct reference_model *m, struct ops_weight *w, const char *what,
                             int layer, void *ctx);
int ref_for_each_matrix(struct reference_model *m, int with_router, ref_matrix_fn fn, void *ctx);
size_t ref_matrix_bytes(const struct ops_weight *w); /* bf16 / f32 [rows, cols] */

/* Moves every streamed bf16 / f32 matrix into m->arena (huge-page advised anonymous memory),
 * dropping a view's file pages or freeing a loader copy (model_memory.c). */
int ref_copy_weights(struct reference_model *m);

/* A matrix's stored memory is no longer read (it was moved or quantised): a view of the
 * mmapped checkpoint (PROT_READ, MAP_PRIVATE: never written) has its whole pages dropped
 * from this process, so the new copy replaces it in the resident set (a later read, e.g.
 * the embedding's row gather of a tied head, faults them back in); a loader copy is freed
 * unless it is also the embedding's. Returns 1 when it freed a loader copy. */
int ref_release_matrix(struct reference_model *m, const void *data, size_t bytes);

#endif
