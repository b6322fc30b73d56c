/* Every golden case (tests/golden) through one stage backend (runtime/stage/backend.h),
 * named by the first argument ("cpu", "cuda:0"): the same path a stage takes, so what this
 * checks holds for every backend that opens here.
 *
 * Per case, on backends covering [0, L):
 *   - prefill the prompt (Qwen3-VL: image pad rows replaced by the recorded merger outputs,
 *     HF's M-RoPE positions, the recorded DeepStack features) and decode teacher-forced
 *     with the golden ids: ids equal transformers' and max |dlogit| <= 1e-3;
 *   - the same run split over two backends [0, k) + [k, L) for every k: bit-identical;
 *   - the KV handed over after the prefill (kv_pack on the backend, kv_restore into a
 *     freshly opened one that then decodes): bit-identical;
 *   - on a device other than cpu, a mixed pipeline cpu [0, 1) -> device [1, L-1) ->
 *     cpu [L-1, L) in one process: the golden ids and max |dlogit| <= 1e-3 (not bitwise:
 *     the backends' exp / rsqrt differ in the last bits);
 *   - at every step, the last stage's greedy ids (stage_backend_argmax: on the device
 *     where the backend has one) equal argmax of its logits;
 *   - every open reports its load progress monotonically up to the total (progress.h);
 *   - speculative steps: after the prefill, steps of three rows (the fed golden id, the next
 *     golden id as a right draft, a wrong draft), then the wrong row's KV dropped
 *     (stage_backend_kv_truncate) and the next step written over it: the first two rows'
 *     logits equal the solo run's two steps bit for bit;
 *   - batched: the golden request prefilled and decoded together with a second request in
 *     one backend (two items per forward: a decode graph of 2 on a CUDA backend) gives its
 *     solo logits bit for bit;
 *   - the KV pool under a budget (the first case): its counts as reference/kv_blocks.h
 *     keeps them through reservations, growth and releases, reservations the pool cannot
 *     keep refused, and the golden request decoding into blocks another request held
 *     (its block table out of order) bit for bit as its solo run.
 * A CUDA backend runs decode steps as CUDA graphs unless STRATA_CUDA_GRAPHS=0 (a second
 * argument --no-graphs sets it): with graphs on, every case must have launched some (its
 * backends' describe lines count them; MoE cases included: a role that fell back
 * to eager steps fails), with them off none.
 * `--kv-dtype f16` opens every backend with a cache of f16 elements (the stages' default)
 * instead of f32: everything above holds as stated (splits, handovers, batching bit for bit)
 * but the logits' bound against transformers, which is tests/reference:kv_dtype_golden_test's
 * for f16 (measured 0.012); the greedy ids must still be the golden ones.
 * A device this build or machine cannot open prints "skipped: <device>: <reason>".
 *
 * `--grid T,K` (repeatable) instead runs every case on one stage [0, L) split over T TP x
 * K KVP ranks, each rank a thread with its own backend (rank r on device "cuda:r" for a CUDA
 * device, NCCL taking one rank per device) in one wire group (wire/collective over shared
 * memory), and checks that every rank's logits and greedy ids equal one rank's on the same
 * device bit for bit (TP and KVP change no bit; the greedy ids under TP from the
 * vocab-parallel argmax), and on a CUDA device that every rank launched as many decode graphs
 * as the one rank (its collectives captured in them; none with --no-graphs), each graph
 * instantiated once; MoE layers split by whole experts (--moe expert). A degree a case's
 * shapes cannot take is skipped with tp_check's reason. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/tp_shard.h"
#include "runtime/stage/backend.h"
#include "tests/backend_ops/golden_backends.h"
#include "tests/reference/golden_case.h"
#include "tests/test_util.h"
#include "wire/collective.h"

#define LOGIT_TOLERANCE 1e-3
#define LOGIT_TOLERANCE_F16 0.03 /* kv_dtype_golden_test's bound for an f16 cache */

const char *device;
static int no_graphs;              /* --no-graphs: STRATA_CUDA_GRAPHS=0 */
static int graphs_expected;        /* a CUDA device with graphs on: every case must launch some */
enum ops_dtype kv_dtype = OPS_F32; /* --kv-dtype: what every backend's cache stores */
/* Per thread (a --grid rank is a thread): summed over its backends' describe lines. */
static _Thread_local long graph_launches;
static _Thread_local long moe_graph_launches; /* those of backends holding a MoE layer */
static _Thread_local long graph_reinstants;   /* instantiations beyond one per backend */
static atomic_int argmax_mismatches;          /* stage_backend_argmax != argmax(logits) */
/* --grid: this thread's place in the stage's group (NULL: one rank) and its device. */
static _Thread_local const struct stage_tp_config *rank_tp;
static _Thread_local const char *rank_device;
/* When set, run_case records each step's greedy id (stage_backend_argmax) here [n_steps]. */
static _Thread_local int32_t *rank_ids;
/* The KV budget open_on gives (backend.h kv_memory; 0: every slot at max_seq). */
_Thread_local size_t open_kv_memory;

/* Adds the graph launches a backend reports. Every backend here decodes at one batch size
 * only, so its graph must be instantiated once and then updated in place at every step: more
 * instantiations mean cudaGraphExecUpdate keeps failing (a slow path, counted as an error). */
void count_graphs(const struct stage_backend *be) {
    struct stage_backend_info info;
    stage_backend_info(be, &info);
    if (!info.graphs) return;
    graph_launches += info.graph_launches;
    for (int l = be->role.layer_start; l < be->role.layer_end; ++l)
        if (model_config_layer_is_moe(be->cfg, l)) {
            moe_graph_launches += info.graph_launches;
            break;
        }
    if (info.graph_instantiations > 1) graph_reinstants += info.graph_instantiations - 1;
}

/* Every open reports its load progress (runtime/base/progress.h): one total, done bytes
 * that never go back or past it, the last report at the total. */
struct progress_seen {
    int calls, broken;
    uint64_t total, last;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total, const char *phase) {
    struct progress_seen *s = ctx;
    if ((s->calls > 0 && (total != s->total || done < s->last)) || done > total || !phase)
        s->broken++;
    s->total = total;
    s->last = done;
    s->calls++;
}

/* Max |dlogit| against transformers' fp32 logits for the cache's dtype. */
static double logit_tolerance(void) {
    return kv_dtype == OPS_F16 ? LOGIT_TOLERANCE_F16 : LOGIT_TOLERANCE;
}

int open_on(struct stage_backend **be, const char *dev, const struct golden_case *gc, int start,
            int end, int max_seq) {
    struct progress_seen seen = {0};
    struct stage_backend_options o = {.cfg = &gc->cfg,
                                      .weights = gc->st,
                                      .role = {.layer_start = start,
                                               .layer_end = end,
                                               .with_embed = start == 0,
                                               .with_head = end == gc->cfg.num_layers},
                                      .device = rank_device ? rank_device : dev,
                                      .num_threads = 2,
                                      .max_seq = max_seq,
                                      .num_slots = 2,
                                      .kv_memory = open_kv_memory,
                                      .kv_dtype = kv_dtype,
                                      .tp = rank_tp,
                                      .progress = {on_progress, &seen}};
    int rc = stage_backend_open(be, &o);
    if (rc == 0 && (seen.calls < 2 || seen.broken || seen.last != seen.total || !seen.total))
        rc = strata_set_error(STRATA_EINVAL,
                              "load progress on %s [%d, %d): %d reports (%d broken), ended at "
                              "%llu of %llu bytes",
                              dev, start, end, seen.calls, seen.broken,
                              (unsigned long long)seen.last, (unsigned long long)seen.total);
    return rc;
}

int prefill_inputs(struct prefill *p, const struct golden_case *gc, struct stage_backend *first) {
    int S = gc->n_prompt, H = gc->cfg.hidden_size;
    memset(p, 0, sizeof *p);
    p->hidden = calloc((size_t)S * H, sizeof(float));
    if (!p->hidden) return strata_set_error(STRATA_ENOMEM, "out of memory");
    int rc = stage_backend_embed(first, p->hidden, gc->prompt, S);
    p->item = (struct forward_item){.slot = 0, .pos = 0, .n_tokens = S};
    if (rc < 0 || !gc->has_vision) return rc;
    p->deepstack = calloc((size_t)gc->num_deepstack * S * H, sizeof(float));
    p->visual = calloc((size_t)S, 1);
    if (!p->deepstack || !p->visual) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int i = 0, v = 0; i < S; ++i) {
        if (gc->prompt[i] != gc->image_token_id) continue;
        p->visual[i] = 1;
        memcpy(p->hidden + (size_t)i * H, gc->vision_embeds + (size_t)v * H, sizeof(float) * H);
        for (int k = 0; k < gc->num_deepstack; ++k)
            memcpy(p->deepstack + ((size_t)k * S + i) * H,
                   gc->deepstack + ((size_t)k * gc->n_visual + v) * H, sizeof(float) * H);
        v++;
    }
    p->item.mrope_positions = gc->position_ids;
    p->item.deepstack = p->deepstack;
    p->item.visual_mask = p->visual;
    p->item.num_deepstack = gc->num_deepstack;
    return 0;
}

/* Replaces each backend by a fresh one holding its KV (pack -> restore). */
static int hand_over_kv(struct stage_backend **be, const char *const *devices, int n_stages,
                        const struct golden_case *gc, int max_seq) {
    for (int s = 0; s < n_stages; ++s) {
        struct stage_backend *fresh = NULL;
        struct kv_handoff kv;
        int slot = 0, rc = stage_backend_kv_pack(be[s], &kv, &slot, 1);
        if (rc == 0)
            rc = open_on(&fresh, devices[s], gc, be[s]->role.layer_start, be[s]->role.layer_end,
                         max_seq);
        if (rc == 0) rc = stage_backend_kv_acquire(fresh, &slot);
        if (rc == 0) rc = stage_backend_kv_restore(fresh, &slot, 1, &kv);
        kv_handoff_free(&kv);
        if (rc < 0) {
            stage_backend_free(fresh);
            return rc;
        }
        stage_backend_free(be[s]);
        be[s] = fresh;
    }
    return 0;
}

/* Decodes one step (teacher-forced) through every stage; logits of the last row, and its
 * greedy id from stage_backend_argmax checked against them (`scratch` [V]) and stored in
 * *id_out when given. */
static int step_through(struct stage_backend **be, int n_stages, float *hidden,
                        const struct forward_item *item, float *logits, float *scratch, int H,
                        int32_t *id_out) {
    int rc = 0, V = be[0]->cfg->vocab_size;
    int32_t id = -1;
    const float *last = hidden + (size_t)(item->n_tokens - 1) * H;
    for (int s = 0; s < n_stages && rc == 0; ++s)
        rc = stage_backend_forward(be[s], hidden, item, 1);
    if (rc == 0) rc = stage_backend_logits(be[n_stages - 1], logits, last, 1);
    if (rc == 0) rc = stage_backend_argmax(be[n_stages - 1], &id, last, 1, scratch);
    if (rc == 0 && id != argmax(logits, V)) atomic_fetch_add(&argmax_mismatches, 1);
    if (id_out) *id_out = id;
    return rc;
}

/* Logits [n_steps, V] of the golden stream over stages `bounds`; NULL on failure (message
 * set). With `handover`, the KV moves to fresh backends after the prefill. */
static float *run_case(const struct golden_case *gc, const int *bounds, const char *const *devices,
                       int n_stages, int handover) {
    int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    int max_seq = S + gc->n_steps, slot, rc = 0;
    struct stage_backend *be[MAX_STAGES] = {0};
    struct prefill p;
    int32_t mrope[3];
    float *logits = calloc((size_t)gc->n_steps * V, sizeof(float));
    float *scratch = calloc((size_t)V, sizeof(float));
    memset(&p, 0, sizeof p);
    if (!scratch) rc = STRATA_ENOMEM;
    for (int s = 0; s < n_stages && rc == 0; ++s) {
        rc = open_on(&be[s], devices[s], gc, bounds[s], bounds[s + 1], max_seq);
        if (rc == 0) rc = stage_backend_kv_acquire(be[s], &slot);
    }
    if (rc == 0) rc = logits ? prefill_inputs(&p, gc, be[0]) : STRATA_ENOMEM;
    struct forward_item item = p.item;
    for (int step = 0; rc == 0 && step < gc->n_steps; ++step) {
        if (step) {
            int32_t token = gc->generated[step - 1];
            item = (struct forward_item){.slot = 0, .pos = S + step - 1, .n_tokens = 1};
            if (gc->has_vision) {
                mrope[0] = mrope[1] = mrope[2] = item.pos + gc->rope_delta;
                item.mrope_positions = mrope;
            }
            rc = stage_backend_embed(be[0], p.hidden, &token, 1);
        }
        if (rc == 0)
            rc = step_through(be, n_stages, p.hidden, &item, logits + (size_t)step * V, scratch, H,
                              rank_ids ? &rank_ids[step] : NULL);
        if (rc == 0 && step == 0 && handover) rc = hand_over_kv(be, devices, n_stages, gc, max_seq);
    }
    for (int s = 0; s < n_stages; ++s) {
        if (be[s]) count_graphs(be[s]);
        stage_backend_free(be[s]);
    }
    free(scratch);
    free(p.hidden);
    free(p.deepstack);
    free(p.visual);
    if (rc < 0) {
        free(logits);
        return NULL;
    }
    return logits;
}

/* cpu [0, 1) -> device [1, L-1) -> cpu [L-1, L): the golden ids and logits within the
 * tolerance; 0 when it holds, else 1 with a line. */
static int check_mixed(const struct golden_case *gc, const char *name) {
    int L = gc->cfg.num_layers, V = gc->cfg.vocab_size, bounds[4] = {0, 1, L - 1, L}, bad = 0;
    const char *const devices[MAX_STAGES] = {"cpu", device, "cpu"};
    double max_delta = 0.0;
    float *logits = run_case(gc, bounds, devices, 3, 1);
    if (!logits) {
        printf("  %s: cpu -> %s -> cpu: %s\n", name, device, strata_last_error());
        return 1;
    }
    for (int step = 0; step < gc->n_steps; ++step) {
        const float *got = logits + (size_t)step * V, *want = gc->logits + (size_t)step * V;
        for (int v = 0; v < V; ++v)
            max_delta = fmax(max_delta, fabs((double)got[v] - (double)want[v]));
        bad += argmax(got, V) != gc->generated[step];
    }
    free(logits);
    if (bad || max_delta > logit_tolerance()) {
        printf("  %s: cpu -> %s -> cpu (KV handed over): %d id(s) differ, max |dlogit| = %.3g\n",
               name, device, bad, max_delta);
        return 1;
    }
    printf("  %s: cpu -> %s -> cpu (KV handed over): golden ids, max |dlogit| = %.3g\n", name,
           device, max_delta);
    return 0;
}

/* ---- --grid T,K: one stage over T x K ranks (threads) against one rank ---------------- */

#define MAX_RANKS 8

struct grid_rank {
    const struct golden_case *gc;
    long graph_launches, graph_reinstants;
    struct stage_tp_config tp;
    const char *shm_name;
    char device[16];
    float *logits; /* [n_steps, V] or NULL */
    int32_t *ids;  /* [n_steps] greedy ids (stage_backend_argmax) */
    char error[600];
};

static void *grid_rank_main(void *arg) {
    struct grid_rank *r = arg;
    int size = (r->tp.tp > 1 ? r->tp.tp : 1) * (r->tp.kvp > 1 ? r->tp.kvp : 1);
    struct coll_options o = {.rank = r->tp.kvp_rank * (r->tp.tp > 1 ? r->tp.tp : 1) + r->tp.tp_rank,
                             .size = size,
                             .group = "golden.grid",
                             .timeout_ms = 120000,
                             .shm_name = r->shm_name};
    int whole[2] = {0, r->gc->cfg.num_layers};
    const char *const devices[MAX_STAGES] = {device, device, device};
    if (coll_open_shm(&r->tp.coll, &o)) {
        snprintf(r->error, sizeof r->error, "coll_open_shm: %s", strata_last_error());
        return NULL;
    }
    rank_tp = &r->tp;
    rank_device = strncmp(device, "cuda", 4) == 0 ? r->device : NULL;
    rank_ids = r->ids;
    r->logits = run_case(r->gc, whole, devices, 1, 0);
    if (!r->logits) snprintf(r->error, sizeof r->error, "%s", strata_last_error());
    r->graph_launches = graph_launches;
    r->graph_reinstants = graph_reinstants;
    coll_close(r->tp.coll);
    return NULL;
}

/* KV positions per KVP rank: ceil(max_seq / K) rounded up to 16 x a power of two. */
static int kvp_tokens_for(int max_seq, int K) {
    int want = (max_seq + K - 1) / K, tokens = 16;
    while (tokens < want)
        tokens *= 2;
    return tokens;
}

/* 0 when every rank of the T x K grid gives `solo` bit for bit and the greedy ids `solo_ids`
 * (under TP from the vocab-parallel argmax, the logits never assembled) and, on a CUDA
 * device, launched as many decode graphs as the one rank did (`solo_graphs`: captured with
 * the step's collectives; none with --no-graphs), each instantiated once; one line either
 * way. */
static int check_grid(const struct golden_case *gc, const char *name, const float *solo,
                      const int32_t *solo_ids, long solo_graphs, int T, int K) {
    static int counter;
    int size = T * K, bad = 0, max_seq = gc->n_prompt + gc->n_steps;
    size_t bytes = sizeof(float) * (size_t)gc->n_steps * gc->cfg.vocab_size;
    char shm[64];
    snprintf(shm, sizeof shm, "/strata-golden-grid-%d-%d", (int)getpid(), counter++);
    pthread_t th[MAX_RANKS];
    struct grid_rank r[MAX_RANKS];
    for (int g = 0; g < size; ++g) {
        r[g] = (struct grid_rank){.gc = gc, .shm_name = shm};
        r[g].ids = calloc((size_t)gc->n_steps, sizeof(int32_t));
        r[g].tp = (struct stage_tp_config){.tp = T,
                                           .tp_rank = g % T,
                                           .kvp = K,
                                           .kvp_rank = g / T,
                                           .kvp_tokens = K > 1 ? kvp_tokens_for(max_seq, K) : 0};
        snprintf(r[g].device, sizeof r[g].device, "cuda:%d", g);
        if (pthread_create(&th[g], NULL, grid_rank_main, &r[g])) {
            printf("FAIL %s: cannot start rank %d\n", name, g);
            for (int k = 0; k < g; ++k)
                pthread_join(th[k], NULL);
            return 1;
        }
    }
    for (int g = 0; g < size; ++g)
        pthread_join(th[g], NULL);
    for (int g = 0; g < size; ++g) {
        int ids_differ =
            r[g].logits && (!r[g].ids || memcmp(r[g].ids, solo_ids, sizeof(int32_t) * gc->n_steps));
        if (!r[g].logits)
            printf("  %s: TP %d x KVP %d rank %d: %s\n", name, T, K, g, r[g].error);
        else if (ids_differ)
            printf("  %s: TP %d x KVP %d rank %d: greedy ids differ from one rank's\n", name, T, K,
                   g);
        else if (memcmp(r[g].logits, solo, bytes)) {
            double worst = 0.0;
            for (size_t v = 0; v < bytes / sizeof(float); ++v)
                worst = fmax(worst, fabs((double)r[g].logits[v] - (double)solo[v]));
            printf("  %s: TP %d x KVP %d rank %d: logits differ from one rank's (max |d| %.3g)\n",
                   name, T, K, g, worst);
        }
        int graphs_differ =
            r[g].logits && (r[g].graph_launches != solo_graphs || r[g].graph_reinstants != 0);
        if (graphs_differ)
            printf("  %s: TP %d x KVP %d rank %d: %ld decode graphs launched (one rank: %ld), %ld "
                   "instantiated again\n",
                   name, T, K, g, r[g].graph_launches, solo_graphs, r[g].graph_reinstants);
        bad += !r[g].logits || memcmp(r[g].logits, solo, bytes) || ids_differ || graphs_differ;
        free(r[g].logits);
        free(r[g].ids);
    }
    printf("%s %-18s on %s: TP %d x KVP %d (%s): logits and greedy ids %s one rank's, %ld "
           "decode graphs per rank\n",
           bad ? "FAIL" : "ok  ", name, device, T, K, K > 1 ? "KV split" : "whole KV",
           bad ? "differ from" : "bit-identical to", solo_graphs);
    return bad != 0;
}

/* The case on one rank, then on every grid of `grids` [n][2]. */
static int check_case_grids(const char *name, const int (*grids)[2], int n_grids) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) {
        printf("FAIL %s: %s\n", name, strata_last_error());
        return 1;
    }
    int whole[2] = {0, gc.cfg.num_layers}, failures = 0;
    const char *const same[MAX_STAGES] = {device, device, device};
    int32_t *solo_ids = calloc((size_t)gc.n_steps, sizeof(int32_t));
    const long launches_before = graph_launches;
    rank_ids = solo_ids;
    float *solo = solo_ids ? run_case(&gc, whole, same, 1, 0) : NULL;
    rank_ids = NULL;
    const long solo_graphs = graph_launches - launches_before;
    if (!solo) {
        free(solo_ids);
        printf("FAIL %s on %s: %s\n", name, device, strata_last_error());
        golden_case_close(&gc);
        return 1;
    }
    for (int i = 0; i < n_grids; ++i) {
        if (grids[i][0] > 1 && tp_check(&gc.cfg, grids[i][0], TP_MOE_EXPERT_PARALLEL)) {
            printf("skip %-18s on %s: TP %d x KVP %d: %s\n", name, device, grids[i][0], grids[i][1],
                   strata_last_error());
            continue;
        }
        failures += check_grid(&gc, name, solo, solo_ids, solo_graphs, grids[i][0], grids[i][1]);
    }
    free(solo);
    free(solo_ids);
    golden_case_close(&gc);
    return failures;
}

/* 0 when the case holds on this backend; prints one line either way. */
static int check_case(const char *name) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) {
        printf("FAIL %s: %s\n", name, strata_last_error());
        return 1;
    }
    int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, whole[2] = {0, L}, failures = 0;
    size_t bytes = sizeof(float) * (size_t)gc.n_steps * V;
    double max_delta = 0.0;
    const long launches_before = graph_launches, moe_before = moe_graph_launches;
    const char *const same[MAX_STAGES] = {device, device, device};
    float *logits = run_case(&gc, whole, same, 1, 0);
    if (!logits) {
        printf("FAIL %s on %s: %s\n", name, device, strata_last_error());
        golden_case_close(&gc);
        return 1;
    }
    for (int step = 0; step < gc.n_steps; ++step) {
        const float *got = logits + (size_t)step * V, *want = gc.logits + (size_t)step * V;
        for (int v = 0; v < V; ++v)
            max_delta = fmax(max_delta, fabs((double)got[v] - (double)want[v]));
        failures += argmax(got, V) != gc.generated[step];
    }
    failures += max_delta > logit_tolerance();
    for (int k = 1; k < L; ++k) {
        int split[3] = {0, k, L};
        float *parts = run_case(&gc, split, same, 2, k == L / 2);
        if (!parts || memcmp(parts, logits, bytes)) {
            printf("  %s: split at %d%s differs: %s\n", name, k,
                   k == L / 2 ? " with KV handover" : "", parts ? "logits" : strata_last_error());
            failures++;
        }
        free(parts);
    }
    failures += check_batched(&gc, name, logits);
    failures += check_speculative(&gc, name, logits);
    if (strcmp(name, golden_case_names[0]) == 0) failures += check_kv_pool(&gc, name, logits);
    failures += check_answer_reuse(&gc, name, logits);
    if (strcmp(device, "cpu") != 0 && L >= 3) failures += check_mixed(&gc, name);
    if (graphs_expected && graph_launches == launches_before) {
        printf("  %s: no decode graph launched (every step ran eagerly)\n", name);
        failures++;
    }
    if (graphs_expected && gc.cfg.num_experts > 0 && moe_graph_launches == moe_before) {
        printf("  %s: no decode graph launched by a backend holding a MoE layer\n", name);
        failures++;
    }
    printf("%s %-18s on %s: %d steps, max |dlogit| = %.3g, ids %s, splits k=1..%d %s, %ld "
           "decode graph launches (%ld with a MoE layer)\n",
           failures ? "FAIL" : "ok  ", name, device, gc.n_steps, max_delta,
           failures ? "checked" : "identical", L - 1, failures ? "checked" : "bit-identical",
           graph_launches - launches_before, moe_graph_launches - moe_before);
    free(logits);
    golden_case_close(&gc);
    return failures != 0;
}

int main(int argc, char **argv) {
    struct golden_case probe;
    struct stage_backend *be = NULL;
    int failed = 0, grids[MAX_RANKS][2], n_grids = 0, ranks = 1;
    device = argc > 1 ? argv[1] : "cpu";
    /* STRATA_CUDA_GRAPHS=0 set by hand (a device session's workaround) is --no-graphs. */
    const char *graphs_env = getenv("STRATA_CUDA_GRAPHS");
    no_graphs = (argc > 2 && strcmp(argv[2], "--no-graphs") == 0) ||
                (graphs_env && strcmp(graphs_env, "0") == 0);
    if (no_graphs) setenv("STRATA_CUDA_GRAPHS", "0", 1);
    graphs_expected = !no_graphs && strncmp(device, "cuda", 4) == 0;
    for (int i = 2; i < argc; ++i) {
        if (strcmp(argv[i], "--kv-dtype") != 0) continue;
        /* f32 or f16 only: bf16 flips MoE ids (kv_dtype_golden_test measures it), so the
         * golden ids this harness requires are not bf16's to keep. */
        if (i + 1 < argc && strcmp(argv[i + 1], "f16") == 0) {
            kv_dtype = OPS_F16;
        } else if (i + 1 >= argc || strcmp(argv[i + 1], "f32") != 0) {
            printf("usage: %s DEVICE [--kv-dtype f32|f16] ...\n", argv[0]);
            return 2;
        }
    }
    for (int i = 2; i + 1 < argc && n_grids < MAX_RANKS; ++i)
        if (strcmp(argv[i], "--grid") == 0) {
            int T = 0, K = 0;
            if (sscanf(argv[++i], "%d,%d", &T, &K) != 2 || T < 1 || K < 1 || T * K > MAX_RANKS) {
                printf("usage: %s DEVICE [--no-graphs] [--grid T,K ...] (T x K <= %d)\n", argv[0],
                       MAX_RANKS);
                return 2;
            }
            grids[n_grids][0] = T;
            grids[n_grids++][1] = K;
            if (T * K > ranks) ranks = T * K;
        }
    if (golden_case_open(&probe, golden_case_names[0])) {
        printf("FAIL: %s\n", strata_last_error());
        return 1;
    }
    char last[16];
    snprintf(last, sizeof last, "cuda:%d", ranks - 1); /* a grid's CUDA ranks: one device each */
    const char *probe_device = n_grids && strncmp(device, "cuda", 4) == 0 ? last : device;
    if (open_on(&be, probe_device, &probe, 0, probe.cfg.num_layers, 8) == STRATA_EDEVICE) {
        char reason[600];
        snprintf(reason, sizeof reason, "%s: %s%s", probe_device, strata_last_error(),
                 n_grids ? " (a TP / KVP grid needs one CUDA device per rank)" : "");
        golden_case_close(&probe);
        test_skip_all(reason);
        return 0;
    }
    stage_backend_free(be);
    golden_case_close(&probe);
    if (n_grids) {
        for (int i = 0; golden_case_names[i]; ++i)
            failed += check_case_grids(golden_case_names[i], (const int(*)[2])grids, n_grids);
        if (argmax_mismatches)
            printf("FAIL: stage_backend_argmax differs from argmax of the logits %d time(s)\n",
                   (int)argmax_mismatches);
        failed += argmax_mismatches != 0;
        if (strncmp(device, "cuda", 4) == 0) { /* the one-rank runs, on this thread */
            int bad = no_graphs ? graph_launches != 0 : graph_launches == 0 || graph_reinstants;
            printf("%s decode graphs %s: %ld launched by the one-rank runs, %ld instantiated "
                   "again\n",
                   bad ? "FAIL" : "ok  ", no_graphs ? "off" : "on", graph_launches,
                   graph_reinstants);
            failed += bad;
        }
        printf("%s grids: %d golden case(s) failed\n", device, failed);
        return failed ? 1 : 0;
    }
    for (int i = 0; golden_case_names[i]; ++i)
        failed += check_case(golden_case_names[i]);
    if (argmax_mismatches) {
        printf("FAIL: stage_backend_argmax differs from argmax of the logits %d time(s)\n",
               (int)argmax_mismatches);
        failed++;
    }
    if (strncmp(device, "cuda", 4) == 0) {
        int bad = no_graphs ? graph_launches != 0 : graph_launches == 0 || graph_reinstants;
        printf("%s decode graphs %s: %ld launched, %ld instantiated again after an update "
               "failed\n",
               bad ? "FAIL" : "ok  ", no_graphs ? "off" : "on", graph_launches, graph_reinstants);
        failed += bad;
    }
    printf("%s: %d golden case(s) failed\n", device, failed);
    return failed ? 1 : 0;
}
