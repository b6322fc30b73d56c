/* stage_open: the one assembly of a stage; see stage_open.h. */
#include "runtime/stage/stage_open.h"

#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_plan.h"
#include "runtime/stage/stage_tp.h"

int stage_role_for(struct stage_role *role, const struct model_config *cfg, int stage_index,
                   int num_stages, int layer_start, int layer_end) {
    int L = cfg->num_layers, first = stage_index == 0, last = stage_index == num_stages - 1;
    memset(role, 0, sizeof *role);
    if (num_stages < 1 || stage_index < 0 || stage_index >= num_stages)
        return strata_set_error(STRATA_ERANGE, "stage index %d is outside [0, %d)", stage_index,
                                num_stages);
    if (layer_start < 0 && layer_end < 0) {
        struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
        if (num_stages > STAGE_PLAN_MAX_STAGES || stage_plan_even(ranges, L, num_stages) < 0)
            return strata_wrap_error(STRATA_ERANGE,
                                     "stage %d of %d: the shard is empty or out of range",
                                     stage_index, num_stages);
        layer_start = ranges[stage_index].layer_start;
        layer_end = ranges[stage_index].layer_end;
    }
    struct stage_role r = {
        .layer_start = layer_start, .layer_end = layer_end, .with_embed = first, .with_head = last};
    int rc = stage_role_check(&r, L, stage_index, num_stages);
    if (rc == 0) *role = r;
    return rc;
}

/* Every tensor of the role present with its shape, before any is loaded. */
static int check_tensors(const struct stage_open_options *opt, const struct stage_role *role,
                         struct stage_tensor_list *report) {
    struct stage_tensor_list list;
    memset(&list, 0, sizeof list);
    int rc = stage_tensor_list_build(&list, opt->cfg, role, opt->weights);
    if (rc == 0)
        rc = stage_tensor_list_check(&list, opt->weights,
                                     opt->weights_source ? opt->weights_source : "the checkpoint");
    if (rc < 0 && report)
        *report = list;
    else
        stage_tensor_list_free(&list);
    return rc;
}

/* The role, then the backend of it on the device (a TP / KVP rank's shard through
 * stage_tp_open), with the full tensor report when the checkpoint does not fit: what a stage
 * and a TP follower open alike. */
static int open_backend(struct stage_backend **out, const struct stage_open_options *opt,
                        struct stage_tensor_list *report, int follower) {
    struct stage_role role;
    *out = NULL;
    if (report) memset(report, 0, sizeof *report);
    /* Weights: stage_backend_open's check (a timing-only backend needs none). */
    if (!opt->cfg) return strata_set_error(STRATA_EINVAL, "a stage needs a config");
    int rc = stage_role_for(&role, opt->cfg, opt->stage_index, opt->num_stages, opt->layer_start,
                            opt->layer_end);
    if (rc < 0) return rc;
    struct stage_backend_options bo = {.cfg = opt->cfg,
                                       .weights = opt->weights,
                                       .role = role,
                                       .device = opt->device,
                                       .num_threads = opt->num_threads,
                                       .weights_dtype = opt->weights_dtype,
                                       .weights_in_file = opt->weights_in_file,
                                       .max_seq = opt->max_seq,
                                       .num_slots = opt->max_batch,
                                       .kv_memory = opt->kv_memory,
                                       .kv_memory_fraction = opt->kv_memory_fraction,
                                       .kv_dtype = opt->kv_dtype,
                                       .tp = opt->tp,
                                       .progress = opt->progress};
    int split = stage_tp_is_split(opt->tp);
    int rank0 = !split || (opt->tp->tp_rank == 0 && opt->tp->kvp_rank == 0);
    if (follower && rank0)
        return strata_set_error(STRATA_EINVAL, "group rank 0 leads its stage (stage_open); only "
                                               "the other TP / KVP ranks follow");
    if (!follower && !rank0)
        return strata_set_error(STRATA_EINVAL,
                                "TP rank %d / KVP rank %d follows its leader (stage_tp_follow); "
                                "only rank 0 opens a stage",
                                opt->tp->tp_rank, opt->tp->kvp_rank);
    rc = split ? stage_tp_open(out, &bo) : stage_backend_open(out, &bo);
    /* The backend's loader checks the tensors against the manifest itself; only when that
     * fails is the list built again, for the caller's full report (no second check on the
     * way up). Its message names the checkpoint; the loader's is kept if it finds nothing. */
    if (rc == STRATA_ENOTFOUND || rc == STRATA_EFORMAT) {
        char why[512];
        snprintf(why, sizeof why, "%s", strata_last_error());
        if (check_tensors(opt, &role, report) == 0) strata_set_error(rc, "%s", why);
    }
    return rc;
}

/* Stage 0's draft model: the whole of it, beside the stage's backend. */
static int open_draft(struct stage_backend **out, const struct stage_open_options *opt) {
    const struct model_config *cfg = opt->draft_cfg;
    struct stage_backend_options bo = {
        .cfg = cfg,
        .weights = opt->draft_weights,
        .role = {.layer_start = 0, .layer_end = cfg->num_layers, .with_embed = 1, .with_head = 1},
        .device = opt->device,
        .num_threads = opt->num_threads,
        .max_seq = opt->max_seq,
        .num_slots = opt->max_batch,
        .kv_dtype = opt->kv_dtype};
    int rc = stage_backend_open(out, &bo);
    return rc < 0 ? strata_wrap_error(rc, "the draft model") : 0;
}

int stage_open(struct stage *out, const struct stage_open_options *opt,
               struct stage_tensor_list *report) {
    memset(out, 0, sizeof *out);
    int rc = open_backend(&out->backend, opt, report, 0);
    if (rc == 0 && opt->draft_cfg && opt->stage_index == 0) {
        if (!opt->draft_weights)
            rc = strata_set_error(STRATA_EINVAL, "a draft model needs its weights");
        else
            rc = open_draft(&out->draft, opt);
    }
    if (rc == 0)
        rc = stage_core_init(&out->core,
                             &(struct stage_core_options){.backend = out->backend,
                                                          .stage_index = opt->stage_index,
                                                          .num_stages = opt->num_stages,
                                                          .chunk_size = opt->chunk_size,
                                                          .max_batch_tokens = opt->max_batch_tokens,
                                                          .keep_logits = opt->keep_logits,
                                                          .send_kv = opt->send_kv,
                                                          .speculate = opt->speculate,
                                                          .speculate_k = opt->speculate_k,
                                                          .speculate_waves = opt->speculate_waves,
                                                          .oracle = opt->oracle,
                                                          .draft = out->draft,
                                                          .now_sec = opt->now_sec});
    if (rc == 0) /* what a ring describe lists beyond the backend's role and device */
        stage_core_set_describe(out->core, opt->tp ? opt->tp->tp : 1, opt->tp ? opt->tp->kvp : 1,
                                opt->num_threads, opt->weights_dtype);
    if (rc < 0) stage_close(out);
    return rc;
}

int stage_open_follower(struct stage_backend **out, const struct stage_open_options *opt,
                        struct stage_tensor_list *report) {
    return open_backend(out, opt, report, 1);
}

void stage_close(struct stage *stage) {
    if (!stage) return;
    stage_core_free(stage->core);
    stage_backend_free(stage->draft);
    stage_backend_free(stage->backend);
    memset(stage, 0, sizeof *stage);
}
