/* One simulated pipeline run: S stage cores (runtime/stage/stage_core.h) on their own threads,
 * a client, and simulated links (sim/link.h) carrying the real encoded wire frames, all
 * driven by a virtual clock (sim/virtual_clock.h).
 *
 * Topology. Stage r and stage (r+1) mod S share a connection: its forward direction
 * carries what r sends on NEXT (arriving on PREV), its backward direction what r+1 sends
 * on PREV (arriving on NEXT). The client has one connection to stage 0. Each direction is
 * its own sim_link with its own PRNG stream; every link gets the same parameters.
 *
 * Timing. The coordinator pops the earliest event (frame arrival, end of a compute step,
 * stage kill, link failure) and applies it. A stage is a single-threaded server: frames
 * arriving while it computes wait in its inbox until the step ends. A step runs on the
 * stage's thread; its measured time (wall clock by default; thread CPU time, or a fixed
 * cost per computed row and layer, on request) is charged to the virtual timeline, and
 * the frames the step produced leave when it ends. Frame contents never depend on timing,
 * so tokens and logits are the same for every split, link and timing setting; with the
 * fixed cost model the simulated times are deterministic too.
 *
 * Failures. A killed stage stops at its kill time; its peers learn at kill time + latency
 * (the kernel resets the connections) and fail the requests they hold. A partitioned
 * stage's links lose every frame from the partition time: senders give up after the
 * link's retransmissions, and both ends of each connection also notice the dead peer
 * after `peer_timeout_ns` (keepalive). The client fails any request not finished by
 * `request_timeout_ns`. So a failure scenario always ends with a clear error, never a
 * hang. */
#ifndef STRATA_SIM_PIPELINE_SIM_H
#define STRATA_SIM_PIPELINE_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "reference/sampler.h"
#include "runtime/base/op_contract.h"
#include "runtime/model/model_config.h"
#include "runtime/model/perf_model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"
#include "sim/link.h"
#include "sim/split.h"

enum sim_compute_model {
    SIM_COMPUTE_WALL = 0,  /* charge each step's wall-clock time */
    SIM_COMPUTE_CPU = 1,   /* charge the stage thread's CPU time of the step */
    SIM_COMPUTE_FIXED = 2, /* charge rows x layers x row_layer_cost_ns (deterministic) */
    SIM_COMPUTE_MODEL =
        3 /* charge the performance model's step time (runtime/model/perf_model.h) */
};

struct sim_request_spec {
    const int32_t *prompt; /* [prompt_len] */
    int prompt_len;
    int max_tokens;
    int num_stop_ids;
    const int32_t *stop_ids; /* [num_stop_ids] */
    struct sampler_params sampling;
    const struct request_vision *vision; /* Qwen3-VL inputs, or NULL (runtime/stage/request.h) */
    /* 0: sent at virtual time 0; k > 0: sent when request k (1-based, an earlier one) has
     * finished normally, e.g. the same prompt again to reuse the KV blocks it left cached
     * (failed with it when that one fails). */
    int after;
    /* With after = k: > 0 makes this the next turn of a chat: its prompt is request k's prompt
     * followed by the first answer_tokens tokens k generated (fewer if k stopped sooner),
     * built when it is sent; `prompt` is then unused and prompt_len is that length. Request k
     * is no such turn itself. */
    int answer_tokens;
};

struct sim_options {
    const struct model_config *cfg;
    const struct safetensors *weights;
    struct sim_split split;
    struct sim_link_params link; /* every link, unless overridden below */
    /* Optional per-connection overrides: conn_link[c] (c < num_conn_link) applies to both
     * directions of the connection from stage c to stage (c+1) mod S when
     * conn_link_set[c] is nonzero. */
    const struct sim_link_params *conn_link;
    const int *conn_link_set;
    int num_conn_link;
    uint64_t seed;                           /* link PRNG streams */
    int num_requests;                        /* R, sent at virtual time 0 or `after` */
    const struct sim_request_spec *requests; /* [num_requests] */
    int num_threads;                         /* matmul threads per stage model */
    const char *device; /* each stage's backend: "cpu" (NULL) or "cuda[:N]" (backend.h) */
    int chunk_size;     /* prefill chunk rows (0: stage core default) */
    enum sim_compute_model compute;
    int64_t row_layer_cost_ns; /* SIM_COMPUTE_FIXED: cost of one row through one layer */
    /* SIM_COMPUTE_MODEL: a step of r rows over a stage's layers costs what the performance
     * model says on this device profile: max(weight bytes / streaming rate, matmul time), the
     * head on the last stage for the rows it samples, and the attention its rows ran
     * (perf_stage_step_sec; with tp > 1 or kvp > 1 each stage priced as a TP x KVP group of
     * that many devices over perf_device_set_tp's default link) */
    const struct perf_device *profile;
    const struct perf_layers *perf;
    /* Timing only: no weights (weights NULL); every stage runs on the timing backend
     * (sim/backend_timing.c: nothing computed, the KV pool's bookkeeping kept), charged by
     * SIM_COMPUTE_MODEL; the tokens are placeholders and no logits are kept. Not with TP /
     * KVP, speculation or another device. */
    int no_weights;
    int kill_stage; /* -1: none */
    int64_t kill_at_ns;
    int partition_stage; /* -1: none */
    int64_t partition_at_ns;
    int64_t peer_timeout_ns;    /* keepalive detection of a silent peer */
    int64_t request_timeout_ns; /* client deadline for every request */
    int keep_logits;            /* collect the last stage's logits per request */
    /* Tensor / KV parallelism inside every stage (sim/sim_grid.h): degrees (1 = none), KV
     * positions per KVP rank (0 = an even split of the longest request), MoE mode. */
    int tp, kvp, kvp_tokens;
    enum tp_moe_mode moe;
    /* Each stage's weights: NULL / "bf16" or "q8" (runtime/stage/backend.h). */
    const char *weights_dtype;
    enum ops_dtype kv_dtype; /* what every stage's KV cache stores (0: f32) */
    /* Stage 0's speculative decoding (stage_core_options): enum wire_speculate, drafts, and
     * a draft model (both NULL: none). */
    int speculate, speculate_k, speculate_waves;
    const struct model_config *draft_cfg;
    const struct safetensors *draft_weights;
};

/* Fills defaults: no faults, wall-clock compute, 2 s peer timeout, 60 s request timeout,
 * 1 thread, keep_logits on. cfg, weights, split and requests are left for the caller. */
void sim_options_default(struct sim_options *opt);

struct sim_request_outcome {
    uint64_t nonce;
    int status;        /* 0 ok, or the STRATA_E* code the client saw */
    char message[512]; /* the client's error message, "" when ok */
    int finish;        /* wire_finish of the last token (STOP / LENGTH) */
    int n_tokens;
    int32_t *tokens;   /* [n_tokens] as streamed to the client */
    int prompt_len;    /* as sent (a next turn's: its first's prompt and answer) */
    int cached_tokens; /* prompt positions stage 0 took from its KV cache (its first token's) */
    int vocab;
    float *logits;   /* [n_tokens][vocab] from the last stage, or NULL */
    int64_t sent_ns; /* when the client sent it */
    int64_t ttft_ns; /* first token at the client, from the request's send time */
    int64_t done_ns; /* last token (or the error) at the client */
};

struct sim_stage_stats {
    int layer_start, layer_end;
    uint64_t steps;  /* microbatches run */
    uint64_t rows;   /* hidden rows computed */
    int64_t busy_ns; /* virtual time charged for compute */
    int64_t wall_ns; /* measured wall-clock time of its steps */
    int64_t cpu_ns;  /* measured thread CPU time of its steps */
    uint64_t frames_out, bytes_out;
    /* Where its idle time lies (virtual): before its first step (the pipeline filling),
     * between steps (starved: nothing queued), after its last step (draining). */
    int64_t first_step_ns;    /* start of its first step, -1 when it ran none */
    int64_t last_step_end_ns; /* end of its last step */
    int64_t gap_ns;           /* idle time between its first and last step */
};

struct sim_report {
    int num_stages;
    int num_requests;
    struct sim_request_outcome *requests; /* [num_requests] */
    struct sim_stage_stats *stages;       /* [num_stages] */
    int failed_requests;
    int64_t makespan_ns;           /* last client event of any request */
    double mean_ttft_ns;           /* over successful requests */
    double tokens_per_s;           /* generated tokens / makespan */
    double utilisation;            /* sum of stage busy time / (S x makespan) */
    double bubble_fraction;        /* 1 - utilisation */
    uint64_t events;               /* events the coordinator handled */
    uint64_t retransmits;          /* over every link */
    int protocol_errors;           /* frames a stage core refused as unusable (a bug) */
    uint64_t prefix_cached_tokens; /* prompt tokens stage 0 took from its KV cache */
    uint64_t spec_steps, spec_drafted, spec_accepted; /* stage 0's speculation counters */
    char first_protocol_error[512];
};

/* Runs the whole simulation. Returns 0 when the simulation itself worked, even if requests
 * failed (see report->requests[i].status); a negative status when it could not run (bad
 * options, model load failure, a stage core refusing its options, a stalled pipeline). */
int sim_run(struct sim_report *report, const struct sim_options *opt);
/* Accepts a zeroed or half-filled report. */
void sim_report_free(struct sim_report *report);

#endif
