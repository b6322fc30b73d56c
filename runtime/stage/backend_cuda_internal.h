/* Private to the CUDA stage backend (backend_cuda.c: forward, graphs, head, open;
 * backend_cuda_kv.c: the paged KV pool, its block tables, pack and restore;
 * backend_cuda_weights.c: the weight upload). Not for other modules: use
 * runtime/stage/backend.h. */
#ifndef STRATA_RUNTIME_STAGE_BACKEND_CUDA_INTERNAL_H
#define STRATA_RUNTIME_STAGE_BACKEND_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "reference/forward.h"
#include "reference/kv_blocks.h"
#include "reference/layer_weights.h"
#include "reference/ops.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"
#include "runtime/stage/backend.h"

/* Attention scratch (scores and split-K partials, kernels/attention.h): at least this many
 * floats (queries are chunked to fit them), and always room for one query at max_seq. */
#define ATTN_SCRATCH_FLOATS ((size_t)1 << 24)
/* Gathers and combines launch one grid row per token: at most this many per launch. */
#define MAX_GRID_ROWS 65535
/* Most experts per token (the MoE sum's per-row list: reference/ops.h moe_sum_rows). */
#define MOE_MAX_TOP_K OPS_MOE_MAX_TOP_K
/* Most experts per MoE layer (cuda_matmul_grouped stages one offset per expert in shared
 * memory: kernels/matmul.h). */
#define MOE_MAX_EXPERTS 4096

struct cuda_grid; /* TP / KVP state (backend_cuda_tp.c) */

/* A MoE layer's experts for the grouped matmuls (backend_cuda_moe.c): per weight, the held
 * experts' common dtype and shape (data NULL) and a device array [num_experts] of their
 * device pointers (NULL for another TP rank's experts). */
struct cuda_moe_layer {
    struct ops_weight gate, up, down;
    const void *const *gate_ptrs, *const *up_ptrs, *const *down_ptrs;
};

struct cuda_context {
    int device;
    char device_name[160];
    const struct model_config *cfg;
    struct stage_role role;

    /* This rank's part of every layer (tp_shard.h; the whole model without TP): query and
     * KV heads, dense MLP columns, embedding / lm_head rows [vocab_start, + vocab_n), the
     * leaves of its row-parallel dot products (matmul_split), and under KVP the global
     * positions [kvp_lo, kvp_lo + kvp_held) its cache holds. */
    int tp, tp_rank, nh, nkv, ffn, leaves, vocab_start, vocab_n;
    int experts_lo, experts_hi; /* MoE experts held: one node of the expert tree */
    int kvp, kvp_rank, kvp_lo, kvp_held;
    struct tp_shard shard;  /* valid when tp > 1 */
    struct cuda_grid *grid; /* NULL without TP / KVP */

    /* Weights (device). */
    struct ops_weight embed, lm_head;
    const float *final_norm;
    struct layer_weights *layers;
    int n_layers;
    float *inv_freq; /* host [D/2] */
    void **owned;    /* device allocations */
    int n_owned, cap_owned;
    size_t weight_bytes, device_weight_bytes;
    int num_tensors;

    /* KV cache: a pool of blocks on the device, K and V each
     * [num_blocks][layers][kv_heads][KV_BLOCK][head_dim] (reference/kv_cache.h's layout;
     * under KVP one spare block more: backend_cuda_kv.c), the bookkeeping on the host
     * (reference/kv_blocks.h: slots, lengths, block tables, reservations; under KVP a slot
     * holds this rank's positions, kvp_held at most, while kv.len stays global), and each
     * slot's table mirrored on the device for the kernels, [num_slots][slot_blocks] int32
     * (a slot's row never moves, so a decode graph's pointers stay valid; entries
     * [0, tables_sent[slot]) are current there). */
    void *k_cache, *v_cache; /* kv_dtype elements */
    enum ops_dtype kv_dtype; /* OPS_F32, OPS_BF16 or OPS_F16 (--kv-dtype) */
    struct kv_blocks kv;
    int32_t *tables;    /* device */
    int32_t *h_tables;  /* pinned staging of the uploads, same shape */
    int *tables_sent;   /* [num_slots] */
    size_t block_elems; /* K (or V) elements of one block: layers x kv_heads x KV_BLOCK x D */
    size_t score_floats;

    /* Every launch and copy of this backend goes to `stream` (a cudaStream_t); a call
     * synchronises it once, at its end (MoE layers included: they route on the device). */
    void *stream;
    /* MoE roles only: [n_layers] (MoE layers' entries filled) and the device pointer
     * tables they point into (backend_cuda_moe_open). */
    struct cuda_moe_layer *moe;
    const void **moe_ptrs;

    /* Device scratch for `cap_rows` rows. */
    int cap_rows, cap_logit_rows;
    float *hidden, *norm, *proj, *q, *k, *v, *attn, *ffn_gate, *ffn_up, *rope_cos, *rope_sin;
    float *router, *moe_x, *moe_w, *scores, *logits, *deepstack;
    int32_t *moe_row, *tokens, *ids;
    /* MoE (backend_cuda_moe.c): moe_expert / moe_w [cap_rows * top_k] each slot's routed
     * expert and weight, moe_row [cap_rows * top_k] each grouped position's token row,
     * moe_slot [cap_rows * top_k] each slot's grouped position (-1: not held), moe_offsets
     * [num_experts + 1] each expert's grouped rows. (moe_row / moe_w also carry a TP
     * rank's embedding rows: backend_cuda_tp.c.) */
    int *moe_expert;
    int32_t *moe_slot, *moe_offsets;
    int64_t *row_dst; /* [cap_rows] each row's KV offset (cuda_kv_store_rows) */
    /* Pinned host staging (cuda_host_alloc): everything copied asynchronously. */
    float *h_hidden;                /* [cap_rows, H] rows in and out */
    float *h_logits;                /* [cap_logit_rows, V] */
    int32_t *h_tokens;              /* [cap_rows] ids in (embed), argmax ids out */
    float *h_cos, *h_sin, *h_moe_w; /* h_moe_w, h_moe_row: a TP rank's embedding rows */
    int32_t *h_moe_row;
    int64_t *h_row_dst;

    /* Decode graphs (kernels/cuda_device.h): exec[b] is the graph of a decode step of b
     * one-token items, captured again each step and updated in place; warm[b] says a step
     * of b items has run eagerly once (every kernel loaded before any capture). */
    int use_graphs; /* 0 with STRATA_CUDA_GRAPHS=0 or under a TP / KVP split */
    void **graph_exec;
    unsigned char *graph_warm;
    long graph_launches, graph_instantiations;
};

static inline struct cuda_context *ctx(const struct stage_backend *be) {
    return be->context;
}

/* The view of one slot's keys and values in one absolute layer (reference/kv_cache.h
 * kv_cache_view's, on the device: the kernels read it, the table being the slot's device
 * row). */
static inline struct ops_kv kv_view(const struct cuda_context *c, int slot, int layer) {
    const size_t head = (size_t)KV_BLOCK * (size_t)c->cfg->head_dim;
    const size_t at = (size_t)(layer - c->role.layer_start) * (size_t)c->nkv * head;
    const size_t bytes = at * ops_kv_elem_bytes(c->kv_dtype);
    return (struct ops_kv){.k = (char *)c->k_cache + bytes,
                           .v = (char *)c->v_cache + bytes,
                           .blocks = c->tables + (size_t)slot * (size_t)c->kv.slot_blocks,
                           .block_stride = c->block_elems,
                           .head_stride = head,
                           .dtype = c->kv_dtype};
}

/* The KV pool (backend_cuda_kv.c). _open sizes it from the options' budget (after the
 * weights and the scratch are on the device) and allocates it and the tables; _close frees
 * them (a half-built state too). */
int backend_cuda_kv_open(struct cuda_context *c, const struct stage_backend_options *opt);
void backend_cuda_kv_close(struct cuda_context *c);
/* Of a sequence's first `positions` positions, how many this rank's cache holds (all of them,
 * or under KVP those in [kvp_lo, kvp_lo + kvp_held)). */
int backend_cuda_kv_held(const struct cuda_context *c, int positions);
/* Before a forward over items [n_items]: each item's slot grown to the positions this rank
 * holds after it (kv_blocks_grow: a request that reserved them cannot fail here), and the
 * table entries that changed queued for upload on c->stream (outside any graph capture: a
 * decode graph reads the tables where they always are). */
int backend_cuda_kv_prepare(struct cuda_context *c, const struct forward_item *items, int n_items);
/* The offset in elements from a layer's base (kv_view's k) of position `local` of slot's kv head
 * 0, by the host's table; KVP rows of another rank's positions (local outside [0, kvp_held))
 * go to the spare block (written, never read). */
int64_t backend_cuda_kv_row_offset(const struct cuda_context *c, int slot, int local);

/* The KV entries of the backend table (backend_cuda_kv.c). */
int backend_cuda_kv_acquire(struct stage_backend *be, int *slot);
int backend_cuda_kv_reserve(struct stage_backend *be, int slot, int positions);
void backend_cuda_kv_release(struct stage_backend *be, int slot);
size_t backend_cuda_kv_bytes(const struct stage_backend *be);
void backend_cuda_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out);
int backend_cuda_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                           int *cached);
int backend_cuda_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n);
void backend_cuda_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n);
void backend_cuda_kv_forget(struct stage_backend *be);
int backend_cuda_kv_truncate(struct stage_backend *be, int slot, int positions);
int backend_cuda_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n);
int backend_cuda_kv_restore(struct stage_backend *be, const int *slots, int n,
                            const struct kv_handoff *in);

/* TP / KVP (backend_cuda_tp.c). grid_open fills this rank's part (the whole model without
 * a split) and, when opt->tp splits the stage, opens the NCCL sub-groups on c->stream; every
 * rank of the stage's group calls it at the same point. */
int backend_cuda_grid_open(struct cuda_context *c, const struct stage_backend_options *opt);
void backend_cuda_grid_close(struct cuda_context *c);
/* Device scratch of the collectives for `rows` rows (called by ensure_scratch, between
 * calls) and for the head's gathered logits of `rows` rows. */
int backend_cuda_grid_scratch(struct cuda_context *c, int rows);
int backend_cuda_grid_logit_scratch(struct cuda_context *c, int rows);
/* Waits for everything queued on c->stream: nccl_group_wait (bounded by the group's timeout,
 * so a dead peer fails the call instead of hanging it) under a split, else the stream's
 * synchronisation. */
int backend_cuda_sync(struct cuda_context *c);
/* x [n] <- the TP group's sum of its ranks' partials in tp_reduce's order (no-op at TP 1). */
int backend_cuda_tp_reduce(struct cuda_context *c, float *x, size_t n);
/* c->hidden [k, H] <- the embedding rows of tokens [k] (host), vocab-parallel: this rank's
 * rows, zeros for the others', all-reduced (exact). Queued; k <= cap_rows. */
int backend_cuda_tp_embed(struct cuda_context *c, const int32_t *tokens, int k);
/* c->logits [n, V] <- lm_head(c->norm [n, H]) vocab-parallel: this rank's [n, V/T] logits,
 * all-gathered, reordered on the device. Queued. */
int backend_cuda_tp_head(struct cuda_context *c, int n);
/* ids [n] (host) <- argmax() of each whole row of the logits, vocab-parallel: this rank's
 * logits `local` [n, V/T] (device) reduced to one (value, id) pair per row, the pairs
 * all-gathered and merged in rank order (reference/sampler.h argmax_part / argmax_merge).
 * Synchronises the stream; n <= cap_logit_rows. */
int backend_cuda_tp_argmax(struct cuda_context *c, int32_t *ids, const float *local, int n);
/* KVP (backend_cuda_tp.c): the rows of one tile of the two-step attention (0 without
 * KVP), the tile's device buffers set into b, and the KVP ops of the CUDA table
 * (reference/forward.h), queued. */
int backend_cuda_kvp_tile(const struct cuda_context *c);
void backend_cuda_kvp_buffers(const struct cuda_context *c, struct forward_buffers *b);
int backend_cuda_op_attention_partial_max(void *ctx, const struct layer_weights *L,
                                          const struct forward_item *item, int first, int n,
                                          float *max, float *scores, const float *q);
int backend_cuda_op_attention_partial(void *ctx, const struct layer_weights *L,
                                      const struct forward_item *item, int first, int n,
                                      float *part, const float *scores, const float *max);
int backend_cuda_op_kvp_allgather(void *ctx, float *all, const float *mine, size_t n);
int backend_cuda_op_attention_group_max(void *ctx, float *max, const float *all, size_t n);
int backend_cuda_op_attention_merge(void *ctx, float *out, const float *parts, int rows);

/* The MoE ops of the CUDA table (reference/forward.h; backend_cuda_moe.c), queued with no
 * synchronisation (a decode graph holds them), and the most rows one pass of the block takes. */
int backend_cuda_moe_chunk(const struct cuda_context *c);
int backend_cuda_op_moe_route(void *ctx, int *experts, float *weights, const float *router_logits,
                              int rows);
int backend_cuda_op_moe_group(void *ctx, int32_t *offsets, int32_t *grouped_rows, int32_t *slot_pos,
                              const int *experts, int rows);
int backend_cuda_op_gather_rows(void *ctx, float *out, const float *x, const int32_t *rows, int n,
                                int dim);
int backend_cuda_op_matmul_grouped(void *ctx, float *out, const float *x,
                                   const struct layer_weights *L, enum forward_expert_matrix which,
                                   const int32_t *offsets, int cap);
int backend_cuda_op_moe_expert_sum(void *ctx, float *out, float *y, const int32_t *slot_pos,
                                   const int *experts, const float *weights, int rows);
/* After the weights are loaded: each MoE layer's grouped-matmul tables (c->moe, device
 * pointer arrays). _close frees them (a half-built state too). */
int backend_cuda_moe_open(struct cuda_context *c);
void backend_cuda_moe_close(struct cuda_context *c);

/* Uploads the role's weights (the manifest's tensors) into `c` (backend_cuda_weights.c),
 * reporting each tensor's stored bytes (this rank's slice) to `progress` once uploaded. */
int backend_cuda_load_weights(struct cuda_context *c, const struct safetensors *st,
                              const struct strata_progress *progress);

#endif
