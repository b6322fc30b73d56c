/* One decoder layer, written once: the math of a Qwen3 / Qwen3-MoE / Qwen3-VL text layer
 * (spec §3-§5) read top to bottom, against the operations a backend provides. The CPU's
 * table is reference/ops run on the host (reference/model.c), a device's is its kernels
 * enqueued on its stream (runtime/stage/backend_cuda.c); the buffers are wherever that
 * backend keeps them, and this file never touches their contents. So a new capability of
 * the layer (a KV dtype, speculative verification) is written here once, and the op
 * harness (tests/backend_ops) holds each table to the CPU's bits.
 *
 * Every op returns 0 or a negative STRATA_E* status with the message set; the first
 * failure ends the layer. */
#ifndef STRATA_REFERENCE_FORWARD_H
#define STRATA_REFERENCE_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "reference/layer_weights.h"
#include "reference/ops.h"
#include "runtime/model/decoder_io.h"

/* An expert's matrices, for matmul_grouped. */
enum forward_expert_matrix { FORWARD_EXPERT_GATE, FORWARD_EXPERT_UP, FORWARD_EXPERT_DOWN };

/* A backend's table (a constant); `ctx`, its state for one pass, comes with each call. */
struct forward_ops {
    /* out [rows, dim] = RMSNorm(x) * w (out may be x). */
    int (*rmsnorm)(void *ctx, float *out, const float *x, const float *w, float eps, int rows,
                   int dim);
    /* outs[j] [rows, w[j] rows] = x [rows, in] @ w[j]^T for the j < count projections that
     * share their input (each exactly as one matmul). */
    int (*matmul_multi)(void *ctx, float *const *outs, const struct ops_weight *const *ws,
                        int count, const float *x, int rows);
    /* out = x @ w^T summed by the backend's fixed leaf split (ops.h matmul_split): the
     * row-parallel projections whose TP partials the reduce adds. */
    int (*matmul_split)(void *ctx, float *out, const float *x, const struct ops_weight *w,
                        int rows);
    /* x [rows, dim] += bias per row; bias NULL: nothing. */
    int (*add_bias)(void *ctx, float *x, const float *bias, int rows, int dim);
    /* q [rows, heads D] and k [rows, kv_heads D] per head RMSNorm'd by q_norm / k_norm, then
     * RoPE'd with row i's cos / sin tables (D / 2 each, rows of the tables in row order):
     * reference/ops.h qk_norm_rope. */
    int (*qk_norm_rope)(void *ctx, float *q, float *k, const float *q_norm, const float *k_norm,
                        float eps, const float *cos_t, const float *sin_t, int rows, int heads,
                        int kv_heads, int head_dim);
    /* Appends every item's keys and values (buffers k, v; rows in item order) to its
     * slot's cache of layer L (under KVP: the positions this rank holds). */
    int (*kv_store)(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                    int n_items, int rows);
    /* out [n, heads D] = attention of the item's rows q [n, heads D] over its slot's cache
     * (reference/ops.h attention; n = item->n_tokens). */
    int (*attention)(void *ctx, const struct layer_weights *L, const struct forward_item *item,
                     float *out, const float *q);
    /* KVP (reference/ops.h attention_partial_max / attention_partial): rows [first, first + n)
     * of the item, q [n, heads D] at positions item->pos + first..; scores [n, heads, held]
     * kept between the steps; max [n, heads]; part [n, heads, D + 2]. */
    int (*attention_partial_max)(void *ctx, const struct layer_weights *L,
                                 const struct forward_item *item, int first, int n, float *max,
                                 float *scores, const float *q);
    int (*attention_partial)(void *ctx, const struct layer_weights *L,
                             const struct forward_item *item, int first, int n, float *part,
                             const float *scores, const float *max);
    /* all [kvp][n] <- every KVP rank's mine [n], in rank order. */
    int (*kvp_allgather)(void *ctx, float *all, const float *mine, size_t n);
    /* reference/ops.h attention_group_max and attention_merge over the KVP ranks. */
    int (*attention_group_max)(void *ctx, float *max, const float *all, size_t n);
    int (*attention_merge)(void *ctx, float *out, const float *parts, int rows);
    /* TP: adds the ranks' partials of x [n] (a no-op without TP). */
    int (*tp_reduce)(void *ctx, float *x, size_t n);
    /* x [n] += y [n]. */
    int (*vec_add)(void *ctx, float *x, const float *y, int n);
    /* h [rows, dim] += y, then out = RMSNorm(h) * w (reference/ops.h add_rmsnorm). */
    int (*add_rmsnorm)(void *ctx, float *out, float *h, const float *y, const float *w, float eps,
                       int rows, int dim);
    /* out [n] = silu(gate) * up. */
    int (*swiglu)(void *ctx, float *out, const float *gate, const float *up, int n);
    /* The MoE block's ops (reference/ops.h has each one's contract): moe_route_rows of
     * rows rows (dims' experts, top-k and renormalisation), moe_group over the held
     * experts, ops_weight_rows of an f32 [*, dim] matrix, matmul_grouped of the layer's
     * experts' gate / up / down (down: matmul_split with the leaves this rank's expert
     * columns have), moe_expert_sum over the held experts. */
    int (*moe_route)(void *ctx, int *experts, float *weights, const float *router_logits, int rows);
    int (*moe_group)(void *ctx, int32_t *offsets, int32_t *grouped_rows, int32_t *slot_pos,
                     const int *experts, int rows);
    int (*gather_rows)(void *ctx, float *out, const float *x, const int32_t *rows, int n, int dim);
    int (*matmul_grouped)(void *ctx, float *out, const float *x, const struct layer_weights *L,
                          enum forward_expert_matrix which, const int32_t *offsets, int cap);
    int (*moe_expert_sum)(void *ctx, float *out, float *y, const int32_t *slot_pos,
                          const int *experts, const float *weights, int rows);
    /* DeepStack (spec §5.4): after layer k, adds each item's feature k on its visual rows
     * of buffers hidden. */
    int (*deepstack)(void *ctx, const struct layer_weights *L, const struct forward_item *items,
                     int n_items);
};

/* The activations of one forward pass, [rows, ...] each, in the backend's memory. */
struct forward_buffers {
    float *hidden;                    /* [rows, H], in and out */
    float *norm;                      /* [rows, H] */
    float *q, *k, *v, *attn;          /* [rows, nh D], [rows, nkv D] x 2, [rows, nh D] */
    float *proj;                      /* [rows, H] */
    float *ffn_gate, *ffn_up;         /* [rows, F] */
    const float *rope_cos, *rope_sin; /* [rows, D / 2] */
    /* MoE layers, for moe_chunk rows (K = top-k): router [rows, E], moe_expert / moe_w
     * [rows K] each slot's expert and weight, moe_row / moe_slot [rows K] moe_group's rows
     * and slot positions, moe_offsets [E + 1], moe_x [rows K, H] the grouped inputs, then
     * the experts' outputs; ffn_gate / ffn_up hold [rows K, I]. */
    float *router, *moe_w, *moe_x;
    int *moe_expert;
    int32_t *moe_row, *moe_slot, *moe_offsets;
    /* KVP, for a tile of kvp_tile rows: kvp_scores [tile, heads, kvp_held], kvp_max
     * [tile, heads] and kvp_max_all [kvp][tile, heads], kvp_mine [tile, heads, D + 2] and
     * kvp_parts [kvp][tile, heads, D + 2]. */
    float *kvp_scores, *kvp_max, *kvp_max_all, *kvp_mine, *kvp_parts;
};

/* The layer's shapes on this rank (heads and the MLP's columns are TP shards). */
struct forward_dims {
    int hidden, head_dim, heads, kv_heads, ffn;
    float eps;
    /* MoE: top-k, each held expert's columns, whether those are a TP column split (--moe
     * split) and the most rows one pass of the block takes (a backend's launch limit; 0:
     * any). The experts held and the routing's settings are the ops' (their context). */
    int top_k, moe_ffn, moe_split, moe_chunk;
    /* KV parallelism: ranks (1: none), the positions this rank holds and the most rows one
     * tile of the two-step attention takes (the same on every rank, so every rank makes the
     * same collective calls). */
    int kvp, kvp_held, kvp_tile;
};

/* The buffers of a backend's context `s` whose scratch fields carry these names, with the
 * hidden rows `h` (both backends' contexts do: one spelling of the mapping); the KVP
 * buffers, which only a KVP split has, are set apart. */
#define FORWARD_BUFFERS(s, h)                                                                      \
    ((struct forward_buffers){.hidden = (h),                                                       \
                              .norm = (s)->norm,                                                   \
                              .q = (s)->q,                                                         \
                              .k = (s)->k,                                                         \
                              .v = (s)->v,                                                         \
                              .attn = (s)->attn,                                                   \
                              .proj = (s)->proj,                                                   \
                              .ffn_gate = (s)->ffn_gate,                                           \
                              .ffn_up = (s)->ffn_up,                                               \
                              .rope_cos = (s)->rope_cos,                                           \
                              .rope_sin = (s)->rope_sin,                                           \
                              .router = (s)->router,                                               \
                              .moe_w = (s)->moe_w,                                                 \
                              .moe_x = (s)->moe_x,                                                 \
                              .moe_expert = (s)->moe_expert,                                       \
                              .moe_row = (s)->moe_row,                                             \
                              .moe_slot = (s)->moe_slot,                                           \
                              .moe_offsets = (s)->moe_offsets})

/* One decoder layer over buffers->hidden [rows, H] in place; ctx goes to every op. */
int forward_layer(const struct forward_ops *ops, void *ctx, const struct forward_dims *d,
                  const struct forward_buffers *b, const struct layer_weights *L,
                  const struct forward_item *items, int n_items, int rows);

#endif
