/* strata-plan --predict: the performance model's report for a plan (runtime/model/perf_model.h):
 * per stage, the weights a decode step reads and its time at batch 1 and B, a prefill chunk's
 * time; for the pipeline, tokens/s at batch 1 and B, time to first token, the bottleneck. */
#ifndef STRATA_RUNTIME_STRATA_PLAN_PREDICT_H
#define STRATA_RUNTIME_STRATA_PLAN_PREDICT_H

#include "runtime/model/model_config.h"
#include "runtime/model/perf_model.h"
#include "runtime/model/perf_place.h"
#include "runtime/model/stage_plan.h"

struct plan_predict_args {
    const char *profiles; /* FILE or FILE,FILE,... (one per stage) */
    struct perf_link link;
    struct perf_options opt;
    int json;
    const char *hosts;   /* --hosts FILE: choose the placement */
    enum perf_goal goal; /* --goal latency | throughput */
    int link_given;      /* --link-latency-us, --link-gbps or --link given: they override the hosts
                            file's link */
    int tp;              /* --tp: every stage a TP group of that many devices (default link) */
    int max_seq;         /* --max-seq: a KV-parallel rank's positions follow from it */
    int kvp, kvp_tokens; /* --kvp: each TP rank KV parallel over that many devices */
};

/* Prints the prediction for `plan` (text, or JSON with --json); an exit code. */
int plan_print_prediction(const struct model_config *cfg, const struct stage_plan *plan,
                          const struct plan_predict_args *pa);

/* --hosts: the best placement over the hosts file's boxes for the goal, its stages as
 * strata-stage command lines, and the prediction beside the even and memory-proportional plans
 * over all the hosts in the file's order; an exit code. */
int plan_print_placement(const struct model_config *cfg, const struct stage_memory_model *mm,
                         const char *model_dir, const struct plan_predict_args *pa);

#endif
