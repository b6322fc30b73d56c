/* The PP × KVP × TP process grid (seed 004's ParallelConfig, Vajra; KV parallelism after
 * Medha) and the one place that says which slice of every weight and which KV tokens each
 * rank holds. strata-plan prints it; the loaders slice tensors with tp_tensor_slice.
 *
 * Grid order (seed 004, "PP × KVP × TP"): TP is the fastest-varying coordinate, so the ranks
 * of one TP group are adjacent (global = (stage · kvp + kvp_rank) · tp + tp_rank).
 *
 * Tensor parallelism (Megatron-LM):
 *   - q/k/v (and their biases) column-parallel by head: rank t owns query heads
 *     [t·nh/T, (t+1)·nh/T). KV heads are split the same way when nkv >= T; when nkv < T each
 *     KV head is replicated on T/nkv consecutive ranks (rank t holds KV head t / (T/nkv)), so
 *     a rank's query heads always fall inside the GQA group of the KV heads it holds.
 *   - o_proj row-parallel (its input columns = the owned query heads); its bias and every
 *     norm (q/k norms are per head and stay local) are replicated.
 *   - gate/up column-parallel and down row-parallel over the intermediate size F.
 *   - MoE: TP_MOE_EXPERT_PARALLEL gives rank t the experts [t·E/T, (t+1)·E/T) whole;
 *     TP_MOE_SPLIT splits every expert's intermediate size I as a dense MLP. The router is
 *     replicated.
 *   - embedding and lm_head vocab-parallel: rank t owns rows [t·V/T, (t+1)·V/T).
 *   - the vision tower is not split: every TP rank of the first stage holds it whole.
 * A degree the model cannot take is refused with the reason (never padded).
 *
 * KV parallelism: KVP rank k holds the tokens [k·N, min((k+1)·N, max_seq)) of every sequence,
 * N = kvp_tokens (seed 004's max_num_tokens_per_kvp_group); the groups together must hold
 * max_seq tokens and each must hold at least one.
 *
 * No bit changes: the sums TP and KVP cut into per-rank parts are fixed trees on
 * one rank too (reference/ops.h), and a rank's part must be one subtree of them:
 *   - TP degrees are powers of two dividing GRID_SPLIT_LEAVES (the leaves of every
 *     row-parallel dot product: o_proj, down, expert down; under --moe expert the experts
 *     are a halving tree and T | E makes each rank's experts one node of it);
 *   - KVP tokens per rank are GRID_KV_BLOCK x a power of two (attention's aligned blocks).
 * Then TP and KVP change no bit of the logits compared with one rank. */
#ifndef STRATA_RUNTIME_MODEL_TP_SHARD_H
#define STRATA_RUNTIME_MODEL_TP_SHARD_H

#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/stage_tensors.h"

#define GRID_MAX_DEGREE 256 /* per dimension */
#define GRID_SPLIT_LEAVES 8 /* = OPS_SPLIT_LEAVES (reference/ops.h): TP degrees divide it */
#define GRID_KV_BLOCK 16    /* = OPS_ATTN_BLOCK: KVP tokens per rank are it x 2^p */

enum tp_moe_mode {
    TP_MOE_EXPERT_PARALLEL = 0, /* experts partitioned over the TP ranks */
    TP_MOE_SPLIT = 1            /* each expert's intermediate size split */
};

/* Seed 004's ParallelConfig. */
struct grid_config {
    int pp;         /* pipeline stages */
    int tp;         /* tensor-parallel degree */
    int kvp;        /* KV-parallel degree */
    int kvp_tokens; /* KV tokens per KVP group (max_num_tokens_per_kvp_group) */
    int world;      /* pp × tp × kvp, filled by grid_config_check */
    enum tp_moe_mode moe;
};

struct grid_coords {
    int stage, kvp_rank, tp_rank;
};

/* [start, end) of some index space. */
struct tp_range {
    int start, end;
};

/* What one TP rank owns of every layer (identical for every layer of the model). */
struct tp_shard {
    int tp, tp_rank;
    struct tp_range q_heads;    /* query heads */
    struct tp_range kv_heads;   /* KV heads held */
    int kv_replicas;            /* ranks holding each of those KV heads (1 = split) */
    struct tp_range ffn;        /* dense intermediate columns of gate/up (= down's inputs) */
    struct tp_range experts;    /* MoE experts held ([0, E) in split mode, empty for dense) */
    struct tp_range expert_ffn; /* columns of each held expert ([0, I) in expert parallel) */
    struct tp_range vocab;      /* embedding / lm_head rows */
};

/* Checks that `cfg` can be split over `tp` ranks in `moe` mode; STRATA_ERANGE naming the
 * reason otherwise: tp not a power of two dividing GRID_SPLIT_LEAVES, or the first shape it
 * does not divide (heads, KV heads, intermediate size, experts or expert intermediate size,
 * vocabulary). */
int tp_check(const struct model_config *cfg, int tp, enum tp_moe_mode moe);

/* Fills the shard of TP rank `tp_rank` (checks like tp_check first). */
int tp_shard_init(struct tp_shard *shard, const struct model_config *cfg, int tp, int tp_rank,
                  enum tp_moe_mode moe);

/* 1 if `tokens` (KV positions per KVP rank) is GRID_KV_BLOCK x a power of two. */
int kvp_tokens_aligned(int tokens);

/* Checks the degrees, fills grid->world and, when grid->kvp_tokens is 0, sets it to
 * ceil(max_seq / kvp) rounded up to GRID_KV_BLOCK x a power of two when kvp > 1 (max_seq
 * when kvp == 1). Refuses: any degree < 1 or > GRID_MAX_DEGREE, pp > layers, a TP degree
 * tp_check refuses, with kvp > 1 kvp_tokens that kvp_tokens_aligned refuses, kvp_tokens ×
 * kvp < max_seq, and a KVP group left without tokens. */
int grid_config_check(struct grid_config *grid, const struct model_config *cfg, int max_seq);

/* Global rank <-> coordinates (grid order above). */
int grid_rank(const struct grid_config *grid, const struct grid_coords *c);
void grid_coords_of(struct grid_coords *c, const struct grid_config *grid, int rank);

/* KV token range of KVP rank `kvp_rank` for sequences of at most max_seq tokens. */
struct tp_range kvp_token_range(const struct grid_config *grid, int kvp_rank, int max_seq);

/* How a rank's part of one tensor sits in the stored tensor. */
enum tp_slice_kind {
    TP_SLICE_REPLICATED = 0, /* the whole tensor */
    TP_SLICE_SPLIT = 1,      /* `parts` runs of `count` indices along `dim` */
    TP_SLICE_ABSENT = 2      /* none of it (an expert another rank owns) */
};

/* For SPLIT: indices [start + p·part_stride, start + p·part_stride + count) along `dim`,
 * p < parts (2 for the fused gate_up tensor, whose gate and up halves are each split). */
struct tp_slice {
    enum tp_slice_kind kind;
    int dim;
    int64_t extent; /* the stored tensor's size along `dim` */
    int64_t start, count;
    int parts;
    int64_t part_stride;
};

/* The slice of tensor `t` (from stage_tensor_list_build) rank `shard` loads, for the tensor
 * stored in `layout` (t->layout, or stage_tensor_stored_layout() for a swapped fused one). */
int tp_tensor_slice(struct tp_slice *out, const struct tp_shard *shard,
                    const struct stage_tensor *t, enum stage_tensor_layout layout);

/* Bytes of a rank's slice of a tensor whose whole stored size is `full_bytes`. */
uint64_t tp_slice_bytes(const struct tp_slice *slice, uint64_t full_bytes);

#endif
