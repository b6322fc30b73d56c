/* strata-bench-kvp (`./strata bench kvp`): decode latency per token of one
 * request at long contexts with KV parallelism (Medha) degree 1, 2 and 4, on the
 * Qwen3-0.6B-shaped random checkpoint. A benchmark, not a test: nothing is asserted.
 *
 * Every KVP rank is its own process (forked here), one matmul thread each, the ranks joined
 * by a wire/collective.h group (shared memory, as a stage's ranks on one host choose; or the
 * TCP ring with --transport tcp). Each rank loads the model (KVP replicates the weights) and
 * holds the KV positions of its token range (runtime/model/tp_shard.h kvp_token_range,
 * tokens per rank = max_seq / K, 16 x a power of two), so at context C a decode step's attention
 * reads C / K positions per rank, and the partials are all-gathered and merged once per layer
 * (reference/model.h struct reference_kvp).
 *
 * The context is not prefilled: a 32k-token prefill of this model takes hours on two cores.
 * The slot holds C positions; each rank fills its held positions of [0, C - steps - 2) with
 * random keys and values directly (the attention reads every held position whatever their
 * values; a decode step costs the same), sets the slot's length, and then decodes 1 + --steps
 * tokens greedily up to position C - 1 (embedding, the layers, the LM head and the argmax: a
 * whole decode step). The
 * latency is rank 0's wall time per step (every rank is in lock step: each layer all-gathers);
 * one warm-up step is not counted; the median is printed. Beside it, the CPU time per step of
 * the slowest rank (CLOCK_PROCESS_CPUTIME_ID; waiting in a collective sleeps): the critical
 * path's compute, which a host shared with other work inflates far less than the wall time,
 * and which the wall time approaches when every rank has a core of its own.
 *
 * Memory: the fp32 KV of a context is layers x kv_heads x head_dim x 2 x 4 bytes per token
 * (229,376 bytes for Qwen3-0.6B: 7.0 GiB at 32k), split over the ranks. A context whose KV
 * does not fit --mem-fraction of MemAvailable runs with fewer layers of the same shape (the
 * first L of the checkpoint's, with the LM head), and the table says so.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/sampler.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tp_shard.h"
#include "wire/collective.h"
#include "wire/transport.h"

#define PROG "strata-bench-kvp"
#define MAX_LIST 8
#define MAX_STEPS 64
#define MAX_KVP 8

struct args {
    const char *model;
    int contexts[MAX_LIST], n_contexts;
    int degrees[MAX_LIST], n_degrees;
    int steps, layers, tcp;
    double mem_fraction;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: " PROG " --model DIR [--contexts LIST] [--kvp LIST] [--steps N]\n"
            "                        [--layers L] [--mem-fraction F] [--transport shm|tcp]\n"
            "\n"
            "Decode latency per token (ms) of one request at each context length with each KV\n"
            "parallelism degree, every KVP rank a forked process with one thread, the KV of\n"
            "the context filled with random values (no prefill). A benchmark, not a test.\n"
            "\n"
            "  --model DIR         checkpoint (config.json + model.safetensors)\n"
            "  --contexts LIST     context lengths: the slot's positions, the last steps + 1\n"
            "                      of them decoded (default 2048,8192,32768; >= %d; 2^n\n"
            "                      tokens split evenly over the KVP ranks)\n"
            "  --kvp LIST          KVP degrees (default 1,2,4; at most %d)\n"
            "  --steps N           timed decode steps per run, after one warm-up (default 4)\n"
            "  --layers L          run the first L layers only (default: all, or fewer when\n"
            "                      a context's KV does not fit the memory budget)\n"
            "  --mem-fraction F    KV budget: F x MemAvailable (default 0.5)\n"
            "  --transport T       the ranks' group: shm (default) or tcp (loopback ring)\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model.\n",
            2 * MAX_STEPS + 2, MAX_KVP);
}

/* "2048,8192" -> values in [lo, hi]; the count, or -1. */
static int parse_list(int *out, const char *text, long lo, long hi) {
    int n = 0;
    const char *p = text;
    while (*p && n < MAX_LIST) {
        char num[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof num) return -1;
        memcpy(num, p, len);
        num[len] = '\0';
        if (cli_parse_int(num, lo, hi, &out[n++])) return -1;
        p += len;
        if (*p == ',') ++p;
    }
    return *p ? -1 : n;
}

/* -1 to run, else the exit code (--help: 0). */
static int parse_args(struct args *a, int argc, char **argv) {
    static const struct option opts[] = {
        {"model", 1, 0, 'm'},     {"contexts", 1, 0, 'c'}, {"kvp", 1, 0, 'k'},
        {"steps", 1, 0, 's'},     {"layers", 1, 0, 'l'},   {"mem-fraction", 1, 0, 'f'},
        {"transport", 1, 0, 't'}, {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->n_contexts = parse_list(a->contexts, "2048,8192,32768", 1, 1 << 24);
    a->n_degrees = parse_list(a->degrees, "1,2,4", 1, MAX_KVP);
    a->steps = 4;
    a->mem_fraction = 0.5;
    int c, which = 0;
    while ((c = getopt_long(argc, argv, "", opts, &which)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'c':
            bad = (a->n_contexts = parse_list(a->contexts, optarg, 2 * MAX_STEPS + 2, 1 << 24)) < 1;
            break;
        case 'k': bad = (a->n_degrees = parse_list(a->degrees, optarg, 1, MAX_KVP)) < 1; break;
        case 's': bad = cli_parse_int(optarg, 1, MAX_STEPS, &a->steps) != 0; break;
        case 'l': bad = cli_parse_int(optarg, 1, 4096, &a->layers) != 0; break;
        case 'f':
            a->mem_fraction = strtod(optarg, NULL);
            bad = !(a->mem_fraction > 0.0 && a->mem_fraction <= 1.0);
            break;
        case 't':
            bad = strcmp(optarg, "shm") != 0 && strcmp(optarg, "tcp") != 0;
            a->tcp = strcmp(optarg, "tcp") == 0;
            break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr, PROG ": bad value for --%s: '%s'\n", opts[which].name, optarg);
            return STRATA_EXIT_USAGE;
        }
    }
    if (!a->model || optind < argc) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* One run: context C over K ranks of `layers` layers. */
struct run {
    const struct model_config *cfg;
    const char *model;
    int context, kvp, layers, steps, tcp;
    int ports[MAX_KVP];
    struct wire_listener listeners[MAX_KVP];
    char group[48], shm_name[64];
};

static size_t kv_bytes_per_token(const struct model_config *c, int layers) {
    return (size_t)layers * (size_t)c->num_kv_heads * (size_t)c->head_dim * 2 * sizeof(float);
}

/* Fills positions [0, n) of every layer and KV head of `slot` with random values in
 * [-1, 1): a random block copied at shifting offsets (generating 7 GiB of random numbers
 * would take longer than the measurement). */
static void fill_kv(struct kv_cache *kv, int slot, int n, uint64_t seed) {
    enum { BLOCK = 1 << 18, SHIFTS = 64 };
    static float pattern[BLOCK + SHIFTS];
    for (int i = 0; i < BLOCK + SHIFTS; ++i) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        pattern[i] = (float)(seed >> 40) / (float)(1 << 23) - 1.0f;
    }
    const size_t D = (size_t)kv->head_dim;
    size_t chunk = 0;
    kv_blocks_grow(&kv->blocks, slot, n); /* the pool holds every slot's max_seq */
    for (int l = kv->layer_start; l < kv->layer_end; ++l) {
        const struct ops_kv view = kv_cache_view(kv, slot, l);
        for (int g = 0; g < kv->num_kv_heads; ++g)
            for (int which = 0; which < 2; ++which)
                for (int j0 = 0; j0 < n; j0 += KV_BLOCK) { /* one block's rows are contiguous */
                    float *p =
                        (float *)(which ? view.v : view.k) + ops_kv_offset(&view, g, j0, (int)D);
                    const size_t count = (size_t)(n - j0 < KV_BLOCK ? n - j0 : KV_BLOCK) * D;
                    for (size_t off = 0; off < count; off += BLOCK, ++chunk) {
                        const size_t len = count - off < BLOCK ? count - off : BLOCK;
                        memcpy(p + off, pattern + (chunk * 7) % SHIFTS, len * sizeof(float));
                    }
                }
    }
}

static int coll_gather_hook(void *ctx, float *out, const float *in, size_t n) {
    return coll_allgather(ctx, out, in, n);
}

/* Median of v[n] (sorts it; a handful of values). */
static double median_of(double *v, int n) {
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && v[j] < v[j - 1]; --j) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What a rank reports (one pipe write, well under PIPE_BUF: never interleaved). */
struct rank_report {
    double rank, wall, cpu; /* medians per step, seconds */
};

/* Rank k's part of the run; writes its struct rank_report to `fd`. */
static int rank_main(const struct run *r, int k, int fd) {
    const struct model_config *c = r->cfg;
    /* The slot holds exactly the context's positions: C - steps - 2 filled, then the decode
     * steps (1 warm-up + steps). So KVP K's ranks each hold context / K positions, which the
     * block tree needs to be 16 x a power of two (tp_shard.h kvp_tokens_aligned): contexts of
     * 2^n tokens split evenly; grid_config_check rounds any other up. */
    const int K = r->kvp, max_seq = r->context, C = max_seq - r->steps - 2;
    struct coll *coll = NULL;
    struct safetensors *st = NULL;
    struct reference_model *m = NULL;
    struct kv_cache kv;
    float *hidden = NULL, *logits = NULL;
    double times[MAX_STEPS + 1], cpu[MAX_STEPS + 1];
    int rc = 0, slot = 0;
    memset(&kv, 0, sizeof kv);
    if (K > 1) {
        struct coll_options o = {.rank = k,
                                 .size = K,
                                 .group = r->group,
                                 .timeout_ms = 600000,
                                 .ports = r->ports,
                                 .listener = (struct wire_listener *)&r->listeners[k],
                                 .shm_name = r->shm_name};
        rc = r->tcp ? coll_open_tcp(&coll, &o) : coll_open_shm(&coll, &o);
    }
    struct grid_config grid = {.pp = 1, .tp = 1, .kvp = K};
    if (!rc) rc = grid_config_check(&grid, c, max_seq);
    struct reference_load_options lo = {.layer_start = 0,
                                        .layer_end = r->layers,
                                        .with_embed = 1,
                                        .with_head = 1,
                                        .num_threads = 1};
    if (K > 1)
        lo.kvp = (struct reference_kvp){.kvp = K,
                                        .rank = k,
                                        .tokens = grid.kvp_tokens,
                                        .max_seq = max_seq,
                                        .coll = {.ctx = coll, .allgather = coll_gather_hook}};
    if (!rc) rc = safetensors_open(&st, r->model);
    if (!rc) rc = reference_model_load(&m, c, st, &lo);
    if (!rc)
        rc = kv_cache_init(&kv, 0, r->layers, reference_model_kv_heads(m), c->head_dim,
                           reference_model_kv_positions(m, max_seq), 1, 0, OPS_F32);
    if (!rc) rc = kv_cache_acquire(&kv, &slot);
    hidden = malloc((size_t)c->hidden_size * sizeof(float));
    logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!rc && (!hidden || !logits)) rc = strata_set_error(STRATA_ENOMEM, "out of memory");
    if (!rc) {
        /* This rank's held positions below C (global [lo, hi) at local [0, hi - lo)). */
        struct tp_range held = K > 1 ? kvp_token_range(&grid, k, max_seq) : (struct tp_range){0, C};
        int n = (held.end < C ? held.end : C) - held.start;
        if (n > 0) fill_kv(&kv, slot, n, 0x9e3779b97f4a7c15ull + (uint64_t)k);
        kv.blocks.len[slot] = C; /* lengths stay global under KVP */
    }
    float one = 1.0f; /* every rank filled: start together */
    if (!rc && coll) rc = coll_allreduce_sum(coll, &one, 1);
    int32_t token = 13;
    for (int s = 0; s <= r->steps && !rc; ++s) {
        const double t0 = cli_now_sec(), c0 = cpu_sec();
        struct forward_item item = {.slot = slot, .pos = C + s, .n_tokens = 1};
        if (!(rc = reference_embed(m, hidden, &token, 1)) &&
            !(rc = reference_forward(m, &kv, hidden, &item, 1)) &&
            !(rc = reference_logits(m, logits, hidden, 1)))
            token = (int32_t)argmax(logits, c->vocab_size);
        times[s] = cli_now_sec() - t0;
        cpu[s] = cpu_sec() - c0;
    }
    if (rc)
        fprintf(stderr, PROG ": KVP rank %d of %d, context %d: %s\n", k, K, C, strata_last_error());
    struct rank_report rep = {k, rc ? 0.0 : median_of(times + 1, r->steps),
                              rc ? 0.0 : median_of(cpu + 1, r->steps)};
    if (!rc && write(fd, &rep, sizeof rep) != (ssize_t)sizeof rep) rc = STRATA_EIO;
    free(hidden);
    free(logits);
    kv_cache_free(&kv);
    reference_model_free(m);
    safetensors_close(st);
    coll_close(coll);
    return rc;
}

/* Forks the K ranks of one run: *wall = rank 0's median step time, *cpu = the largest of the
 * ranks' median CPU time per step (seconds). 0, or -1 when the run failed. */
static int run_once(struct run *r, double *wall, double *cpu) {
    int fds[2];
    pid_t pids[MAX_KVP];
    struct rank_report reps[MAX_KVP];
    static int counter;
    snprintf(r->group, sizeof r->group, "bench-kvp.%d.%d", r->context, r->kvp);
    snprintf(r->shm_name, sizeof r->shm_name, "/strata-bench-kvp-%d-%d", (int)getpid(), counter++);
    for (int k = 0; k < r->kvp && r->tcp; ++k) {
        if (wire_listen(&r->listeners[k], NULL, 0)) {
            fprintf(stderr, PROG ": %s\n", strata_last_error());
            return -1;
        }
        r->ports[k] = r->listeners[k].port;
    }
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    for (int k = 0; k < r->kvp; ++k) {
        pids[k] = fork();
        if (pids[k] == 0) {
            close(fds[0]);
            for (int q = 0; q < r->kvp && r->tcp; ++q)
                if (q != k) wire_listener_close(&r->listeners[q]);
            _exit(rank_main(r, k, fds[1]) ? 1 : 0);
        }
    }
    close(fds[1]);
    for (int k = 0; k < r->kvp && r->tcp; ++k)
        wire_listener_close(&r->listeners[k]);
    size_t want = (size_t)r->kvp * sizeof *reps, got = 0;
    while (got < want) {
        ssize_t n = read(fds[0], (char *)reps + got, want - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int failed = got != want;
    for (int k = 0; k < r->kvp; ++k) {
        int status = 0;
        if (pids[k] < 0 || waitpid(pids[k], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            failed = 1;
    }
    if (failed) return -1;
    *wall = *cpu = 0.0;
    for (int k = 0; k < r->kvp; ++k) {
        if (reps[k].rank == 0) *wall = reps[k].wall;
        if (reps[k].cpu > *cpu) *cpu = reps[k].cpu;
    }
    return 0;
}

/* MemAvailable from /proc/meminfo in bytes (0 when unknown). */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib * 1024.0;
}

/* The layers a context runs with: --layers, else all of them unless their KV (all ranks
 * together, max_seq positions) passes the budget; then the most that fit. */
static int layers_for(const struct args *a, const struct model_config *c, int context,
                      double budget) {
    int L = a->layers ? a->layers : c->num_layers;
    if (L > c->num_layers) L = c->num_layers;
    if (a->layers) return L;
    const double per_layer = (double)kv_bytes_per_token(c, 1) * context;
    while (L > 1 && per_layer * L > budget)
        --L;
    return L;
}

int main(int argc, char **argv) {
    struct args a;
    struct model_config cfg;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    if (model_config_load(&cfg, a.model) < 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    const double avail = mem_available(), budget = avail * a.mem_fraction;
    char desc[512];
    model_config_describe(&cfg, desc, sizeof desc);
    printf("KVP benchmark: %s\n", desc);
    printf("%ld cores; every KVP rank a process with 1 thread, group over %s; fp32 KV %zu bytes "
           "per token (all layers); KV budget %.1f GiB (%.0f%% of MemAvailable %.1f GiB)\n",
           sysconf(_SC_NPROCESSORS_ONLN), a.tcp ? "the TCP ring (loopback)" : "shared memory",
           kv_bytes_per_token(&cfg, cfg.num_layers), budget / 1073741824.0, a.mem_fraction * 100,
           avail / 1073741824.0);
    printf(
        "context filled with random K/V (no prefill); median of %d decode steps after 1 warm-up\n",
        a.steps);
    printf("%-8s %-7s %-4s %-15s %-14s %-10s %-22s %-10s\n", "context", "layers", "KVP",
           "KV MiB per rank", "ms per token", "vs KVP 1", "CPU ms/token (slowest)", "vs KVP 1");
    double last_ratio = -1.0, last_cpu_ratio = -1.0;
    int last_context = 0, last_kvp = 0;
    for (int i = 0; i < a.n_contexts; ++i) {
        const int C = a.contexts[i], L = layers_for(&a, &cfg, C, budget);
        double base = 0.0, cpu_base = 0.0;
        if (L < cfg.num_layers && !a.layers)
            printf("context %d: the KV of %d layers (%.1f GiB) passes the budget: runs the first "
                   "%d layers of the same shape\n",
                   C, cfg.num_layers,
                   (double)kv_bytes_per_token(&cfg, cfg.num_layers) * C / 1073741824.0, L);
        for (int d = 0; d < a.n_degrees; ++d) {
            struct run r = {.cfg = &cfg,
                            .model = a.model,
                            .context = C,
                            .kvp = a.degrees[d],
                            .layers = L,
                            .steps = a.steps,
                            .tcp = a.tcp};
            const int per_rank = (C + r.kvp - 1) / r.kvp;
            double t, cpu;
            if (run_once(&r, &t, &cpu)) {
                fprintf(stderr, PROG ": context %d, KVP %d failed\n", C, r.kvp);
                return STRATA_EXIT_FAILURE;
            }
            if (r.kvp == 1) base = t, cpu_base = cpu;
            char ratio[32] = "-", cpu_ratio[32] = "-";
            if (cpu_base > 0) snprintf(cpu_ratio, sizeof cpu_ratio, "%.2fx", cpu / cpu_base);
            if (base > 0) {
                snprintf(ratio, sizeof ratio, "%.2fx", t / base);
                if (r.kvp > 1) {
                    last_ratio = t / base;
                    last_cpu_ratio = cpu / cpu_base;
                    last_context = C;
                    last_kvp = r.kvp;
                }
            }
            printf("%-8d %-7d %-4d %-15.0f %-14.1f %-10s %-22.1f %-10s\n", C, L, r.kvp,
                   (double)kv_bytes_per_token(&cfg, L) * per_rank / 1048576.0, t * 1e3, ratio,
                   cpu * 1e3, cpu_ratio);
            fflush(stdout);
        }
    }
    if (last_ratio >= 0)
        printf("KVP %d / KVP 1 at context %d: %.2fx wall clock, %.2fx CPU time of the slowest rank "
               "(goal at 32k with KVP 4: <= 0.4x)\n",
               last_kvp, last_context, last_ratio, last_cpu_ratio);
    return STRATA_EXIT_OK;
}
