/* Shard planning: which contiguous decoder-layer range each pipeline stage owns, and how
 * much memory each stage needs.
 *
 * Four ways to get a plan:
 *   - even split: base = L / S, rem = L % S, stages 0 .. rem-1 take base + 1 layers;
 *   - decode-balanced: the contiguous split that minimises the largest weight bytes a stage
 *     streams per decoded token (its layers, plus the final norm and lm_head on the last
 *     stage; the embedding is only gathered). A decode step reads every weight once, so
 *     these bytes are the stage's time per step, and the slowest stage sets a full
 *     pipeline's pace: with Qwen3-0.6B's 151936-row head (10 layers' worth of bytes) the
 *     even 2-stage split gives stage 1 751 MB a step to stage 0's 441 MB;
 *   - an explicit range (--layer-start / --layer-end) checked by stage_plan_check_range,
 *     and a whole set of ranges checked by stage_plan_check_ranges;
 *   - memory-proportional: given each node's free memory (node s runs stage s), the exact
 *     dynamic program over contiguous splits that minimises the largest fraction
 *     used / free over the stages, failing with a clear message if even the best split
 *     overflows a node.
 *
 * Memory per stage = weights + KV cache + workspace:
 *   weights   = exact stored bytes of the stage's tensors (stage_tensors), including the
 *               embedding (and vision tower of VL models) on the first stage and the final
 *               norm + lm_head on the last (the embedding again when tied, counted once
 *               when the first stage is also the last);
 *   KV        = 2 × layers × kv_heads × head_dim × kv_dtype_bytes × max_seq × batch;
 *   workspace = see stage_plan_workspace_bytes: the activation buffers one forward step
 *               over a chunk of tokens needs, plus the logits on the last stage. */
#ifndef STRATA_RUNTIME_MODEL_STAGE_PLAN_H
#define STRATA_RUNTIME_MODEL_STAGE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"

#define STAGE_PLAN_MAX_STAGES 256

struct stage_range {
    int layer_start; /* first owned layer */
    int layer_end;   /* one past the last owned layer */
};

/* Even split of L layers over S stages (1 <= S <= L, S <= STAGE_PLAN_MAX_STAGES):
 * out[S]. */
int stage_plan_even(struct stage_range *out, int num_layers, int num_stages);

/* One stage's explicit range: non-empty and inside [0, L). */
int stage_plan_check_range(int layer_start, int layer_end, int num_layers);

/* A set of n explicit ranges (any order): each valid, no two overlapping; with
 * `require_cover` they must also cover [0, L) together. The error names the offenders. */
int stage_plan_check_ranges(const struct stage_range *ranges, int n, int num_layers,
                            int require_cover);

/* Everything the planner needs to price a layer range, independent of the split. */
struct stage_memory_model {
    int num_layers;
    uint64_t layer_weight_bytes[MODEL_CONFIG_MAX_LAYERS]; /* [L] */
    uint64_t embed_bytes;                                 /* embed_tokens (first stage) */
    uint64_t vision_bytes;       /* vision tower, on the first stage (0 for text models) */
    uint64_t norm_bytes;         /* final norm (last stage) */
    uint64_t head_bytes;         /* lm_head, or the embedding again when tied */
    int head_is_embed;           /* head_bytes are the embedding: counted once if S == 1 */
    uint64_t kv_bytes_per_layer; /* 2 × nkv × D × kv_dtype_bytes × max_seq × batch */
    uint64_t workspace_bytes;    /* every stage */
    uint64_t logits_bytes;       /* extra workspace on the last stage */
};

/* Bytes per element of a checkpoint's declared torch_dtype (bf16 when unknown). */
size_t stage_plan_dtype_bytes(const char *torch_dtype);

/* Rows per prefill chunk when a stage is not told (strata-stage --chunk-size). */
#define STAGE_PLAN_DEFAULT_CHUNK 64

/* Rows per prefill chunk of a prompt of prompt_len tokens on S stages with chunk_size the cap
 * (<= 0: STAGE_PLAN_DEFAULT_CHUNK): the prompt is cut into at least S chunks (when it has S
 * rows), so that its prefill streams through the stages one chunk behind the other: stage r
 * starts after r chunks rather than r whole prompts. Stage 0 cuts prompts so, and the
 * performance model prices them so. */
static inline int stage_plan_prefill_chunk(int prompt_len, int num_stages, int chunk_size) {
    const int cap = chunk_size > 0 ? chunk_size : STAGE_PLAN_DEFAULT_CHUNK;
    int chunk = num_stages > 0 ? (prompt_len + num_stages - 1) / num_stages : prompt_len;
    if (chunk > cap) chunk = cap;
    return chunk < 1 ? 1 : chunk;
}

struct stage_memory_options {
    size_t kv_dtype_bytes; /* 4 for the fp32 CPU path, 2 for bf16 */
    int max_seq;           /* tokens of KV per sequence */
    int batch;             /* sequences with KV held at once */
    int chunk_tokens;      /* tokens per forward step (prefill chunk × batch) */
    int with_vision;       /* count the vision tower on the first stage (VL models) */
};

/* Workspace of one stage in bytes, fp32 activations over T = chunk_tokens rows:
 *   hidden + residual + normed input   3 × T × H
 *   q, k, v                            T × (nh + 2 nkv) × D
 *   attention output                   T × nh × D
 *   scores for one chunk               nh × T × max_seq
 *   MLP gate + up (dense or k experts) 2 × T × max(F, k × I)
 * all × 4 bytes. The last stage adds T × V × 4 for the logits (*logits_bytes). */
uint64_t stage_plan_workspace_bytes(const struct model_config *cfg,
                                    const struct stage_memory_options *opt, uint64_t *logits_bytes);

/* Prices every tensor of the model: exact stored bytes from `st`, or, with st == NULL,
 * shapes × the checkpoint dtype size (torch_dtype, bf16 when absent). */
int stage_memory_model_build(struct stage_memory_model *mm, const struct model_config *cfg,
                             const struct safetensors *st, const struct stage_memory_options *opt);

struct stage_plan_entry {
    struct stage_range range;
    uint64_t weight_bytes;
    uint64_t kv_bytes;
    uint64_t workspace_bytes;
    uint64_t total_bytes;
    uint64_t memory_bytes; /* the node's free memory, 0 when unknown */
};

struct stage_plan {
    int num_layers;
    int num_stages;
    struct stage_plan_entry stages[STAGE_PLAN_MAX_STAGES];
};

/* prefix[l] = weight bytes of layers [0, l) (prefix [L + 1]), and stage s of S owning
 * [start, end) priced with it (the accounting at the top of this file): the pieces
 * stage_plan_price is made of, for searches that price many ranges. */
void stage_plan_layer_prefix(uint64_t *prefix, const struct stage_memory_model *mm);
void stage_plan_price_stage(struct stage_plan_entry *e, const struct stage_memory_model *mm,
                            const uint64_t *prefix, int s, int num_stages, int start, int end);

/* Fills the byte columns of a plan for the given ranges (ranges[S], stage 0 first). */
int stage_plan_price(struct stage_plan *plan, const struct stage_memory_model *mm,
                     const struct stage_range *ranges, int num_stages);

/* Memory-proportional plan over S = num_stages nodes with free_bytes[S]. Fails with
 * STRATA_ERANGE and a message naming the tightest node when the model does not fit. */
int stage_plan_balanced(struct stage_plan *plan, const struct stage_memory_model *mm,
                        const uint64_t *free_bytes, int num_stages);

/* Decode-balanced split (see the top of this file) of mm's layers over S stages: out[S]. */
int stage_plan_decode(struct stage_range *out, const struct stage_memory_model *mm, int num_stages);

/* Weight bytes stage s of S streams per decoded token when it owns [layer_start, layer_end). */
uint64_t stage_plan_streamed_bytes(const struct stage_memory_model *mm, int s, int num_stages,
                                   int layer_start, int layer_end);

/* One process of the PP × KVP × TP grid (runtime/model/tp_shard.h) and what it holds. */
struct grid_plan_entry {
    int rank;                  /* global rank */
    struct grid_coords coords; /* stage, kvp rank, tp rank */
    struct stage_range range;  /* the stage's layers */
    struct tp_shard shard;     /* heads, KV heads, MLP columns, experts, vocab rows */
    struct tp_range kv_tokens; /* KV positions held of every sequence */
    uint64_t weight_bytes;     /* the rank's slices of the stage's tensors */
    uint64_t kv_bytes;        /* 2 × layers × held KV heads × D × kv bytes × tokens × batch */
    uint64_t workspace_bytes; /* the whole stage's (an upper bound for one rank) */
    uint64_t total_bytes;
};

/* Prices global rank `rank` of a checked grid (grid_config_check) whose stages own
 * ranges[grid->pp]. Weight bytes are exact stored slice bytes when `st` is given, else
 * shapes × the checkpoint dtype size. */
int grid_plan_price_rank(struct grid_plan_entry *e, const struct model_config *cfg,
                         const struct safetensors *st, const struct grid_config *grid,
                         const struct stage_range *ranges, const struct stage_memory_options *opt,
                         int rank);

/* Parses a size such as "24G", "512M", "1.5G", "1000" (bytes; K/M/G/T are powers of 1024,
 * an optional trailing "B"/"iB" is accepted). */
int stage_plan_parse_size(uint64_t *out, const char *text);

/* Formats bytes as "1.50 GiB" / "12.0 MiB" / "512 B" into buf[cap]. */
void stage_plan_format_size(char *buf, size_t cap, uint64_t bytes);

#endif
