/* The performance model: what a plan will cost before it runs, from config.json alone (no
 * weights), a device profile per stage and a link profile. The same numbers a deployment's
 * operator asks for: time per decode step per stage, tokens/s at batch 1 and B, time to first
 * token for a prompt, and which stage or link is the bottleneck.
 *
 * Device profile: a small JSON file, measured once per box by `strata-stage --calibrate`
 * (reference/calibrate.h) or written from a specification (then "source": "spec"):
 *   {"name": "...", "source": "measured", "device": "cpu", "threads": 2, "mem_bytes": N,
 *    "read_gbps": R, "gemv_gbps": G, "gemm_gflops": F,
 *    "gemm_gflops_by_k": {"1024": F1, "2048": F2, "4096": F4, "8192": F8},
 *    "attn_gflops": A, "attn_gbps": C,
 *    "gemv_gbps_by_bytes": {"4194304": G4, "33554432": G32, ...}}
 *   read_gbps    host read bandwidth at `threads` (attention streams the KV cache at it);
 *   gemv_gbps    weight bytes a bf16 matmul of one row streams per second (decode: every
 *                weight read once per step);
 *   gemm_gflops  what a bf16 matmul of 64 rows achieves (prefill, large batches);
 *   gemm_gflops_by_k  the same by the matrix's inner dimension K (optional): a row block of
 *                the weights stays in cache while the rows pass over it or not, so a CPU's
 *                rate falls as K grows; the model interpolates in log K between the points;
 *   attn_gflops  attention over the cache for a prefill chunk (optional; else gemm at K = D);
 *   attn_gbps    the cache bytes a decode step's attention streams per second (optional;
 *                else read_gbps);
 *   gemv_gbps_by_bytes  the streaming rate by the weights a step reads (optional): a stage
 *                whose weights fit the caches streams them faster than from memory; the model
 *                interpolates in log bytes (the largest point above it). Stages sharing a
 *                host share its caches and cores, which the model does not know: it assumes a
 *                box per stage;
 *   gemm_split_gflops_by_k  the row-parallel matrices' rate by K (optional; o_proj and the
 *                down projections run matmul_split, whose dot products are trees of leaves).
 * Link profile: latency (one way) and bandwidth.
 *
 * Cost of a stage's step of r rows (perf_stage_step_sec: the CPU backend's way of running a
 * step; spec figures for other devices use the same form):
 *   step(r) = max(weights(r) / gemv, Σ over the layers' matrices 2 · params · r / gemm(K))
 *             [+ the head's max(bytes / gemv, its matmul) when the step samples: after the
 *             layers, not overlapped] + attention
 *     where weights(r) are the bytes the step reads: every dense tensor of its layers, and of
 *     each MoE layer only the experts its r rows route to in expectation, E · (1 − (1 − k/E)^r)
 *     — 22B of Qwen3-235B-A22B's 235B at r = 1; attention per layer: a decode row streams its
 *     context's KV at attn_gbps, a prefill chunk computes 2 · 2 · pairs · nh · D at
 *     attn_gflops (a chunk of T rows after c positions attends to T · (c + (T + 1) / 2) pairs).
 *   A TP group of t devices (perf_device.tp) divides every part by t (KV while there are as
 *   many KV heads as ranks) and adds two all-reduces of r × H × 4 bytes per layer; KVP k
 *   (perf_device.kvp: t × k devices) leaves a decode step's attention to the rank holding the
 *   most of its context (min(1, kvp_tokens / context) of it) and adds two all-gathers per
 *   layer (r × nh/t maxima, then r × nh/t × (D + 2) partial sums, f32).
 * A hop is one frame: rows × H × 4 bytes and a header (PERF_FRAME_HEADER_BYTES) from a stage
 * to the next, the header alone for the token the last stage sends back to stage 0. Its time
 * is the link's (perf_link_one_way_us): latency + bytes / bandwidth, or where the link was
 * probed, the probe's mean one-way times by frame size, stalls included.
 * The pipeline (S stages in a ring, stage 0 samples nothing, the last stage answers):
 *   batch 1: one token every Σ_s step_s(1) + S − 1 hops of a row + the token's hop back (no
 *            hop when S = 1);
 *   batch B: g = ⌈B / S⌉ rows per step, ⌈B / g⌉ groups in flight: tokens/s =
 *            B / max(Σ_s step_s(g) + S − 1 hops of g rows + the token hop,
 *                    groups · max_s step_s(g));
 *   time to first token: the prompt in the chunks stage 0 cuts (stage_plan_prefill_chunk: at
 *            most --chunk-size, at least one per stage), Σ_s prefill_s(c) + (n_chunks − 1) ·
 *            max_s prefill_s(c) + the head once + S − 1 hops of c rows + the token hop.
 * It is a model: it ignores what is small on a large model (sampling, the event loop's
 * wake-ups), and `./strata bench predict` says how far it is from real runs. */
#ifndef STRATA_RUNTIME_MODEL_PERF_MODEL_H
#define STRATA_RUNTIME_MODEL_PERF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/stage_plan.h"

#define PERF_MAX_K_POINTS 8
/* The rows the 64-row rates (gemm_gflops, by K, split) are measured at. */
#define PERF_GEMM_ROWS 64

/* A hop's frame beyond its rows: an Activation's header and tensor description (192 bytes in
 * the link probe's frames; wire/link_probe.h), and all of a returning token's frame. */
#define PERF_FRAME_HEADER_BYTES 192.0

/* A rate by a size: n points, keys ascending. */
struct perf_points {
    int n;
    double key[PERF_MAX_K_POINTS], value[PERF_MAX_K_POINTS];
};

struct perf_link {
    double latency_us; /* one way */
    double gbps;       /* gigabytes per second */
    /* optional (n 0: none): a probe's mean one-way time (us) by whole frame bytes (a hosts
     * file's or probe's "points"), which prices a hop where it was measured: on a lossy link
     * a row's frame stalled more than a token's (wire/link_probe.c), which latency_us alone
     * cannot say */
    struct perf_points mean_us;
};

/* One frame of `bytes` (header included) over l, microseconds: with points, the mean of the
 * smallest at or below it, linear between two, beyond the largest its mean plus the rest at
 * gbps; without, latency_us + bytes / gbps. */
double perf_link_one_way_us(const struct perf_link *l, double bytes);

/* {"latency_us": >= 0, "gbps": > 0} with optional "points": [{"bytes": B, "mean_us": T, ...},
 * ...] (bytes ascending, up to PERF_MAX_K_POINTS: a probe's link object, as strata-stage
 * --probe-links and strata-stage-bench probe-link write it) into *l: 0, or -1 when it is not
 * that. */
struct cJSON;
int perf_link_from_json(struct perf_link *l, const struct cJSON *o);

/* perf_link_from_json of a file's object (a probe's link file): 0, or STRATA_EFORMAT (or the
 * read's error) with the error set naming the file. */
int perf_link_load(struct perf_link *l, const char *path);

/* The value at `key`: log-linear in the key between two points, flat beyond the ends; `dflt`
 * when there are no points. */
double perf_points_at(const struct perf_points *p, double key, double dflt);

/* The elements a layer's row ops (row_ops_gelems below) count per row: two RMSNorms and two
 * residual adds over the hidden size, a norm and RoPE over each q and k head, the K and V
 * rows stored. */
#define PERF_ROW_OPS_ELEMS(hidden, heads, kv_heads, head_dim)                                      \
    (4.0 * (hidden) + 2.0 * ((heads) + (kv_heads)) * (head_dim) + 2.0 * (kv_heads) * (head_dim))

struct perf_device {
    char name[64];
    char source[16]; /* "measured" or "spec" */
    char device[16]; /* "cpu", "cuda" */
    int threads;
    uint64_t mem_bytes;
    double read_gbps, gemv_gbps, gemm_gflops;
    double attn_gflops, attn_gbps; /* 0: not measured */
    /* Rates by a size, each optional (no points: the single figure above), log-linear between
     * points, flat beyond the ends: gemm_gflops_by_k (a row block of the weights stays in cache
     * while the rows pass, or not); gemv_gbps_by_bytes (a stage whose weights fit the caches
     * streams them faster); gemm_split_gflops_by_k (the row-parallel matrices: o_proj, down, an
     * expert's down, reference/ops.h matmul_split, whose dot products are trees of
     * OPS_SPLIT_LEAVES leaves so that TP ranks give one rank's bits; none: the plain rate);
     * attn_gflops_by_ctx (a prefill chunk's attention by the context its rows attend to on
     * average: short contexts pay the per-block widening and tree more; none: attn_gflops);
     * gemm_gflops_by_rows (a 2048 x 2048 matmul by the rows it multiplies: fewer rows than
     * PERF_GEMM_ROWS use each weight load less, a 32-row prefill chunk ran 12% slower per row
     * than a 64-row one; below PERF_GEMM_ROWS every matmul rate is scaled by
     * by_rows(r) / by_rows(PERF_GEMM_ROWS), at most 1; none: no scaling). */
    struct perf_points gemm_by_k, gemv_by_bytes, gemm_split_by_k, attn_by_ctx, gemm_by_rows;
    /* elementwise_gelems: SwiGLU's elements per second (its expf), what a row costs a layer
     * beyond its matmuls and attention: the MLP's activation (optional; 0: not priced) */
    double elementwise_gelems;
    /* row_ops_gelems: the rest of a layer's row ops (RMSNorms, q / k norms, RoPE, the KV
     * store, residual adds) in PERF_ROW_OPS_ELEMS elements per second (optional; 0: not
     * priced) */
    double row_ops_gelems;
    /* Not in the profile: what runs one stage. tp > 1: a TP group of tp such devices (each
     * holds 1/tp of the stage's matrices, heads and KV heads) whose two all-reduces per layer
     * of the step's rows cross tp_link (latency_us: one small all-reduce's fixed cost; then a
     * ring's 2 (tp − 1) / tp of the bytes at gbps); set by a hosts file's "devices"
     * (perf_device_set_tp). */
    int tp;
    struct perf_link tp_link;
    /* kvp > 1: each TP rank is kvp devices, KV parallel (Medha): each holds the rank's weights
     * and the KV of kvp_tokens positions of every sequence (kvp_kv = kvp_tokens / max_seq of
     * its KV); a decode step's attention runs on the rank holding the most of its context
     * (kvp_attn = min(1, kvp_tokens / context) of it), and two all-gathers per layer (the
     * per-query maxima, then the partial sums) cross tp_link (perf_device_set_kvp). */
    int kvp;
    double kvp_kv, kvp_attn;
};

/* Makes d a TP group of tp devices over `link`, or over the default when NULL: shared memory
 * on a CPU host (a quarter of its read bandwidth, 5 us an all-reduce), NVLink-class on CUDA
 * devices (300 GB/s, 15 us): estimates, which a hosts file's "device_link" replaces. */
void perf_device_set_tp(struct perf_device *d, int tp, const struct perf_link *link);

/* Makes each rank of d's TP group kvp devices, KV parallel with kvp_tokens positions each
 * (tp_shard.h grid_config_check's rule), for sequences of max_seq positions and decode steps
 * that attend to `context` positions. kvp 1: none. Its all-gathers cross d's tp_link: set it
 * first (perf_device_set_tp, with tp 1 for KVP alone). */
void perf_device_set_kvp(struct perf_device *d, int kvp, int kvp_tokens, int max_seq,
                         double context);

/* The device's weight-streaming GB/s for a step that reads `bytes` of weights. */
double perf_device_gemv_gbps(const struct perf_device *d, double bytes);

/* The device's matmul GFLOP/s for an inner dimension K (see above), and a row-parallel
 * (split) matrix's. */
double perf_device_gemm_gflops(const struct perf_device *d, double K);
double perf_device_gemm_split_gflops(const struct perf_device *d, double K);
/* What a matmul of `rows` rows gets of the PERF_GEMM_ROWS-row rates: by_rows(rows) /
 * by_rows(PERF_GEMM_ROWS), at most 1; 1 without gemm_gflops_by_rows or from PERF_GEMM_ROWS
 * rows on. */
double perf_device_gemm_rows_factor(const struct perf_device *d, double rows);

/* Reads / writes a device profile (JSON above). Parse errors name the field (STRATA_EFORMAT). */
int perf_device_parse(struct perf_device *d, const char *json, size_t len);
int perf_device_load(struct perf_device *d, const char *path);
/* The JSON text of d, malloc'ed (NUL-terminated). */
int perf_device_format(const struct perf_device *d, char **out);

/* A layer's matrices grouped by inner dimension K: parameters whose K is the hidden size (q,
 * k, v, gate, up, the router), the attention output's (nh · D) and the down projection's (its
 * intermediate size); an expert's likewise. */
struct perf_layer {
    double dense_bytes;   /* attention + norms (+ dense MLP, router) */
    double expert_bytes;  /* one expert (0: a dense layer) */
    int experts;          /* E of a MoE layer, else 0 */
    double p_h, p_o, p_i; /* dense parameters by K: hidden, nh·D, intermediate */
    double e_h, e_i;      /* one expert's parameters by K: hidden, its intermediate */
    int k_i, k_ei;        /* the intermediate sizes (dense, expert) */
};

/* What the model reads of a checkpoint's config, per layer, independent of the split. */
struct perf_layers {
    int num_layers, hidden, heads, head_dim, kv_heads, vocab, top_k;
    double dtype_bytes; /* of the stored weights */
    struct perf_layer layer[MODEL_CONFIG_MAX_LAYERS];
    double embed_bytes, head_bytes; /* embed_tokens; norm + lm_head */
};

int perf_layers_build(struct perf_layers *pl, const struct model_config *cfg);

/* The pieces of a stage's step (the placement search sums them over layer ranges): layer l's
 * weight bytes at `rows` rows (MoE: the routed experts), its matmul seconds on d (with its
 * row ops: SwiGLU and, where the profile has them, the norms, RoPE, KV store and adds), the
 * head's, and one layer's KV streaming seconds for rows attending to ctx positions. */
double perf_layer_bytes(const struct perf_layers *pl, int l, int rows);
double perf_layer_matmul_sec(const struct perf_layers *pl, int l, const struct perf_device *d,
                             double rows);
double perf_head_matmul_sec(const struct perf_layers *pl, const struct perf_device *d, double rows);
double perf_layer_kv_sec(const struct perf_layers *pl, const struct perf_device *d, double ctx,
                         double rows, double kv_bytes);
/* One layer's attention of a step: decode rows stream the KV they attend to (decode_positions
 * in all, perf_layer_kv_sec), a prefill chunk's rows compute over the (query, key) pairs they
 * attend to (prefill_pairs in all, over prefill_rows rows: a chunk of n rows after c positions
 * has n·(c + (n + 1) / 2)), at the device's attention rates (the prefill rate at the rows'
 * average context, attn_gflops_by_ctx). */
double perf_layer_attn_sec(const struct perf_layers *pl, const struct perf_device *d,
                           double decode_positions, double prefill_rows, double prefill_pairs,
                           double kv_bytes);

/* One step from its parts on d (perf_stage_step_sec sums them; the placement search reads them
 * from prefix sums): the layers' weight bytes, matmul seconds and attention seconds, the head's
 * bytes and matmul seconds (0 when the step runs no head), over `layers` layers and `rows`
 * rows. A TP group divides each part among its ranks and adds its all-reduces. */
double perf_step_sec(const struct perf_layers *pl, const struct perf_device *d, int layers,
                     double rows, double wbytes, double compute, double attn, double hbytes,
                     double hcompute);

/* Seconds of one step of a stage over layers r on d: `rows` rows through the layers (their
 * weights stream or their matmuls run, whichever is slower), `head_rows` of them then through
 * the head (likewise, after the layers: the two do not overlap), and the attention those rows
 * ran (perf_layer_attn_sec; kv_bytes per cached element). strata-plan --predict, the placement
 * search and strata-sim --compute model all price a step by it. */
double perf_stage_step_sec(const struct perf_layers *pl, const struct stage_range *r,
                           const struct perf_device *d, double rows, double head_rows,
                           double decode_positions, double prefill_rows, double prefill_pairs,
                           double kv_bytes);

/* One stage's prediction. */
struct perf_stage {
    struct stage_range range;
    double decode_ms_1, decode_ms_b; /* per step at batch 1 and at g = ⌈B / S⌉ rows */
    double prefill_ms_chunk;         /* one chunk of the prompt */
    double bytes_per_token;          /* weights read by a batch-1 step */
};

struct perf_options {
    int batch;          /* B for the batch prediction (>= 1) */
    int prompt_tokens;  /* for time to first token */
    int chunk_tokens;   /* prefill chunk (strata-stage --chunk-size) */
    int context_tokens; /* KV positions a decode step attends to (default: prompt_tokens) */
    double kv_bytes;    /* per KV element: 2 (f16 / bf16, the default) or 4 */
};

/* The context a decode step attends to (context_tokens, else the prompt, else 1) and the KV
 * element's bytes (default 2: f16 / bf16), as perf_predict and the placement read them. */
static inline double perf_options_context(const struct perf_options *o) {
    return o->context_tokens > 0 ? o->context_tokens : o->prompt_tokens > 0 ? o->prompt_tokens : 1;
}
static inline double perf_options_kv_bytes(const struct perf_options *o) {
    return o->kv_bytes > 0 ? o->kv_bytes : 2;
}

struct perf_prediction {
    int num_stages;
    struct perf_stage stages[STAGE_PLAN_MAX_STAGES];
    int chunk_rows;                /* the prefill chunk priced (stage_plan_prefill_chunk) */
    double hop_ms_1, hop_ms_chunk; /* per hop (the mean where the hops' links differ) */
    double tokens_per_s_1, tokens_per_s_b, ttft_ms;
    int bottleneck_stage; /* the slowest stage at batch 1, or -1: the links */
};

/* Rows per stage step when B requests share an S-stage pipeline (⌈B / S⌉), and how many such
 * groups are in flight at once (⌈B / rows⌉ <= S): the bottleneck stage runs that many steps
 * per round of every request, so a batch smaller than S does not pay for S. */
static inline int perf_rows_per_step(int batch, int num_stages) {
    return (batch + num_stages - 1) / num_stages;
}
static inline int perf_groups_in_flight(int batch, int num_stages) {
    const int g = perf_rows_per_step(batch, num_stages);
    return (batch + g - 1) / g;
}

/* One hop over `link`, milliseconds: a frame of `rows` f32 hidden states, or rows 0, the
 * token the last stage sends back (what perf_predict and the placement charge a hop). */
double perf_hop_ms(const struct perf_layers *pl, const struct perf_link *link, int rows);

/* Prices `ranges` [S] with devices [S] (one profile per stage) and one link for every hop. */
int perf_predict(struct perf_prediction *out, const struct perf_layers *pl,
                 const struct stage_range *ranges, int num_stages,
                 const struct perf_device *devices, const struct perf_link *link,
                 const struct perf_options *opt);

/* perf_predict with a link per hop: hops [S], hop s from stage s to stage s + 1 and hop S - 1
 * from the last stage back to stage 0 (the sampled token). hop_ms_1 / hop_ms_chunk are then
 * the hops' mean. */
int perf_predict_hops(struct perf_prediction *out, const struct perf_layers *pl,
                      const struct stage_range *ranges, int num_stages,
                      const struct perf_device *devices, const struct perf_link *hops,
                      const struct perf_options *opt);

#endif
