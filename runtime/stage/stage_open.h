/* Opening a stage: config + weights + role + device -> backend + core, the one assembly
 * used by strata-stage, the simulator and the tests. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_OPEN_H
#define STRATA_RUNTIME_STAGE_STAGE_OPEN_H

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/stage_core.h"

/* Stage r of S's role: layers [layer_start, layer_end) (both -1: the even split of
 * runtime/model/stage_plan.h), the embedding on stage 0, the head on the last. Fails with
 * STRATA_ERANGE naming the stage, the range and L when the shard is empty, out of range,
 * or leaves a gap at either end of the ring (stage 0 must start at 0, the last end at L). */
int stage_role_for(struct stage_role *role, const struct model_config *cfg, int stage_index,
                   int num_stages, int layer_start, int layer_end);

struct stage_open_options {
    const struct model_config *cfg;    /* borrowed: must outlive the stage */
    const struct safetensors *weights; /* borrowed: only read while opening */
    const char *weights_source;        /* names the checkpoint in messages */
    int stage_index, num_stages;
    int layer_start, layer_end; /* both -1: the even split */
    const char *device;         /* "cpu" (NULL), "cuda", "cuda:N": runtime/stage/backend.h */
    int num_threads;
    const char *weights_dtype; /* NULL / "bf16" or "q8": stage_backend_options */
    int weights_in_file;       /* stage_backend_options */
    int max_seq, max_batch;    /* KV positions per slot, KV slots */
    size_t kv_memory;          /* stage_backend_options: the KV pool's budget */
    double kv_memory_fraction;
    enum ops_dtype kv_dtype;           /* stage_backend_options: what the KV cache stores */
    int chunk_size, max_batch_tokens;  /* stage_core_options */
    int keep_logits, send_kv;          /* stage_core_options */
    int speculate, speculate_k;        /* stage_core_options: stage 0's drafting default */
    int speculate_waves;               /* stage_core_options: decode steps in flight */
    const struct oracle_draft *oracle; /* stage_core_options: benchmarks' recorded drafts */
    /* Stage 0: a draft model for speculative decoding (both NULL: none), opened whole on the
     * stage's device with its threads, KV dtype and a slot per request (borrowed). */
    const struct model_config *draft_cfg;
    const struct safetensors *draft_weights;
    /* NULL or tp 1: the whole stage. Else rank 0 of the stage's TP group (stage_tp.h):
     * its shard, leading the other ranks (which run stage_tp_follow, not a stage). */
    const struct stage_tp_config *tp;
    struct strata_progress progress; /* weight load progress: stage_backend_options */
    double (*now_sec)(void);         /* stage 0's clock for its draft budget (stage_core.h) */
};

struct stage {
    struct stage_backend *backend;
    struct stage_core *core;
    struct stage_backend *draft; /* stage 0's draft model, or NULL */
};

/* Resolves the role, checks that the checkpoint holds every tensor it needs (all missing
 * or mis-shaped ones named at once: STRATA_ENOTFOUND / STRATA_EFORMAT), opens the
 * device's backend and the core. When `report` is not NULL and the tensor check fails, it
 * keeps the tensor list (the caller prints it with stage_tensor_list_report and frees it
 * with stage_tensor_list_free); otherwise it is left empty. */
int stage_open(struct stage *out, const struct stage_open_options *opt,
               struct stage_tensor_list *report);
void stage_close(struct stage *stage); /* accepts a zeroed or half-opened stage */

/* A TP / KVP rank other than group rank 0 (opt->tp split, not rank 0): its shard's backend
 * only (no core: it runs stage_tp_follow under its leader), resolved, checked and reported
 * exactly as stage_open does. */
int stage_open_follower(struct stage_backend **out, const struct stage_open_options *opt,
                        struct stage_tensor_list *report);

#endif
