/* strata-plan: prints how a model's decoder layers would be split over pipeline stages
 * and what each stage needs in memory (weights, KV cache, workspace); with --tp / --kvp,
 * the PP × KVP × TP process table (runtime/model/tp_shard.h): each rank's grid
 * coordinates, weight shard, KV token range and bytes, or why the model cannot take the
 * degrees.
 *
 * Without --mem the split is the even one every stage computes by default; with --mem
 * (one free-memory size per node, stage order) it is the memory-proportional plan. The
 * weight bytes are exact when the checkpoint is present, else estimated from shapes.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model/config/checkpoint or a model
 * that does not fit the given memory. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/model/tp_shard.h"
#include "runtime/strata_plan_predict.h"

static void usage(FILE *out) {
    fprintf(out, "usage: strata-plan --model DIR (--stages S | --ranges LIST) [options]\n"
                 "\n"
                 "Prints the layer range and memory estimate of each pipeline stage.\n"
                 "\n"
                 "  --model DIR        checkpoint directory (config.json + model.safetensors or\n"
                 "                     model.safetensors.index.json); without weights the sizes\n"
                 "                     are estimated from config.json\n"
                 "  --stages S         number of pipeline stages (1 <= S <= layers)\n"
                 "  --ranges LIST      explicit split, e.g. 0-10,10-28: must be non-empty,\n"
                 "                     non-overlapping and cover every layer\n"
                 "  --split decode     plan the layers so that every stage streams about as\n"
                 "                     many weight bytes per decoded token (the last stage's\n"
                 "                     lm_head counted): strata-stage --split decode takes the\n"
                 "                     same ranges (default even: the same layer count)\n"
                 "  --mem LIST         free memory per node in stage order, e.g. 24G,16G\n"
                 "                     (K/M/G/T = powers of 1024); plans layers in proportion\n"
                 "                     (with --ranges: only reports each node's use)\n"
                 "  --max-seq N        KV tokens per sequence (default 4096)\n"
                 "  --batch B          sequences with KV held at once (default 1)\n"
                 "  --kv-bytes N       bytes per KV element: 2 for f16 / bf16 (default, as\n"
                 "                     strata-stage's --kv-dtype f16), 4 for f32\n"
                 "  --chunk N          prefill chunk rows (strata-stage --chunk-size; default\n"
                 "                     64): the workspace estimate's rows, and what --predict\n"
                 "                     cuts a prompt into (at least one chunk per stage)\n"
                 "  --no-vision        do not count a VL model's vision tower on stage 0\n"
                 "  --tp N             tensor-parallel ranks per stage: 1, 2, 4 or 8 (default 1;\n"
                 "                     --predict prices each stage as a TP group of N devices\n"
                 "                     over an estimated link: perf_device_set_tp)\n"
                 "  --kvp N            KV-parallel groups per stage (default 1; --predict\n"
                 "                     prices each TP rank as KVP over N devices)\n"
                 "  --kvp-tokens N     KV tokens per KVP group, 16 x a power of two (default\n"
                 "                     max-seq / kvp rounded up to one); kvp x kvp-tokens\n"
                 "                     must reach max-seq\n"
                 "  --moe MODE         MoE under TP: expert (experts partitioned, default) or\n"
                 "                     split (every expert's intermediate size split)\n"
                 "  --tensors R        also list global rank R's slice of each of its tensors\n"
                 "                     (what its loader reads)\n"
                 "                     With --tp or --kvp the process table follows the stage\n"
                 "                     table; degrees the model cannot take exit 2 with why.\n"
                 "  --predict          also predict speed (runtime/model/perf_model.h): per\n"
                 "                     stage ms per decode step and per prefill chunk, tokens/s\n"
                 "                     at batch 1 and --batch, time to first token, the\n"
                 "                     bottleneck; needs --profile\n"
                 "  --profile F[,F..]  device profiles (strata-stage --calibrate writes one; or\n"
                 "                     written from a specification): one for every stage, or\n"
                 "                     one per stage in stage order\n"
                 "  --link-latency-us X  one-way latency of every hop (default 50)\n"
                 "  --link-gbps X      bandwidth of every hop in GB/s (default 1.25: 10 GbE)\n"
                 "  --link FILE        every hop's link as a probe measured it (strata-stage\n"
                 "                     --probe-links, strata-stage-bench probe-link --out):\n"
                 "                     its latency, bandwidth and mean time by frame size\n"
                 "  --prompt-tokens N  prompt length for time to first token (default 2048)\n"
                 "  --json             --predict's result as JSON (stages and predicted)\n"
                 "  --hosts FILE       choose the placement (which hosts, their order, their\n"
                 "                     layers, under their memory) for the fastest decode:\n"
                 "                     {\"hosts\": [{\"name\": \"a\", \"profile\": \"a.json\",\n"
                 "                     \"mem\": \"80G\", \"threads\": 16}, ...], \"link\":\n"
                 "                     {\"latency_us\": 200, \"gbps\": 10}}; prints the stages,\n"
                 "                     their strata-stage lines and the prediction beside the\n"
                 "                     even and memory-proportional plans (no --stages needed);\n"
                 "                     a host's \"devices\": 2|4|8 runs its stage as a group of\n"
                 "                     them, TP x KVP as the search finds fastest (KVP's\n"
                 "                     positions per rank follow from --max-seq); \"links\":\n"
                 "                     [{\"between\": [\"a\", \"b\"], \"latency_us\": ..,\n"
                 "                     \"gbps\": ..}, ...] the pairs whose link differs, which\n"
                 "                     the order of the stages then avoids or uses; a link\n"
                 "                     may be {\"probe\": \"FILE\"}, as strata-stage\n"
                 "                     --probe-links wrote it; a host's \"cpus\": \"0-31\"\n"
                 "                     goes into its line as --cpus (one socket, say)\n"
                 "  --goal G           latency (default: one request's tokens/s) or throughput\n"
                 "                     (the pipeline's pace at --batch)\n"
                 "  --help             this text\n"
                 "\n"
                 "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model or does not fit.\n");
}

/* Parses an integer flag; prints and returns -1 when it is bad. */
static int flag_int(const char *flag, const char *text, int lo, int hi, int *out) {
    if (cli_parse_int(text, lo, hi, out) == 0) return 0;
    fprintf(stderr, "strata-plan: %s %s\n", flag, strata_last_error());
    return -1;
}

/* Parses a positive decimal flag in [lo, hi]; prints and returns -1 when it is bad. */
static int flag_double(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end != text && !*end && v >= lo && v <= hi) {
        *out = v;
        return 0;
    }
    fprintf(stderr, "strata-plan: %s wants a number in [%g, %g], got \"%s\"\n", flag, lo, hi, text);
    return -1;
}

/* Splits "24G,16G" into sizes; returns the count or -1. */
static int parse_mem_list(uint64_t *out, int cap, const char *text) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap) {
            fprintf(stderr, "strata-plan: --mem lists more than %d nodes\n", cap);
            return -1;
        }
        if (stage_plan_parse_size(&out[n], tok) != 0) {
            fprintf(stderr, "strata-plan: --mem: %s\n", strata_last_error());
            return -1;
        }
        if (out[n] == 0) {
            fprintf(stderr, "strata-plan: --mem: node %d has zero memory\n", n);
            return -1;
        }
        ++n;
    }
    return n;
}

/* Parses "0-10,10-28" into ranges; returns the count or -1. */
static int parse_ranges(struct stage_range *out, int cap, const char *text) {
    int n = 0;
    const char *p = text;
    while (*p) {
        int start, end, used = 0;
        if (n == cap || sscanf(p, "%d-%d%n", &start, &end, &used) != 2 || used == 0) {
            fprintf(stderr,
                    "strata-plan: --ranges: expected START-END[,START-END...], got \"%s\"\n", text);
            return -1;
        }
        out[n].layer_start = start;
        out[n].layer_end = end;
        ++n;
        p += used;
        if (*p == ',') {
            ++p;
        } else if (*p) {
            fprintf(stderr, "strata-plan: --ranges: unexpected \"%s\"\n", p);
            return -1;
        }
    }
    return n;
}

static int has_weights(const char *dir) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &sb) == 0) return 1;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return stat(path, &sb) == 0;
}

/* The plan's table; "streamed" is the weight bytes the stage reads per decoded token
 * (stage_plan_streamed_bytes): the slowest stage's sets a full pipeline's pace. */
static void print_plan(const struct stage_plan *plan, const struct stage_memory_model *mm,
                       int with_memory) {
    char w[32], kv[32], ws[32], total[32], mem[32], streamed[32];
    printf("%-6s %-12s %6s  %11s %11s %11s %11s %11s", "stage", "layers", "count", "weights", "kv",
           "workspace", "total", "streamed");
    if (with_memory) printf(" %11s %6s", "memory", "used");
    printf("\n");
    for (int s = 0; s < plan->num_stages; ++s) {
        const struct stage_plan_entry *e = &plan->stages[s];
        char range[32];
        snprintf(range, sizeof range, "[%d, %d)", e->range.layer_start, e->range.layer_end);
        stage_plan_format_size(w, sizeof w, e->weight_bytes);
        stage_plan_format_size(kv, sizeof kv, e->kv_bytes);
        stage_plan_format_size(ws, sizeof ws, e->workspace_bytes);
        stage_plan_format_size(total, sizeof total, e->total_bytes);
        stage_plan_format_size(streamed, sizeof streamed,
                               stage_plan_streamed_bytes(mm, s, plan->num_stages,
                                                         e->range.layer_start, e->range.layer_end));
        printf("%-6d %-12s %6d  %11s %11s %11s %11s %11s", s, range,
               e->range.layer_end - e->range.layer_start, w, kv, ws, total, streamed);
        if (with_memory) {
            stage_plan_format_size(mem, sizeof mem, e->memory_bytes);
            printf(" %11s %5.1f%%", mem, 100.0 * (double)e->total_bytes / (double)e->memory_bytes);
        }
        printf("\n");
    }
}

static int parse_moe(const char *text, enum tp_moe_mode *out) {
    if (strcmp(text, "expert") == 0) {
        *out = TP_MOE_EXPERT_PARALLEL;
    } else if (strcmp(text, "split") == 0) {
        *out = TP_MOE_SPLIT;
    } else {
        fprintf(stderr, "strata-plan: --moe must be expert or split, got \"%s\"\n", text);
        return -1;
    }
    return 0;
}

struct plan_args {
    const char *model, *mem_text, *ranges_text;
    int stages, kv_bytes, no_vision;
    int split_decode; /* --split decode */
    int grid_asked;   /* --tp, --kvp or --kvp-tokens given */
    int tensors_rank; /* --tensors R: list rank R's slice of every tensor, -1 = no */
    struct grid_config grid;
    struct stage_memory_options opt;
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    uint64_t mem[STAGE_PLAN_MAX_STAGES];
    int predict; /* --predict */
    struct plan_predict_args predict_args;
};

/* Reads the options into *a. Returns -1 to go on, else the exit code. */
static int parse_options(struct plan_args *a, int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"stages", required_argument, 0, 's'},
        {"mem", required_argument, 0, 'M'},
        {"max-seq", required_argument, 0, 'q'},
        {"batch", required_argument, 0, 'b'},
        {"kv-bytes", required_argument, 0, 'k'},
        {"chunk", required_argument, 0, 'c'},
        {"no-vision", no_argument, 0, 'V'},
        {"ranges", required_argument, 0, 'r'},
        {"tp", required_argument, 0, 't'},
        {"kvp", required_argument, 0, 'K'},
        {"kvp-tokens", required_argument, 0, 'T'},
        {"moe", required_argument, 0, 'E'},
        {"tensors", required_argument, 0, 'R'},
        {"split", required_argument, 0, 'S'},
        {"predict", no_argument, 0, 'P'},
        {"profile", required_argument, 0, 'F'},
        {"link-latency-us", required_argument, 0, 'L'},
        {"link-gbps", required_argument, 0, 'G'},
        {"link", required_argument, 0, 'l'},
        {"prompt-tokens", required_argument, 0, 'N'},
        {"json", no_argument, 0, 'J'},
        {"hosts", required_argument, 0, 'H'},
        {"goal", required_argument, 0, 'g'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 's': bad = flag_int("--stages", optarg, 1, STAGE_PLAN_MAX_STAGES, &a->stages); break;
        case 'M': a->mem_text = optarg; break;
        case 'r': a->ranges_text = optarg; break;
        case 'q': bad = flag_int("--max-seq", optarg, 1, 1 << 30, &a->opt.max_seq); break;
        case 'b': bad = flag_int("--batch", optarg, 1, 1 << 20, &a->opt.batch); break;
        case 'k': bad = flag_int("--kv-bytes", optarg, 1, 8, &a->kv_bytes); break;
        case 'c': bad = flag_int("--chunk", optarg, 1, 1 << 24, &a->opt.chunk_tokens); break;
        case 'V': a->no_vision = 1; break;
        case 't': bad = flag_int("--tp", optarg, 1, GRID_MAX_DEGREE, &a->grid.tp); break;
        case 'K': bad = flag_int("--kvp", optarg, 1, GRID_MAX_DEGREE, &a->grid.kvp); break;
        case 'T': bad = flag_int("--kvp-tokens", optarg, 1, 1 << 30, &a->grid.kvp_tokens); break;
        case 'E': bad = parse_moe(optarg, &a->grid.moe); break;
        case 'R': bad = flag_int("--tensors", optarg, 0, 1 << 20, &a->tensors_rank); break;
        case 'S':
            bad = strcmp(optarg, "even") && strcmp(optarg, "decode");
            if (bad) fprintf(stderr, "strata-plan: --split wants even or decode\n");
            a->split_decode = !strcmp(optarg, "decode");
            break;
        case 'P': a->predict = 1; break;
        case 'F': a->predict_args.profiles = optarg; break;
        case 'L': /* given figures price every hop: a --link file's probed sizes no longer */
            bad =
                flag_double("--link-latency-us", optarg, 0, 1e7, &a->predict_args.link.latency_us);
            a->predict_args.link.mean_us.n = 0;
            break;
        case 'G':
            bad = flag_double("--link-gbps", optarg, 1e-6, 1e6, &a->predict_args.link.gbps);
            a->predict_args.link.mean_us.n = 0;
            break;
        case 'l':
            if ((bad = perf_link_load(&a->predict_args.link, optarg) < 0))
                fprintf(stderr, "strata-plan: --link: %s\n", strata_last_error());
            break;
        case 'N':
            bad =
                flag_int("--prompt-tokens", optarg, 1, 1 << 24, &a->predict_args.opt.prompt_tokens);
            break;
        case 'J': a->predict_args.json = 1; break;
        case 'H': a->predict_args.hosts = optarg; break;
        case 'g':
            bad = strcmp(optarg, "latency") && strcmp(optarg, "throughput");
            if (bad) fprintf(stderr, "strata-plan: --goal wants latency or throughput\n");
            a->predict_args.goal =
                strcmp(optarg, "throughput") ? PERF_GOAL_LATENCY : PERF_GOAL_THROUGHPUT;
            break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
        if (bad) return 2;
        if (c == 't' || c == 'K' || c == 'T' || c == 'R') a->grid_asked = 1;
        if (c == 'L' || c == 'G' || c == 'l') a->predict_args.link_given = 1;
    }
    if (optind < argc) {
        fprintf(stderr, "strata-plan: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* Parses the command line and checks the lists against --stages. Returns -1 to go on, else
 * the exit code. */
static int parse_args(struct plan_args *a, int argc, char **argv) {
    int rc = parse_options(a, argc, argv);
    if (rc >= 0) return rc;
    if (a->ranges_text) {
        int n = parse_ranges(a->ranges, STAGE_PLAN_MAX_STAGES, a->ranges_text);
        if (n < 0) return STRATA_EXIT_USAGE;
        if (a->stages && a->stages != n) {
            fprintf(stderr, "strata-plan: --ranges lists %d stages but --stages is %d\n", n,
                    a->stages);
            return STRATA_EXIT_USAGE;
        }
        a->stages = n;
    }
    if (a->predict_args.hosts) { /* the placement chooses the stages */
        if (!a->model || a->stages || a->ranges_text || a->mem_text || a->grid_asked ||
            a->predict_args.profiles) {
            fprintf(stderr, "strata-plan: --hosts chooses the stages: give --model, not "
                            "--stages / --ranges / --mem / --profile / --tp / --kvp\n");
            return STRATA_EXIT_USAGE;
        }
        a->predict = 1;
        a->opt.kv_dtype_bytes = (size_t)a->kv_bytes;
        a->opt.with_vision = !a->no_vision;
        a->predict_args.opt.batch = a->opt.batch;
        a->predict_args.opt.chunk_tokens = a->opt.chunk_tokens;
        a->predict_args.opt.kv_bytes = a->kv_bytes;
        a->predict_args.max_seq = a->opt.max_seq;
        return -1;
    }
    if (!a->model || a->stages == 0) {
        fprintf(stderr, "strata-plan: --model and --stages (or --ranges) are required\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    if (a->split_decode && (a->mem_text || a->ranges_text)) {
        fprintf(stderr, "strata-plan: --split decode chooses the ranges itself: not with --mem "
                        "or --ranges\n");
        return STRATA_EXIT_USAGE;
    }
    if (a->mem_text && (a->grid.tp > 1 || a->grid.kvp > 1)) {
        fprintf(stderr, "strata-plan: --mem plans whole stages; with --tp/--kvp the process "
                        "table gives each rank's need instead\n");
        return STRATA_EXIT_USAGE;
    }
    if (a->predict != !!a->predict_args.profiles || (a->predict_args.json && !a->predict)) {
        fprintf(stderr, "strata-plan: --predict needs --profile (and --profile / --json need "
                        "--predict)\n");
        return STRATA_EXIT_USAGE;
    }
    a->predict_args.opt.batch = a->opt.batch;
    a->predict_args.opt.chunk_tokens = a->opt.chunk_tokens;
    a->predict_args.opt.kv_bytes = a->kv_bytes;
    a->opt.kv_dtype_bytes = (size_t)a->kv_bytes;
    a->opt.with_vision = !a->no_vision;
    if (a->mem_text) {
        int n_mem = parse_mem_list(a->mem, STAGE_PLAN_MAX_STAGES, a->mem_text);
        if (n_mem < 0) return STRATA_EXIT_USAGE;
        if (n_mem != a->stages) {
            fprintf(stderr, "strata-plan: --mem lists %d nodes but --stages is %d\n", n_mem,
                    a->stages);
            return STRATA_EXIT_USAGE;
        }
    }
    return -1;
}

/* What open_model loads and main frees. */
struct plan_model {
    struct safetensors *st;
    struct stage_memory_model *mm;
    struct stage_plan *plan;
    struct model_config *cfg;
    struct stage_tensor_list list;
    int weights;
};

/* Loads the config and, when present, checks the checkpoint; builds the memory model.
 * Returns -1 to go on, else the exit code (after printing why). */
static int open_model(struct plan_model *m, const struct plan_args *a) {
    m->mm = calloc(1, sizeof *m->mm);
    m->plan = calloc(1, sizeof *m->plan);
    m->cfg = calloc(1, sizeof *m->cfg);
    if (!m->mm || !m->plan || !m->cfg) {
        fprintf(stderr, "strata-plan: out of memory\n");
        return STRATA_EXIT_FAILURE;
    }
    if (model_config_load(m->cfg, a->model) != 0) goto fail;
    m->weights = has_weights(a->model);
    if (m->weights) {
        if (safetensors_open(&m->st, a->model) != 0) goto fail;
        struct stage_role all = {0, m->cfg->num_layers, 1, 1,
                                 a->opt.with_vision && m->cfg->has_vision};
        if (stage_tensor_list_build(&m->list, m->cfg, &all, m->st) != 0) goto fail;
        if (stage_tensor_list_check(&m->list, m->st, a->model) != 0) {
            fprintf(stderr, "strata-plan: %s\n", strata_last_error());
            fprintf(stderr, "strata-plan: every problem in %s:\n", a->model);
            stage_tensor_list_report(stderr, &m->list, m->st);
            return STRATA_EXIT_INPUT;
        }
    }
    if (stage_memory_model_build(m->mm, m->cfg, m->st, &a->opt) != 0) goto fail;
    return -1;
fail:
    fprintf(stderr, "strata-plan: %s\n", strata_last_error());
    return STRATA_EXIT_INPUT;
}

/* Prices the chosen split into m->plan and names it in *how. Returns -1 to go on, else the
 * exit code (after printing why). */
static int make_plan(struct plan_model *m, struct plan_args *a, const char **how) {
    int stages = a->stages;
    if (stages > m->cfg->num_layers) {
        fprintf(stderr, "strata-plan: %d stages for %d layers: every stage needs a layer\n", stages,
                m->cfg->num_layers);
        return STRATA_EXIT_USAGE;
    }
    *how = "even split";
    if (a->ranges_text) {
        *how = "explicit ranges";
        if (stage_plan_check_ranges(a->ranges, stages, m->cfg->num_layers, 1) != 0) {
            fprintf(stderr, "strata-plan: --ranges: %s\n", strata_last_error());
            return STRATA_EXIT_USAGE;
        }
        if (stage_plan_price(m->plan, m->mm, a->ranges, stages) != 0) goto fail;
        for (int s = 0; s < stages && a->mem_text; ++s)
            m->plan->stages[s].memory_bytes = a->mem[s];
    } else if (a->mem_text) {
        *how = "memory-proportional split";
        if (stage_plan_balanced(m->plan, m->mm, a->mem, stages) != 0) goto fail;
    } else if (a->split_decode) {
        *how = "decode-balanced split (the streamed bytes per token)";
        if (stage_plan_decode(a->ranges, m->mm, stages) != 0 ||
            stage_plan_price(m->plan, m->mm, a->ranges, stages) != 0)
            goto fail;
    } else if (stage_plan_even(a->ranges, m->cfg->num_layers, stages) != 0 ||
               stage_plan_price(m->plan, m->mm, a->ranges, stages) != 0) {
        goto fail;
    }
    return -1;
fail:
    fprintf(stderr, "strata-plan: %s\n", strata_last_error());
    return STRATA_EXIT_INPUT;
}

/* Prints the model, the options and the plan; returns the exit code (3 when a stage does
 * not fit its node). */
static int print_report(const struct plan_model *m, const struct plan_args *a, const char *how) {
    char desc[512], total[32];
    model_config_describe(m->cfg, desc, sizeof desc);
    printf("model     %s\n", desc);
    if (m->weights) {
        stage_plan_format_size(total, sizeof total, stage_tensor_list_bytes(&m->list, m->st));
        printf("weights   %s: %d tensors checked, %s%s\n", a->model, m->list.count, total,
               m->list.head_is_embed ? " (LM head = tied embedding)" : "");
    } else {
        printf("weights   none in %s: sizes estimated from config.json shapes (%s)\n", a->model,
               m->cfg->torch_dtype[0] ? m->cfg->torch_dtype : "bf16 assumed");
    }
    printf("kv        %d B/element, max-seq %d, batch %d; workspace for %d-token steps\n",
           a->kv_bytes, a->opt.max_seq, a->opt.batch, a->opt.chunk_tokens);
    printf("plan      %s of %d layers over %d stages\n\n", how, m->cfg->num_layers, a->stages);
    print_plan(m->plan, m->mm, a->mem_text != NULL);
    int exit_code = STRATA_EXIT_OK;
    for (int s = 0; s < a->stages && a->mem_text; ++s) {
        if (m->plan->stages[s].total_bytes > m->plan->stages[s].memory_bytes) {
            fprintf(stderr, "strata-plan: stage %d does not fit its node's memory\n", s);
            exit_code = STRATA_EXIT_INPUT;
        }
    }
    return exit_code;
}

/* "[a, b)" into buf, with "x2" appended when each item is held by 2 ranks. */
static const char *range_text(char *buf, size_t cap, struct tp_range r, int replicas) {
    if (r.end <= r.start) {
        snprintf(buf, cap, "-");
    } else if (replicas > 1) {
        snprintf(buf, cap, "[%d,%d)x%d", r.start, r.end, replicas);
    } else {
        snprintf(buf, cap, "[%d,%d)", r.start, r.end);
    }
    return buf;
}

static void print_shard_summary(const struct model_config *cfg, const struct grid_config *g) {
    struct tp_shard sh;
    tp_shard_init(&sh, cfg, g->tp, 0, g->moe); /* checked by grid_config_check */
    printf("grid      PP %d x KVP %d x TP %d = %d processes (global rank = (stage * KVP + "
           "kvp) * TP + tp)\n",
           g->pp, g->kvp, g->tp, g->world);
    printf("tp shard  per rank: %d of %d query heads, %d of %d KV heads%s, ", sh.q_heads.end,
           cfg->num_heads, sh.kv_heads.end - sh.kv_heads.start, cfg->num_kv_heads,
           sh.kv_replicas > 1 ? " (replicated: fewer KV heads than TP ranks)" : "");
    if (sh.ffn.end > 0) printf("%d of %d MLP columns, ", sh.ffn.end, cfg->intermediate_size);
    if (sh.experts.end > 0) {
        if (g->moe == TP_MOE_EXPERT_PARALLEL)
            printf("%d of %d experts whole (expert parallel), ", sh.experts.end, cfg->num_experts);
        else
            printf("all %d experts, %d of %d columns each (split), ", cfg->num_experts,
                   sh.expert_ffn.end, cfg->moe_intermediate_size);
    }
    printf("%d of %d vocab rows; norms, router, o_proj bias%s replicated\n", sh.vocab.end,
           cfg->vocab_size, cfg->has_vision ? " and the vision tower (not split)" : "");
    printf("kvp       %d tokens per KVP group\n\n", g->kvp_tokens);
}

/* The process table: one line per global rank. */
static int print_grid(const struct plan_model *m, const struct plan_args *a) {
    struct grid_config g = a->grid;
    print_shard_summary(m->cfg, &g);
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    for (int s = 0; s < g.pp; ++s)
        ranges[s] = m->plan->stages[s].range;
    printf("%-5s %-5s %-4s %-3s %-9s %-9s %-10s %-11s %-12s %-12s %-15s %10s %10s %10s\n", "rank",
           "stage", "kvp", "tp", "layers", "q-heads", "kv-heads", "mlp-cols", "experts", "vocab",
           "kv-tokens", "weights", "kv", "total");
    for (int r = 0; r < g.world; ++r) {
        struct grid_plan_entry e;
        if (grid_plan_price_rank(&e, m->cfg, m->st, &g, ranges, &a->opt, r) != 0) {
            fprintf(stderr, "strata-plan: %s\n", strata_last_error());
            return STRATA_EXIT_INPUT;
        }
        char lay[32], q[32], kv[40], ffn[32], ex[48], voc[32], tok[32], w[32], kvb[32], tot[32];
        snprintf(lay, sizeof lay, "[%d,%d)", e.range.layer_start, e.range.layer_end);
        range_text(ffn, sizeof ffn, e.shard.ffn, 1);
        range_text(ex, sizeof ex, e.shard.experts, 1);
        if (g.moe == TP_MOE_SPLIT && e.shard.experts.end > 0) { /* all experts, some columns */
            char cols[32];
            snprintf(ex, sizeof ex, "all:%s", range_text(cols, sizeof cols, e.shard.expert_ffn, 1));
        }
        stage_plan_format_size(w, sizeof w, e.weight_bytes);
        stage_plan_format_size(kvb, sizeof kvb, e.kv_bytes);
        stage_plan_format_size(tot, sizeof tot, e.total_bytes);
        printf("%-5d %-5d %-4d %-3d %-9s %-9s %-10s %-11s %-12s %-12s %-15s %10s %10s %10s\n", r,
               e.coords.stage, e.coords.kvp_rank, e.coords.tp_rank, lay,
               range_text(q, sizeof q, e.shard.q_heads, 1),
               range_text(kv, sizeof kv, e.shard.kv_heads, e.shard.kv_replicas), ffn, ex,
               range_text(voc, sizeof voc, e.shard.vocab, 1),
               range_text(tok, sizeof tok, e.kv_tokens, 1), w, kvb, tot);
    }
    printf("\n(kv-heads [a,b)xN: held by N ranks; experts all:[a,b): every expert, those "
           "columns; weights: the rank's slices of its stage's tensors; kv: its KV heads over "
           "its tokens at --max-seq; total adds the stage's workspace)\n");
    return STRATA_EXIT_OK;
}

/* Every tensor rank `rank` loads and which part of it (runtime/model/tp_shard.h). */
static int print_rank_tensors(const struct plan_model *m, const struct plan_args *a, int rank) {
    const struct grid_config *g = &a->grid;
    if (rank >= g->world) {
        fprintf(stderr, "strata-plan: --tensors %d: the grid has ranks 0 to %d\n", rank,
                g->world - 1);
        return STRATA_EXIT_USAGE;
    }
    struct grid_coords c;
    grid_coords_of(&c, g, rank);
    struct tp_shard sh;
    struct stage_tensor_list list = {0};
    const struct stage_range *r = &m->plan->stages[c.stage].range;
    struct stage_role role = {r->layer_start, r->layer_end, c.stage == 0, c.stage == g->pp - 1,
                              c.stage == 0 && a->opt.with_vision && m->cfg->has_vision};
    if (tp_shard_init(&sh, m->cfg, g->tp, c.tp_rank, g->moe) != 0 ||
        stage_tensor_list_build(&list, m->cfg, &role, m->st) != 0) {
        fprintf(stderr, "strata-plan: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    printf("\ntensors of rank %d (stage %d, kvp %d, tp %d):\n", rank, c.stage, c.kvp_rank,
           c.tp_rank);
    for (int i = 0; i < list.count; ++i) {
        const struct stage_tensor *t = &list.items[i];
        const struct st_tensor *stored = m->st ? safetensors_find(m->st, t->name) : NULL;
        struct tp_slice sl;
        tp_tensor_slice(&sl, &sh, t, stored ? stage_tensor_stored_layout(t, stored) : t->layout);
        if (sl.kind == TP_SLICE_ABSENT) continue;
        printf("  %-60s ", t->name);
        if (sl.kind == TP_SLICE_REPLICATED) {
            printf("whole\n");
        } else if (sl.parts == 1) {
            printf("dim %d [%lld, %lld) of %lld\n", sl.dim, (long long)sl.start,
                   (long long)(sl.start + sl.count), (long long)sl.extent);
        } else {
            printf("dim %d [%lld, %lld) and [%lld, %lld) of %lld\n", sl.dim, (long long)sl.start,
                   (long long)(sl.start + sl.count), (long long)(sl.start + sl.part_stride),
                   (long long)(sl.start + sl.part_stride + sl.count), (long long)sl.extent);
        }
    }
    stage_tensor_list_free(&list);
    return STRATA_EXIT_OK;
}

/* Checks the degrees against the model; returns -1 to go on, else the exit code. */
static int check_grid(struct plan_args *a, const struct model_config *cfg) {
    if (a->grid.tp == 0) a->grid.tp = 1;
    if (a->grid.kvp == 0) a->grid.kvp = 1;
    a->grid.pp = a->stages;
    if (!a->grid_asked || a->stages > cfg->num_layers) return -1; /* make_plan says why */
    if (grid_config_check(&a->grid, cfg, a->opt.max_seq) != 0) {
        fprintf(stderr, "strata-plan: the model cannot run on this grid: %s\n",
                strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

int main(int argc, char **argv) {
    static struct plan_args a = {
        .kv_bytes = 2, /* strata-stage's default KV is f16 */
        .tensors_rank = -1,
        .opt = {2, 4096, 1, STAGE_PLAN_DEFAULT_CHUNK, 1},
        .predict_args = {.link = {.latency_us = 50, .gbps = 1.25}, .opt = {.prompt_tokens = 2048}}};
    struct plan_model m = {0};
    const char *how = NULL;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    rc = open_model(&m, &a);
    if (rc < 0 && a.predict_args.hosts) {
        rc = plan_print_placement(m.cfg, m.mm, a.model, &a.predict_args);
        goto out;
    }
    if (rc < 0) rc = check_grid(&a, m.cfg);
    if (rc < 0) rc = make_plan(&m, &a, &how);
    if (rc < 0 && !a.predict_args.json) rc = print_report(&m, &a, how);
    if ((rc < 0 || rc == STRATA_EXIT_OK) && a.predict) {
        a.predict_args.tp = a.grid.tp;
        a.predict_args.kvp = a.grid.kvp;
        a.predict_args.kvp_tokens = a.grid.kvp_tokens; /* check_grid's, when --kvp was given */
        a.predict_args.max_seq = a.opt.max_seq;
        rc = plan_print_prediction(m.cfg, m.plan, &a.predict_args);
    }
    if (rc == STRATA_EXIT_OK && a.grid_asked) {
        printf("\n");
        rc = print_grid(&m, &a);
        if (rc == STRATA_EXIT_OK && a.tensors_rank >= 0)
            rc = print_rank_tensors(&m, &a, a.tensors_rank);
    }
out:
    stage_tensor_list_free(&m.list);
    safetensors_close(m.st);
    free(m.cfg);
    free(m.plan);
    free(m.mm);
    return rc;
}
