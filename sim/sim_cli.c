/* strata-sim's command line (see sim_cli.h): the usage text, the option parsers by group and
 * the cross-option checks that need no model. */
#include "sim/sim_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_cache.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "sim/sim_grid.h"
#include "wire/message.h"

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
    "  --prompt-tokens N     a prompt of N ids of a fixed pattern (instead of --prompt)\n"
    "  --stop-at-eos         stop at config.json eos ids (default: generate max-tokens)\n"
    "  --warm                each request is sent again when it finishes: the same prompt,\n"
    "                        served from the KV blocks it left cached, and then its next\n"
    "                        turn: the prompt and the first half of its answer, served from\n"
    "                        the blocks of both; every repeat must equal its first run bit\n"
    "                        for bit, every next turn the rest of its answer (every step\n"
    "                        greedy, the first sampled), each reusing the blocks (a prompt of\n"
    "                        fewer than 33 ids is first lengthened with golden.json's\n"
    "                        answer, then ids of a fixed pattern, to two whole blocks + 1)\n"
    "  --temperature T --top-k K --top-p P --sample-seed X   sampling (default greedy)\n"
    "  --speculate off|ngram|draft  speculative decoding on stage 0 of every run but the\n"
    "                        baseline, which decodes without drafts: model-free n-gram drafts\n"
    "                        or a draft model's, verified by the last stage; every run must\n"
    "                        still equal the baseline bit for bit, and some step must have\n"
    "                        carried drafts (default off)\n"
    "  --draft-model DIR     the draft model of --speculate draft (the same vocabulary)\n"
    "  --speculate-k K       drafts per decode step, 1..16 (default 4)\n"
    "  --speculate-waves W   decode steps of a request in flight, 1..4 (default 1): each\n"
    "                        later one drafted on the guess that those before it are accepted\n"
    "compute:\n"
    "  --compute wall|cpu|fixed|model  charge measured wall time (default), thread CPU\n"
    "                        time, a fixed --row-cost-us per row and layer (deterministic\n"
    "                        times), or what the performance model says for the step on\n"
    "                        --profile's device (strata-plan --predict's model; deterministic)\n"
    "  --profile FILE        the device profile of --compute model (strata-stage --calibrate)\n"
    "  --no-weights          timing only, for a model whose checkpoint is not here: DIR needs\n"
    "                        only config.json; stages compute nothing (the KV pool's\n"
    "                        bookkeeping is kept) and are charged --compute model's time;\n"
    "                        tokens are placeholders and no bits are compared (not with\n"
    "                        --tp / --kvp, --speculate, --device, --weights-dtype)\n"
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
static int parse_conn_link(struct sim_cli *cli, const char *text) {
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
static int parse_run_option(struct sim_cli *cli, const char *name, const char *v) {
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
    else if (!strcmp(name, "--prompt-tokens"))
        bad = cli_parse_int(v, 1, SIM_MAX_PROMPT, &cli->prompt_tokens) < 0;
    else if (!strcmp(name, "--speculate")) {
        bad = strcmp(v, "off") && strcmp(v, "ngram") && strcmp(v, "draft");
        cli->sim.speculate = !strcmp(v, "ngram")   ? WIRE_SPECULATE_NGRAM
                             : !strcmp(v, "draft") ? WIRE_SPECULATE_DRAFT
                                                   : 0;
    } else if (!strcmp(name, "--draft-model"))
        cli->draft_model = v;
    else if (!strcmp(name, "--speculate-k"))
        bad = cli_parse_int(v, 1, WIRE_SPECULATE_MAX_K, &cli->sim.speculate_k) < 0;
    else if (!strcmp(name, "--speculate-waves"))
        bad = cli_parse_int(v, 1, 4, &cli->sim.speculate_waves) < 0;
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

static int parse_link_option(struct sim_cli *cli, const char *name, const char *v) {
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

static int parse_compute_option(struct sim_cli *cli, const char *name, const char *v) {
    double d = 0.0;
    int bad = 0;
    if (!strcmp(name, "--compute")) {
        if (!strcmp(v, "wall"))
            cli->sim.compute = SIM_COMPUTE_WALL;
        else if (!strcmp(v, "cpu"))
            cli->sim.compute = SIM_COMPUTE_CPU;
        else if (!strcmp(v, "fixed"))
            cli->sim.compute = SIM_COMPUTE_FIXED;
        else if (!strcmp(v, "model"))
            cli->sim.compute = SIM_COMPUTE_MODEL;
        else
            bad = 1;
    } else if (!strcmp(name, "--profile")) {
        cli->profile = v;
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

static void cli_defaults(struct sim_cli *cli) {
    memset(cli, 0, sizeof *cli);
    sim_options_default(&cli->sim);
    cli->sim.link.latency_ns = 100000;
    cli->sim.link.bandwidth_gbps = 10.0;
    cli->seed = 1;
    cli->random_splits = -1;
    cli->requests = 1;
    cli->sampling.top_p = 1.0f;
}

static int finish_args(struct sim_cli *cli);

int sim_cli_parse(struct sim_cli *cli, int argc, char **argv) {
    cli_defaults(cli);
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        if (!strcmp(name, "-h") || !strcmp(name, "--help")) return -1;
        if (!strcmp(name, "--all-splits") || !strcmp(name, "--stop-at-eos") ||
            !strcmp(name, "--stage-stats") || !strcmp(name, "--warm") ||
            !strcmp(name, "--no-weights")) {
            cli->sim.no_weights |= !strcmp(name, "--no-weights");
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
static int finish_args(struct sim_cli *cli) {
    if (!cli->model_dir) return usage_error("%s", "--model DIR is required");
    if (cli->all_splits + (cli->stages > 0) + (cli->split_text != NULL) != 1)
        return usage_error("%s", "choose exactly one of --all-splits, --stages S, --split SPLIT");
    if (cli->random_splits < 0) cli->random_splits = cli->all_splits ? 2 : 0;
    if ((cli->sim.speculate == WIRE_SPECULATE_DRAFT) != (cli->draft_model != NULL))
        return usage_error("%s", "--speculate draft and --draft-model DIR go together");
    if ((cli->sim.compute == SIM_COMPUTE_MODEL) != (cli->profile != NULL))
        return usage_error("%s", "--compute model and --profile FILE go together");
    if (cli->prompt_text && cli->prompt_tokens)
        return usage_error("%s", "choose one of --prompt IDS and --prompt-tokens N");
    if (cli->sim.no_weights &&
        (cli->sim.compute != SIM_COMPUTE_MODEL || cli->sim.tp * cli->sim.kvp > 1 ||
         cli->sim.speculate || cli->sim.device || cli->sim.weights_dtype))
        return usage_error("%s", "--no-weights runs --compute model on whole stages: not with "
                                 "--tp / --kvp, --speculate, --device or --weights-dtype");
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

void sim_cli_usage(FILE *out) {
    fputs(usage_text, out);
}
