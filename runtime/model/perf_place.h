/* Placement over unequal boxes: which hosts run stages, in which order, with which layers, under
 * their memory, for the fastest decode by the performance model (perf_model.h).
 *
 * Hosts file (JSON; profile paths relative to the file):
 *   {"hosts": [{"name": "a", "profile": "a.json", "mem": "80G", "threads": 16}, ...],
 *    "link": {"latency_us": 200, "gbps": 10},
 *    "links": [{"between": ["a", "c"], "latency_us": 20000, "gbps": 0.1}, ...]}
 * "link" is every pair's link (gbps: gigabytes per second), "links" the pairs whose link
 * differs, both ways: the stage order decides which links the ring's hops cross, so the search
 * weighs them. A link may be {"probe": "FILE"} instead: FILE (relative to the hosts file) as
 * strata-stage --probe-links or strata-stage-bench probe-link wrote it.
 * A host may hold several devices of its profile: "devices": 2, 4 or 8 makes its stage one TP
 * group over them (strata-stage --tp), "mem" then being each device's, and "device_link":
 * {"latency_us": 10, "gbps": 300} the link its all-reduces cross (else perf_device_set_tp's
 * estimate). The search then also chooses how the devices split the stage: TP t x KVP k with
 * t k = devices (perf_host.choice: the factorings the model's shapes allow, which the caller
 * lists), per stage, the one that fits its layers and is fastest for the goal (KVP holds a
 * rank's weights on each of its devices but splits the KV by positions: it wins where KV
 * fills the memory or a long context's attention the step).
 * `mem` (K/M/G/T sizes) overrides the profile's memory; `threads`, when it differs from the
 * profile's, scales its matmul and attention rates linearly (the streaming rate too, up to the
 * read bandwidth) — an estimate: calibrate at the thread count that will run when you can.
 * `cpus` (a CPU list, "0-31") goes into the host's command line as strata-stage --cpus: one
 * socket of a two-socket box, say, where the stage's memory is (calibrate with the same
 * --cpus); it needs at least as many CPUs as the stage's threads.
 *
 * The search is exact where the space is small: every ordered subset of at most
 * PERF_PLACE_EXACT_HOSTS hosts (a box may stay idle: a slow one costs more than it adds), and
 * for each the dynamic program over contiguous layer splits whose stages fit their hosts'
 * memory (weights + KV + workspace, stage_plan.h's accounting). Goal latency minimises one
 * token's time at batch 1 (every stage's step plus the hops); goal throughput minimises the
 * slowest stage's step at the batch's rows per stage (the pipeline's pace), then the latency.
 * With more hosts only their given order is searched (all of them, then each prefix). */
#ifndef STRATA_RUNTIME_MODEL_PERF_PLACE_H
#define STRATA_RUNTIME_MODEL_PERF_PLACE_H

#include "runtime/model/perf_model.h"
#include "runtime/model/stage_plan.h"

#define PERF_MAX_HOSTS 64
#define PERF_PLACE_EXACT_HOSTS 6

#define PERF_MAX_CHOICES 4 /* TP x KVP factorings of 8 devices */

struct perf_host {
    char name[64];
    char cpus[128];         /* "cpus" as given (checked), or "" */
    struct perf_device dev; /* mem and threads overrides applied */
    uint64_t mem_bytes;
    /* The TP x KVP groups its devices may form (dev's tp and kvp set: perf_device_set_tp,
     * perf_device_set_kvp); none: dev as it is. */
    int n_choices;
    struct perf_device choice[PERF_MAX_CHOICES];
};

#define PERF_MAX_PAIRS 256

struct perf_hosts {
    int n;
    struct perf_host host[PERF_MAX_HOSTS];
    struct perf_link link; /* between any two hosts ... */
    int n_pairs;           /* ... but these (either way) */
    struct perf_pair {
        int a, b;
        struct perf_link link;
    } pair[PERF_MAX_PAIRS];
};

/* Reads the hosts file and every profile it names. STRATA_EFORMAT names the bad field. */
int perf_hosts_load(struct perf_hosts *h, const char *path);

/* The link between hosts a and b (indices into h->host). */
const struct perf_link *perf_hosts_link(const struct perf_hosts *h, int a, int b);

/* The links of a ring over hosts order [S]: hop s from order[s] to order[s + 1], the last
 * back to order[0] (perf_predict_hops' hops). */
void perf_hosts_ring(struct perf_link *hops, const struct perf_hosts *h, const int *order, int S);

enum perf_goal { PERF_GOAL_LATENCY = 0, PERF_GOAL_THROUGHPUT = 1 };

struct perf_placement {
    int num_stages;
    int host[STAGE_PLAN_MAX_STAGES]; /* index into the hosts file, stage order */
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    uint64_t stage_bytes[STAGE_PLAN_MAX_STAGES];   /* memory each stage needs per device */
    struct perf_device dev[STAGE_PLAN_MAX_STAGES]; /* what runs each stage (its TP x KVP) */
    struct perf_prediction pred;
    double orders_tried;
};

/* The best placement for `goal`, or STRATA_ERANGE when no ordered subset of hosts can hold the
 * model (the message says how much it needs). */
int perf_place(struct perf_placement *out, const struct perf_layers *pl,
               const struct stage_memory_model *mm, const struct perf_hosts *h,
               const struct perf_options *opt, enum perf_goal goal);

/* What one device of a stage holds (its TP rank's share when d is a TP group: the weights and,
 * while there are as many KV heads as ranks, the KV split; of that KV its KVP rank's positions;
 * the whole workspace). */
uint64_t perf_place_rank_bytes(const struct stage_plan_entry *e, const struct perf_device *d,
                               int kv_heads);

/* Each stage's memory for given ranges (checks nothing): per device of what runs it when
 * `devs` [S] is given, else the whole stage's. */
void perf_place_memory(uint64_t *bytes, const struct stage_memory_model *mm,
                       const struct perf_device *devs, const struct stage_range *ranges,
                       int num_stages, int kv_heads);

#endif
