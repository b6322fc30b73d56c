/* strata-sim: runs a model as a pipeline of S in-process stages over simulated links and
 * checks that every split gives bit-identical tokens and logits to the single-stage run.
 *
 * Each row of its table is one simulated run (sim/pipeline_sim.h): the split, whether its
 * tokens and logits match the single-stage baseline bit for bit, and the simulated TTFT,
 * tokens/s and pipeline utilisation for the given link parameters and the measured
 * compute times. Exit 0 when every run matched, 1 on any difference or failure, 2 on a
 * bad command line, 3 on a bad model directory. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_cache.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "sim/compare.h"
#include "sim/pipeline_sim.h"
#include "sim/sim_grid.h"
#include "sim/sim_vision.h"
#include "sim/split.h"

#define MAX_PROMPT 4096
#define WARM_PROMPT (2 * 16 + 1) /* two whole KV blocks and the row that gives a token */

static const char usage_text[] =
    "usage: strata-sim --model DIR (--all-splits | --stages S | --split SPLIT) [options]\n"
    "\n"
    "Runs the model as a pipeline of in-process stages (the real stage core, one thread per\n"
    "stage) connected by simulated links that carry the real wire frames, on a virtual\n"
    "clock. Every run is compared bit for bit (tokens and every logit) with the single-stage\n"
    "run; exit status 1 on any difference.\n"
    "\n"
    "splits:\n"
    "  --all-splits          every S from 1 to L: the even split and --random-splits others\n"
    "  --stages S            the even split into S stages (plus --random-splits others)\n"
    "  --split SPLIT         one explicit split, e.g. 0-1|1-4 (or its cut points: 1)\n"
    "  --random-splits N     random explicit splits per S (default 2 with --all-splits, else 0)\n"
    "  --seed X              seed for random splits and link jitter/loss (default 1)\n"
    "links (every stage-stage and client-stage link):\n"
    "  --latency-us US       one-way latency (default 100)\n"
    "  --bandwidth-gbps G    line rate; 0 = unlimited (default 10)\n"
    "  --jitter-us US        extra delay per frame, uniform in [0, US] (default 0)\n"
    "  --loss P              probability a transmission is lost and resent (default 0)\n"
    "  --rto-ms MS           first retransmission timeout (default 200)\n"
    "  --retries N           retransmissions before a peer counts as unreachable (default 6)\n"
    "  --conn-link C:US:GBPS  latency and bandwidth of the connection stage C -> C+1 only\n"
    "                        (repeatable; C = S-1 is the ring link back to stage 0)\n"
    "faults (applied to every run but the baseline that has stage R):\n"
    "  --kill-stage R@MS     stage R dies at virtual time MS milliseconds\n"
    "  --partition-stage R@MS  stage R becomes unreachable at MS milliseconds\n"
    "  --peer-timeout-ms MS  keepalive: a silent peer is declared dead after MS (default 2000)\n"
    "  --timeout-ms MS       the client gives up on a request after MS (default 60000)\n"
    "requests:\n"
    "  --requests R|S        R concurrent requests (request i uses the prompt rotated by i);\n"
    "                        S: as many requests as the run has stages (baseline: L), which\n"
    "                        shows the utilisation of a full pipeline (default 1)\n"
    "  --max-tokens N        tokens per request (default: golden.json n_steps, else 8)\n"
    "  --prompt IDS          comma-separated prompt ids (default: DIR/golden.json prompt_ids;\n"
    "                        a Qwen3-VL golden's image goes with every request: its grids,\n"
    "                        vision_embeds.f32 and deepstack.f32)\n"
    "  --stop-at-eos         stop at config.json eos ids (default: generate max-tokens)\n"
    "  --warm                each request is sent again when it finishes: the same prompt,\n"
    "                        served from the KV blocks it left cached; every repeat must\n"
    "                        equal its first run bit for bit and reuse blocks (a prompt of\n"
    "                        fewer than 33 ids is first lengthened with golden.json's\n"
    "                        answer, then ids of a fixed pattern, to two whole blocks + 1)\n"
    "  --temperature T --top-k K --top-p P --sample-seed X   sampling (default greedy)\n"
    "compute:\n"
    "  --compute wall|cpu|fixed  charge measured wall time (default), thread CPU time, or a\n"
    "                        fixed --row-cost-us per row and layer (deterministic times)\n"
    "  --row-cost-us US      fixed cost per hidden row per layer (default 1)\n"
    "  --threads N           matmul threads per stage (default 1)\n"
    "  --weights-dtype D     every stage's weights: bf16 (default, as stored) or q8 (8-bit\n"
    "                        blocks quantised at load, cpu only)\n"
    "  --kv-dtype f32|bf16|f16  what every stage's KV cache stores (default f32, the exact\n"
    "                        mode; splits, TP / KVP and --warm repeats are bit-identical in each)\n"
    "  --device cpu|cuda:N   every stage's backend: cpu (default) or GPU N (refused with the\n"
    "                        reason where the build or machine has no CUDA; not with --tp /\n"
    "                        --kvp: CUDA ranks need a GPU each, run strata-stage per rank)\n"
    "  --stage-stats         print each stage's steps, rows, busy and measured time, traffic,\n"
    "                        and where its idle time lies (filling, starved, drained)\n"
    "  --chunk N             prefill chunk rows (default: stage core's)\n"
    "grid (every stage; the baseline is one rank: TP and KVP change no bit):\n"
    "  --tp T                tensor-parallel ranks per stage, each a thread (default 1;\n"
    "                        a power of two dividing 8)\n"
    "  --kvp K               KV-parallel ranks per stage (default 1)\n"
    "  --kvp-tokens N        KV positions per KVP rank, 16 x a power of two (default: the\n"
    "                        even split rounded up to one)\n"
    "  --moe expert|split    MoE under TP: whole experts per rank, or each expert split\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 all runs identical, 1 a difference or a failed run, 2 usage, 3 bad model\n";

struct cli {
    const char *model_dir;
    int all_splits, stages, random_splits;
    const char *split_text;
    uint64_t seed;
    struct sim_options sim; /* link, faults, timeouts, compute, threads */
    struct sim_link_params conn_link[SIM_MAX_STAGES];
    int conn_link_set[SIM_MAX_STAGES];
    int requests, requests_per_stage, max_tokens, stop_at_eos, stage_stats, warm;
    const char *prompt_text;
    struct sampler_params sampling;
};

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "strata-sim: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see strata-sim --help)\n");
    return STRATA_EXIT_USAGE;
}

static int parse_double(double *out, const char *text, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* "R@MS" -> stage and virtual time in ns. */
static int parse_fault(int *stage, int64_t *at_ns, const char *text) {
    const char *at = strchr(text, '@');
    char head[32];
    double ms;
    if (!at || (size_t)(at - text) >= sizeof head) return -1;
    memcpy(head, text, (size_t)(at - text));
    head[at - text] = '\0';
    if (cli_parse_int(head, 0, SIM_MAX_STAGES - 1, stage) < 0 ||
        parse_double(&ms, at + 1, 0.0, 1e9) < 0)
        return -1;
    *at_ns = (int64_t)(ms * 1e6);
    return 0;
}

/* "C:US:GBPS" -> connection index, latency and bandwidth. */
static int parse_conn_link(struct cli *cli, const char *text) {
    int conn;
    double latency_us, gbps;
    char tail;
    if (sscanf(text, "%d:%lf:%lf%c", &conn, &latency_us, &gbps, &tail) != 3 || conn < 0 ||
        conn >= SIM_MAX_STAGES || !(latency_us >= 0 && latency_us <= 1e9) ||
        !(gbps >= 0 && gbps <= 1e6))
        return -1;
    cli->conn_link_set[conn] = 1;
    cli->conn_link[conn].latency_ns = (int64_t)(latency_us * 1e3);
    cli->conn_link[conn].bandwidth_gbps = gbps;
    return 0;
}

/* Whether `name` is an option the usage text lists (as a whole word followed by a space). */
static int is_documented_option(const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(usage_text, name); p; p = strstr(p + n, name))
        if (p[n] == ' ' && (p == usage_text || p[-1] == ' ')) return 1;
    return 0;
}

/* Option parsers by group: 0 parsed, -1 a bad value, 1 not an option of the group. */
static int parse_run_option(struct cli *cli, const char *name, const char *v) {
    double d = 0.0;
    int bad = 0;
    if (!strcmp(name, "--model"))
        cli->model_dir = v;
    else if (!strcmp(name, "--stages"))
        bad = cli_parse_int(v, 1, SIM_MAX_STAGES, &cli->stages) < 0;
    else if (!strcmp(name, "--split"))
        cli->split_text = v;
    else if (!strcmp(name, "--random-splits"))
        bad = cli_parse_int(v, 0, 1000, &cli->random_splits) < 0;
    else if (!strcmp(name, "--seed")) {
        bad = parse_double(&d, v, 0, 9007199254740992.0);
        cli->seed = (uint64_t)d;
    } else if (!strcmp(name, "--requests")) {
        if (!strcmp(v, "S"))
            cli->requests_per_stage = 1;
        else
            bad = cli_parse_int(v, 1, 4096, &cli->requests) < 0;
    } else if (!strcmp(name, "--max-tokens"))
        bad = cli_parse_int(v, 1, 1 << 20, &cli->max_tokens) < 0;
    else if (!strcmp(name, "--prompt"))
        cli->prompt_text = v;
    else if (!strcmp(name, "--temperature")) {
        bad = parse_double(&d, v, 0.0, 100.0);
        cli->sampling.temperature = (float)d;
    } else if (!strcmp(name, "--top-k"))
        bad = cli_parse_int(v, 0, 1 << 30, &cli->sampling.top_k) < 0;
    else if (!strcmp(name, "--top-p")) {
        bad = parse_double(&d, v, 0.0, 1.0);
        cli->sampling.top_p = (float)d;
    } else if (!strcmp(name, "--sample-seed")) {
        bad = parse_double(&d, v, 0, 9007199254740992.0);
        cli->sampling.seed = (uint64_t)d;
    } else if (!strcmp(name, "--tp"))
        bad = cli_parse_int(v, 1, GRID_MAX_DEGREE, &cli->sim.tp) < 0;
    else if (!strcmp(name, "--kvp"))
        bad = cli_parse_int(v, 1, GRID_MAX_DEGREE, &cli->sim.kvp) < 0;
    else if (!strcmp(name, "--kvp-tokens"))
        bad = cli_parse_int(v, 1, 1 << 24, &cli->sim.kvp_tokens) < 0;
    else if (!strcmp(name, "--moe")) {
        bad = strcmp(v, "expert") && strcmp(v, "split");
        cli->sim.moe = !strcmp(v, "split") ? TP_MOE_SPLIT : TP_MOE_EXPERT_PARALLEL;
    } else
        return 1;
    return bad ? -1 : 0;
}

static int parse_link_option(struct cli *cli, const char *name, const char *v) {
    struct sim_link_params *link = &cli->sim.link;
    double d = 0.0;
    int bad = 0;
    if (!strcmp(name, "--latency-us")) {
        bad = parse_double(&d, v, 0, 1e9);
        link->latency_ns = (int64_t)(d * 1e3);
    } else if (!strcmp(name, "--bandwidth-gbps")) {
        bad = parse_double(&d, v, 0, 1e6);
        link->bandwidth_gbps = d;
    } else if (!strcmp(name, "--jitter-us")) {
        bad = parse_double(&d, v, 0, 1e9);
        link->jitter_ns = (int64_t)(d * 1e3);
    } else if (!strcmp(name, "--loss"))
        bad = parse_double(&link->loss, v, 0.0, 1.0);
    else if (!strcmp(name, "--rto-ms")) {
        bad = parse_double(&d, v, 1e-6, 1e7);
        link->retransmit_timeout_ns = (int64_t)(d * 1e6);
    } else if (!strcmp(name, "--retries"))
        bad = cli_parse_int(v, 0, 30, &link->max_retransmits) < 0;
    else if (!strcmp(name, "--conn-link"))
        bad = parse_conn_link(cli, v);
    else if (!strcmp(name, "--kill-stage"))
        bad = parse_fault(&cli->sim.kill_stage, &cli->sim.kill_at_ns, v);
    else if (!strcmp(name, "--partition-stage"))
        bad = parse_fault(&cli->sim.partition_stage, &cli->sim.partition_at_ns, v);
    else if (!strcmp(name, "--peer-timeout-ms")) {
        bad = parse_double(&d, v, 1e-3, 1e9);
        cli->sim.peer_timeout_ns = (int64_t)(d * 1e6);
    } else if (!strcmp(name, "--timeout-ms")) {
        bad = parse_double(&d, v, 1e-3, 1e9);
        cli->sim.request_timeout_ns = (int64_t)(d * 1e6);
    } else
        return 1;
    return bad ? -1 : 0;
}

static int parse_compute_option(struct cli *cli, const char *name, const char *v) {
    double d = 0.0;
    int bad = 0;
    if (!strcmp(name, "--compute")) {
        if (!strcmp(v, "wall"))
            cli->sim.compute = SIM_COMPUTE_WALL;
        else if (!strcmp(v, "cpu"))
            cli->sim.compute = SIM_COMPUTE_CPU;
        else if (!strcmp(v, "fixed"))
            cli->sim.compute = SIM_COMPUTE_FIXED;
        else
            bad = 1;
    } else if (!strcmp(name, "--row-cost-us")) {
        bad = parse_double(&d, v, 0, 1e9);
        cli->sim.row_layer_cost_ns = (int64_t)(d * 1e3);
    } else if (!strcmp(name, "--threads"))
        bad = cli_parse_int(v, 1, 256, &cli->sim.num_threads) < 0;
    else if (!strcmp(name, "--kv-dtype"))
        bad = kv_dtype_parse(v, &cli->sim.kv_dtype) < 0;
    else if (!strcmp(name, "--weights-dtype")) {
        cli->sim.weights_dtype = v;
        bad = strcmp(v, "bf16") != 0 && strcmp(v, "q8") != 0;
    } else if (!strcmp(name, "--device")) {
        struct cli_device d;
        cli->sim.device = v; /* whether cuda[:N] is present is the backend's (exit 1) */
        bad = cli_parse_device(v, &d) < 0;
    } else if (!strcmp(name, "--chunk"))
        bad = cli_parse_int(v, 1, 1 << 20, &cli->sim.chunk_size) < 0;
    else
        return 1;
    return bad ? -1 : 0;
}

static void cli_defaults(struct cli *cli) {
    memset(cli, 0, sizeof *cli);
    sim_options_default(&cli->sim);
    cli->sim.link.latency_ns = 100000;
    cli->sim.link.bandwidth_gbps = 10.0;
    cli->seed = 1;
    cli->random_splits = -1;
    cli->requests = 1;
    cli->sampling.top_p = 1.0f;
}

static int finish_args(struct cli *cli);

/* Fills `cli` from argv; returns -1 to print help and exit 0, 0 ok, or an exit code. */
static int parse_args(struct cli *cli, int argc, char **argv) {
    cli_defaults(cli);
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        if (!strcmp(name, "-h") || !strcmp(name, "--help")) return -1;
        if (!strcmp(name, "--all-splits") || !strcmp(name, "--stop-at-eos") ||
            !strcmp(name, "--stage-stats") || !strcmp(name, "--warm")) {
            cli->all_splits |= !strcmp(name, "--all-splits");
            cli->stop_at_eos |= !strcmp(name, "--stop-at-eos");
            cli->stage_stats |= !strcmp(name, "--stage-stats");
            cli->warm |= !strcmp(name, "--warm");
            continue;
        }
        if (strncmp(name, "--", 2) != 0) return usage_error("unexpected argument '%s'", name);
        if (i + 1 >= argc)
            return usage_error(
                is_documented_option(name) ? "%s needs a value" : "unknown option '%s'", name);
        const char *v = argv[++i];
        int rc = parse_run_option(cli, name, v);
        if (rc == 1) rc = parse_link_option(cli, name, v);
        if (rc == 1) rc = parse_compute_option(cli, name, v);
        if (rc == 1) return usage_error("unknown option '%s'", name);
        if (rc < 0) return usage_error("bad value for %s", name);
    }
    return finish_args(cli);
}

/* Cross-option checks and derived settings. */
static int finish_args(struct cli *cli) {
    if (!cli->model_dir) return usage_error("%s", "--model DIR is required");
    if (cli->all_splits + (cli->stages > 0) + (cli->split_text != NULL) != 1)
        return usage_error("%s", "choose exactly one of --all-splits, --stages S, --split SPLIT");
    if (cli->random_splits < 0) cli->random_splits = cli->all_splits ? 2 : 0;
    if (cli->warm && cli->requests_per_stage)
        return usage_error("%s", "--warm takes a number of --requests, not S");
    /* Overridden connections share every other link setting (jitter, loss, retries). */
    for (int c = 0; c < SIM_MAX_STAGES; c++) {
        if (!cli->conn_link_set[c]) continue;
        struct sim_link_params own = cli->sim.link;
        own.latency_ns = cli->conn_link[c].latency_ns;
        own.bandwidth_gbps = cli->conn_link[c].bandwidth_gbps;
        cli->conn_link[c] = own;
    }
    cli->sim.conn_link = cli->conn_link;
    cli->sim.conn_link_set = cli->conn_link_set;
    cli->sim.num_conn_link = SIM_MAX_STAGES;
    if (cli->sim.kill_stage >= 0 && cli->sim.partition_stage >= 0)
        return usage_error("%s", "use one fault at a time (--kill-stage or --partition-stage)");
    if (cli->sim.tp * cli->sim.kvp > 1 && cli_device_is_cuda(cli->sim.device))
        return usage_error("%s", SIM_GRID_CUDA_REFUSED);
    return 0;
}

/* Golden data of a model directory (tests/golden/<case>/), when present. */
struct golden {
    int have;
    int32_t prompt[MAX_PROMPT];
    int prompt_len;
    int32_t *generated; /* [n_steps] */
    int n_steps;
    float *logits; /* [n_steps][vocab] from logits.f32, or NULL */
    int vocab;
};

static void golden_free(struct golden *g) {
    free(g->generated);
    free(g->logits);
    memset(g, 0, sizeof *g);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        if (size >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)size + 1))) {
            if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
                free(buf);
                buf = NULL;
            } else {
                buf[size] = '\0';
                *len = (size_t)size;
            }
        }
    }
    fclose(f);
    return buf;
}

static int json_int_array(int32_t *out, int cap, const cJSON *array) {
    if (!cJSON_IsArray(array)) return -1;
    int n = cJSON_GetArraySize(array);
    if (n > cap) return -1;
    for (int i = 0; i < n; i++) {
        const cJSON *item = cJSON_GetArrayItem(array, i);
        if (!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble > 2e9) return -1;
        out[i] = (int32_t)item->valuedouble;
    }
    return n;
}

/* Reads DIR/golden.json (and DIR/logits.f32) if there; a malformed one is an error. */
static int golden_load(struct golden *g, const char *dir, int vocab) {
    char path[4096];
    size_t len = 0;
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = read_file(path, &len);
    if (!text) return 0;
    int rc = 0;
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *gen = root ? cJSON_GetObjectItemCaseSensitive(root, "generated_ids") : NULL;
    g->prompt_len = root ? json_int_array(g->prompt, MAX_PROMPT,
                                          cJSON_GetObjectItemCaseSensitive(root, "prompt_ids"))
                         : -1;
    g->n_steps = cJSON_IsArray(gen) ? cJSON_GetArraySize(gen) : -1;
    if (g->prompt_len < 1 || g->n_steps < 0 ||
        !(g->generated = calloc((size_t)g->n_steps + 1, sizeof(int32_t))) ||
        json_int_array(g->generated, g->n_steps, gen) != g->n_steps) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: needs prompt_ids and generated_ids lists", path);
        goto done;
    }
    g->have = 1;
    g->vocab = vocab;
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    size_t logits_len = 0;
    char *logits = read_file(path, &logits_len);
    if (logits && logits_len == sizeof(float) * (size_t)g->n_steps * (size_t)vocab)
        g->logits = (float *)logits;
    else
        free(logits);
done:
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* One table row: runs `split` and compares it with the baseline (NULL: it is the baseline). */
static int run_split(struct sim_report *report, struct cli *cli, const struct sim_split *split,
                     const struct sim_report *baseline, int *any_failure) {
    char name[512], why[512] = "";
    struct sim_options opt = cli->sim;
    opt.split = *split;
    if (!baseline || opt.kill_stage >= split->num_stages) opt.kill_stage = -1;
    if (!baseline || opt.partition_stage >= split->num_stages) opt.partition_stage = -1;
    int faulted = opt.kill_stage >= 0 || opt.partition_stage >= 0;
    if (cli->requests_per_stage)
        opt.num_requests = baseline ? split->num_stages : split->num_layers;
    sim_split_format(split, name, sizeof name);
    int rc = sim_run(report, &opt);
    if (rc < 0) {
        printf("%-32s %2d  ERROR      %s\n", name, split->num_stages, strata_last_error());
        *any_failure = 1;
        return rc;
    }
    const char *verdict = "baseline";
    if (baseline) {
        int same = sim_reports_identical(baseline, report, why, sizeof why);
        verdict = same ? "yes" : (report->failed_requests ? "FAILED" : "NO");
        if (!same) *any_failure = 1;
    } else if (report->failed_requests) {
        verdict = "FAILED";
        *any_failure = 1;
    }
    /* --warm: the repeats (the second half) against their first runs, and reused blocks. */
    if (cli->warm && !report->failed_requests && !why[0]) {
        const int R = report->num_requests / 2;
        if (!sim_repeats_identical(report, R, why, sizeof why)) {
            verdict = "NO";
            *any_failure = 1;
        } else if (report->prefix_cached_tokens == 0) {
            snprintf(why, sizeof why, "--warm: the repeats reused no cached KV block");
            verdict = "NO";
            *any_failure = 1;
        }
    }
    int64_t wall = 0;
    for (int r = 0; r < report->num_stages; r++)
        wall += report->stages[r].wall_ns;
    char ttft[32] = "-", rate[32] = "-";
    if (report->failed_requests < report->num_requests) {
        snprintf(ttft, sizeof ttft, "%.3f", report->mean_ttft_ns / 1e6);
        snprintf(rate, sizeof rate, "%.1f", report->tokens_per_s);
    }
    printf("%-32s %2d  %-9s %9s %10s %7.1f %8.1f %11.3f %8llu\n", name, split->num_stages, verdict,
           ttft, rate, 100.0 * report->utilisation, 100.0 * report->bubble_fraction,
           (double)wall / 1e6, (unsigned long long)report->events);
    if (cli->warm && report->prefix_cached_tokens > 0 && !why[0])
        printf("    warm repeats: %llu prompt tokens from the KV cache, bit-identical\n",
               (unsigned long long)report->prefix_cached_tokens);
    for (int r = 0; cli->stage_stats && r < report->num_stages; r++) {
        const struct sim_stage_stats *st = &report->stages[r];
        printf("    stage %d [%d, %d): %llu steps, %llu rows, busy %.3f ms (%.1f%%), measured "
               "wall %.3f ms cpu %.3f ms, sent %llu frames %llu bytes\n",
               r, st->layer_start, st->layer_end, (unsigned long long)st->steps,
               (unsigned long long)st->rows, (double)st->busy_ns / 1e6,
               report->makespan_ns ? 100.0 * (double)st->busy_ns / (double)report->makespan_ns
                                   : 0.0,
               (double)st->wall_ns / 1e6, (double)st->cpu_ns / 1e6,
               (unsigned long long)st->frames_out, (unsigned long long)st->bytes_out);
        if (st->first_step_ns >= 0)
            printf("      idle: filling %.3f ms, starved between steps %.3f ms, drained %.3f ms\n",
                   (double)st->first_step_ns / 1e6, (double)st->gap_ns / 1e6,
                   (double)(report->makespan_ns - st->last_step_end_ns) / 1e6);
    }
    if (report->protocol_errors) {
        printf("    protocol errors: %d, first: %s\n", report->protocol_errors,
               report->first_protocol_error);
        *any_failure = 1;
    }
    if (faulted || report->failed_requests) {
        for (int i = 0; i < report->num_requests; i++)
            if (report->requests[i].status != 0)
                printf("    request %d failed (%s) at %.3f ms: %s\n", i + 1,
                       strata_status_name(report->requests[i].status),
                       (double)report->requests[i].done_ns / 1e6, report->requests[i].message);
    } else if (why[0]) {
        printf("    difference: %s\n", why);
    }
    fflush(stdout);
    return 0;
}

/* Runs the splits of one S: the even split, then up to `random` distinct random ones. */
static int run_stage_count(struct cli *cli, int L, int S, uint64_t *rng,
                           const struct sim_report *baseline, int *runs, int *any_failure) {
    struct sim_split done[64];
    int n_done = 0;
    int rc = sim_split_even(&done[0], L, S);
    if (rc < 0) return rc;
    n_done = 1;
    for (int tries = 0;
         tries < 20 * cli->random_splits && n_done < cli->random_splits + 1 && n_done < 64;
         tries++) {
        struct sim_split candidate;
        rc = sim_split_random(&candidate, L, S, rng);
        if (rc < 0) return rc;
        int seen = 0;
        for (int k = 0; k < n_done; k++)
            seen |= sim_split_equal(&candidate, &done[k]);
        if (!seen) done[n_done++] = candidate;
    }
    for (int k = 0; k < n_done; k++) {
        if (S == 1 && k == 0) continue; /* the baseline row */
        struct sim_report report;
        if (run_split(&report, cli, &done[k], baseline, any_failure) == 0) {
            (*runs)++;
            sim_report_free(&report);
        }
    }
    return 0;
}

/* What one strata-sim invocation holds between opening and closing. */
struct session {
    struct model_config cfg;
    struct safetensors *weights;
    struct golden golden;
    struct sim_vision vision; /* a VL golden's image, sent with every request */
    int32_t base_prompt[MAX_PROMPT];
    int prompt_len, max_tokens;
    int lengthened; /* --warm lengthened the golden prompt */
    struct sim_split explicit_split;
    struct sim_request_spec *specs;
    int32_t *prompts;
    struct sim_report baseline;
};

static void session_close(struct session *ss) {
    sim_report_free(&ss->baseline);
    free(ss->specs);
    free(ss->prompts);
    golden_free(&ss->golden);
    sim_vision_free(&ss->vision);
    safetensors_close(ss->weights);
}

/* Model, weights, golden data and the base prompt; returns an exit code (0 = opened). */
static int open_inputs(struct session *ss, const struct cli *cli) {
    if (model_config_load(&ss->cfg, cli->model_dir) < 0 ||
        safetensors_open(&ss->weights, cli->model_dir) < 0 ||
        golden_load(&ss->golden, cli->model_dir, ss->cfg.vocab_size) < 0) {
        fprintf(stderr, "strata-sim: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    if (cli->prompt_text) {
        ss->prompt_len =
            cli_parse_ids(ss->base_prompt, MAX_PROMPT, cli->prompt_text, 0, ss->cfg.vocab_size - 1);
        if (ss->prompt_len < 1) {
            fprintf(stderr, "strata-sim: --prompt needs comma-separated ids in [0, %d)\n",
                    ss->cfg.vocab_size);
            return STRATA_EXIT_USAGE;
        }
    } else if (ss->golden.have) {
        ss->prompt_len = ss->golden.prompt_len;
        memcpy(ss->base_prompt, ss->golden.prompt, sizeof(int32_t) * (size_t)ss->prompt_len);
        if (sim_vision_load(&ss->vision, cli->model_dir, &ss->cfg) < 0) {
            fprintf(stderr, "strata-sim: %s\n", strata_last_error());
            return STRATA_EXIT_INPUT;
        }
    } else {
        ss->prompt_len = 8;
        for (int i = 0; i < ss->prompt_len; i++)
            ss->base_prompt[i] = (int32_t)((i * 7 + 1) % ss->cfg.vocab_size);
    }
    return STRATA_EXIT_OK;
}

/* Option checks that need the model, done before the (possibly long) baseline run. */
static int check_against_model(struct session *ss, const struct cli *cli) {
    int max_stages = ss->cfg.num_layers < SIM_MAX_STAGES ? ss->cfg.num_layers : SIM_MAX_STAGES;
    if (cli->split_text) {
        if (sim_split_parse(&ss->explicit_split, cli->split_text, ss->cfg.num_layers) < 0) {
            fprintf(stderr, "strata-sim: %s\n", strata_last_error());
            return STRATA_EXIT_USAGE;
        }
        max_stages = ss->explicit_split.num_stages;
    } else if (cli->stages) {
        max_stages = cli->stages;
    }
    for (int c = max_stages; c < SIM_MAX_STAGES; c++)
        if (cli->conn_link_set[c]) {
            fprintf(stderr,
                    "strata-sim: --conn-link %d: no run has that connection (at most %d "
                    "stages, connections 0..%d)\n",
                    c, max_stages, max_stages - 1);
            return STRATA_EXIT_USAGE;
        }
    if (cli->sim.kill_stage >= max_stages || cli->sim.partition_stage >= max_stages) {
        fprintf(stderr, "strata-sim: stage %d cannot fail: no run has it (at most %d stages)\n",
                cli->sim.kill_stage >= max_stages ? cli->sim.kill_stage : cli->sim.partition_stage,
                max_stages);
        return STRATA_EXIT_USAGE;
    }
    return STRATA_EXIT_OK;
}

/* The concurrent requests (rotations of the base prompt) and the simulator's inputs. */
static int build_requests(struct session *ss, struct cli *cli) {
    const struct golden *g = &ss->golden;
    ss->max_tokens =
        cli->max_tokens ? cli->max_tokens : (g->have && g->n_steps > 0 ? g->n_steps : 8);
    if (cli->requests_per_stage && cli->requests < ss->cfg.num_layers)
        cli->requests = ss->cfg.num_layers;
    /* --warm: two whole blocks to reuse and a row to compute; the answer's ids first (the
     * next turn of a chat), text ids after the image rows, which stay where they were. */
    for (int k = 0; cli->warm && ss->prompt_len < WARM_PROMPT; k++) {
        ss->base_prompt[ss->prompt_len++] = g->have && k < g->n_steps
                                                ? g->generated[k]
                                                : (int32_t)((k * 13 + 5) % ss->cfg.vocab_size);
        ss->lengthened = 1;
    }
    const int R = cli->requests, total = cli->warm ? 2 * R : R;
    ss->specs = calloc((size_t)total, sizeof *ss->specs);
    ss->prompts = malloc(sizeof(int32_t) * (size_t)cli->requests * (size_t)ss->prompt_len);
    if (!ss->specs || !ss->prompts) {
        fprintf(stderr, "strata-sim: out of memory\n");
        return STRATA_EXIT_FAILURE;
    }
    for (int i = 0; i < cli->requests; i++) {
        int32_t *p = ss->prompts + (size_t)i * (size_t)ss->prompt_len;
        for (int j = 0; j < ss->prompt_len; j++)
            p[j] = ss->base_prompt[(j + i) % ss->prompt_len];
        ss->specs[i].prompt = p;
        ss->specs[i].prompt_len = ss->prompt_len;
        ss->specs[i].max_tokens = ss->max_tokens;
        ss->specs[i].num_stop_ids = cli->stop_at_eos ? ss->cfg.num_eos_token_ids : 0;
        ss->specs[i].stop_ids = ss->cfg.eos_token_ids;
        ss->specs[i].sampling = cli->sampling;
        ss->specs[i].vision = ss->vision.have ? &ss->vision.vision : NULL;
    }
    cli->sim.cfg = &ss->cfg;
    cli->sim.weights = ss->weights;
    cli->sim.seed = cli->seed;
    for (int i = R; i < total; i++) { /* --warm: each again, once it has finished */
        ss->specs[i] = ss->specs[i - R];
        ss->specs[i].after = i - R + 1;
    }
    cli->sim.num_requests = total;
    cli->sim.requests = ss->specs;
    return STRATA_EXIT_OK;
}

static void print_header(const struct session *ss, const struct cli *cli) {
    char describe[256], concurrent[32];
    model_config_describe(&ss->cfg, describe, sizeof describe);
    printf("model: %s (%s)\n", cli->model_dir, describe);
    printf("links: latency %.1f us, bandwidth %g Gbps%s, jitter %.1f us, loss %g, seed %llu\n",
           (double)cli->sim.link.latency_ns / 1e3, cli->sim.link.bandwidth_gbps,
           cli->sim.link.bandwidth_gbps <= 0 ? " (unlimited)" : "",
           (double)cli->sim.link.jitter_ns / 1e3, cli->sim.link.loss,
           (unsigned long long)cli->seed);
    if (cli->requests_per_stage)
        snprintf(concurrent, sizeof concurrent, "S (one per stage)");
    else
        snprintf(concurrent, sizeof concurrent, "%d", cli->requests);
    for (int c = 0; c < SIM_MAX_STAGES; c++)
        if (cli->conn_link_set[c])
            printf("  connection %d -> %d: latency %.1f us, bandwidth %g Gbps\n", c, c + 1,
                   (double)cli->conn_link[c].latency_ns / 1e3, cli->conn_link[c].bandwidth_gbps);
    printf("requests: %s concurrent, %d-token prompt, %d tokens each; compute: %s\n", concurrent,
           ss->prompt_len, ss->max_tokens,
           cli->sim.compute == SIM_COMPUTE_FIXED ? "fixed cost per row and layer"
           : cli->sim.compute == SIM_COMPUTE_CPU ? "measured thread CPU time"
                                                 : "measured wall time");
    if (cli->sim.tp * cli->sim.kvp > 1)
        printf("grid: every stage is TP %d x KVP %d ranks (threads; KV positions per KVP rank: "
               "%s), MoE %s; the baseline is one rank (no TP / KVP)\n",
               cli->sim.tp, cli->sim.kvp, cli->sim.kvp_tokens ? "--kvp-tokens" : "aligned split",
               cli->sim.moe == TP_MOE_SPLIT ? "split" : "expert");
    if (cli->warm)
        printf("warm: each request is sent again once it has finished, the same prompt from the "
               "KV blocks it left cached; the repeat must equal its first run bit for bit\n");
    if (ss->vision.have)
        printf("images: %d per request from golden.json (%d image tokens, %d DeepStack "
               "layers)\n",
               ss->vision.vision.num_images, ss->vision.vision.n_image_tokens,
               ss->vision.vision.num_deepstack);
    printf("(TTFT, tokens/s, util: simulated on the virtual clock; measured ms: wall time of all "
           "stage steps)\n");
    printf("%-32s %2s  %-9s %9s %10s %7s %8s %11s %8s\n", "split", "S", "identical", "TTFT ms",
           "tokens/s", "util %", "bubble %", "measured ms", "events");
}

/* The baseline against golden.json, for information (the splits are compared with the
 * baseline, bit for bit). */
static void report_golden(const struct session *ss, const struct cli *cli) {
    const struct golden *g = &ss->golden;
    const struct sim_report *base = &ss->baseline;
    /* A VL golden's prompt holds image placeholders whose embeddings came from the vision
     * tower: comparable when the recorded vision inputs went with the requests. */
    int golden_has_image = 0;
    for (int i = 0; g->have && ss->cfg.has_vision && !ss->vision.have && i < g->prompt_len; ++i)
        if (g->prompt[i] == ss->cfg.image_token_id || g->prompt[i] == ss->cfg.video_token_id)
            golden_has_image = 1;
    if (ss->lengthened)
        printf("    baseline vs golden.json: not compared (--warm lengthened the prompt to %d "
               "ids)\n",
               ss->prompt_len);
    else if (golden_has_image && !cli->prompt_text)
        printf("    baseline vs golden.json: not compared (the golden prompt carries image "
               "input; this run feeds token ids only)\n");
    if (!g->have || golden_has_image || cli->prompt_text || ss->lengthened ||
        cli->sampling.temperature > 0.0f || base->requests[0].status != 0)
        return;
    int n = base->requests[0].n_tokens < g->n_steps ? base->requests[0].n_tokens : g->n_steps;
    int match = 0;
    while (match < n && base->requests[0].tokens[match] == g->generated[match])
        match++;
    double diff =
        g->logits ? sim_logits_max_abs_diff(base, 0, g->logits, g->n_steps, g->vocab) : -1.0;
    printf("    baseline vs golden.json: %d/%d leading tokens match", match, n);
    if (diff >= 0) printf(", max |logit - golden| %.3g", diff);
    printf(" (informational)\n");
}

/* The baseline, then every asked split compared with it; returns the exit code. */
static int run_all(struct session *ss, struct cli *cli) {
    int any_failure = 0, runs = 0, L = ss->cfg.num_layers, rc;
    struct sim_split single;
    uint64_t rng = cli->seed;
    sim_split_even(&single, L, 1);
    /* Under a grid the baseline is one rank (no TP, no KVP): TP and KVP change no bit, so
     * the grid's single stage and every split are compared with it. */
    struct cli one = *cli;
    one.sim.tp = one.sim.kvp = 1;
    one.sim.kvp_tokens = 0;
    rc = run_split(&ss->baseline, &one, &single, NULL, &any_failure);
    if (rc < 0) /* a model the stages cannot load is bad input; anything else a failure */
        return (rc == STRATA_ENOTFOUND || rc == STRATA_EFORMAT) ? STRATA_EXIT_INPUT
                                                                : STRATA_EXIT_FAILURE;
    report_golden(ss, cli);
    if (cli->sim.tp * cli->sim.kvp > 1) {
        struct sim_report grid1;
        if (run_split(&grid1, cli, &single, &ss->baseline, &any_failure) == 0) {
            runs++;
            sim_report_free(&grid1);
        }
    }
    rc = 0;
    for (int S = 1; cli->all_splits && rc == 0 && S <= L && S <= SIM_MAX_STAGES; S++)
        rc = run_stage_count(cli, L, S, &rng, &ss->baseline, &runs, &any_failure);
    if (cli->stages)
        rc = run_stage_count(cli, L, cli->stages, &rng, &ss->baseline, &runs, &any_failure);
    if (rc < 0) {
        fprintf(stderr, "strata-sim: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    if (cli->split_text) {
        struct sim_report report;
        if (run_split(&report, cli, &ss->explicit_split, &ss->baseline, &any_failure) == 0) {
            runs++;
            sim_report_free(&report);
        }
    }
    if (any_failure) {
        printf("FAILED: at least one run differs from the single-stage baseline or failed\n");
        return STRATA_EXIT_FAILURE;
    }
    printf("OK: %d split runs, all bit-identical to the single-stage baseline%s\n", runs,
           cli->sim.tp * cli->sim.kvp > 1 ? " (one rank, no TP / KVP)" : "");
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    struct cli cli;
    static struct session ss; /* large: prompt buffer */
    int code = parse_args(&cli, argc, argv);
    if (code == -1) {
        fputs(usage_text, stdout);
        return STRATA_EXIT_OK;
    }
    if (code != 0) return code;
    code = open_inputs(&ss, &cli);
    if (code == STRATA_EXIT_OK) code = check_against_model(&ss, &cli);
    if (code == STRATA_EXIT_OK) code = build_requests(&ss, &cli);
    if (code == STRATA_EXIT_OK) {
        print_header(&ss, &cli);
        code = run_all(&ss, &cli);
    }
    session_close(&ss);
    return code;
}
