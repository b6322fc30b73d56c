/* strata-plan: prints how a model's decoder layers would be split over pipeline stages
 * and what each stage needs in memory (weights, KV cache, workspace).
 *
 * Without --mem the split is the even one every stage computes by default; with --mem
 * (one free-memory size per node, stage order) it is the memory-proportional plan. The
 * weight bytes are exact when the checkpoint is present, else estimated from shapes.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model/config/checkpoint or a model
 * that does not fit the given memory. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/stage_tensors.h"

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
                 "  --mem LIST         free memory per node in stage order, e.g. 24G,16G\n"
                 "                     (K/M/G/T = powers of 1024); plans layers in proportion\n"
                 "                     (with --ranges: only reports each node's use)\n"
                 "  --max-seq N        KV tokens per sequence (default 4096)\n"
                 "  --batch B          sequences with KV held at once (default 1)\n"
                 "  --kv-bytes N       bytes per KV element: 4 for fp32 (default), 2 for bf16\n"
                 "  --chunk N          tokens per forward step for the workspace estimate\n"
                 "                     (default 512)\n"
                 "  --no-vision        do not count a VL model's vision tower on stage 0\n"
                 "  --help             this text\n"
                 "\n"
                 "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model or does not fit.\n");
}

static int parse_int(int *out, const char *text, const char *flag, int lo, int hi) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "strata-plan: %s needs an integer in [%d, %d], got \"%s\"\n", flag, lo, hi,
                text);
        return -1;
    }
    *out = (int)v;
    return 0;
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

static void print_plan(const struct stage_plan *plan, int with_memory) {
    char w[32], kv[32], ws[32], total[32], mem[32];
    printf("%-6s %-12s %6s  %11s %11s %11s %11s", "stage", "layers", "count", "weights", "kv",
           "workspace", "total");
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
        printf("%-6d %-12s %6d  %11s %11s %11s %11s", s, range,
               e->range.layer_end - e->range.layer_start, w, kv, ws, total);
        if (with_memory) {
            stage_plan_format_size(mem, sizeof mem, e->memory_bytes);
            printf(" %11s %5.1f%%", mem, 100.0 * (double)e->total_bytes / (double)e->memory_bytes);
        }
        printf("\n");
    }
}

int main(int argc, char **argv) {
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
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = NULL, *mem_text = NULL, *ranges_text = NULL;
    int stages = 0, kv_bytes = 4, no_vision = 0;
    struct stage_memory_options opt = {4, 4096, 1, 512, 1};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 's':
            if (parse_int(&stages, optarg, "--stages", 1, STAGE_PLAN_MAX_STAGES)) return 2;
            break;
        case 'M': mem_text = optarg; break;
        case 'r': ranges_text = optarg; break;
        case 'q':
            if (parse_int(&opt.max_seq, optarg, "--max-seq", 1, 1 << 30)) return 2;
            break;
        case 'b':
            if (parse_int(&opt.batch, optarg, "--batch", 1, 1 << 20)) return 2;
            break;
        case 'k':
            if (parse_int(&kv_bytes, optarg, "--kv-bytes", 1, 8)) return 2;
            break;
        case 'c':
            if (parse_int(&opt.chunk_tokens, optarg, "--chunk", 1, 1 << 24)) return 2;
            break;
        case 'V': no_vision = 1; break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-plan: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    if (ranges_text) {
        int n = parse_ranges(ranges, STAGE_PLAN_MAX_STAGES, ranges_text);
        if (n < 0) return STRATA_EXIT_USAGE;
        if (stages && stages != n) {
            fprintf(stderr, "strata-plan: --ranges lists %d stages but --stages is %d\n", n,
                    stages);
            return STRATA_EXIT_USAGE;
        }
        stages = n;
    }
    if (!model || stages == 0) {
        fprintf(stderr, "strata-plan: --model and --stages (or --ranges) are required\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    opt.kv_dtype_bytes = (size_t)kv_bytes;
    opt.with_vision = !no_vision;
    uint64_t mem[STAGE_PLAN_MAX_STAGES];
    int n_mem = 0;
    if (mem_text) {
        n_mem = parse_mem_list(mem, STAGE_PLAN_MAX_STAGES, mem_text);
        if (n_mem < 0) return STRATA_EXIT_USAGE;
        if (n_mem != stages) {
            fprintf(stderr, "strata-plan: --mem lists %d nodes but --stages is %d\n", n_mem,
                    stages);
            return STRATA_EXIT_USAGE;
        }
    }

    int exit_code = STRATA_EXIT_INPUT;
    struct safetensors *st = NULL;
    struct stage_memory_model *mm = calloc(1, sizeof *mm);
    struct stage_plan *plan = calloc(1, sizeof *plan);
    struct model_config *cfg = calloc(1, sizeof *cfg);
    struct stage_tensor_list list = {0};
    if (!mm || !plan || !cfg) {
        fprintf(stderr, "strata-plan: out of memory\n");
        exit_code = STRATA_EXIT_FAILURE;
        goto done;
    }
    if (model_config_load(cfg, model) != 0) goto fail;
    int weights = has_weights(model);
    if (weights) {
        if (safetensors_open(&st, model) != 0) goto fail;
        struct stage_role all = {0, cfg->num_layers, 1, 1, opt.with_vision && cfg->has_vision};
        if (stage_tensor_list_build(&list, cfg, &all, st) != 0) goto fail;
        if (stage_tensor_list_check(&list, st, model) != 0) {
            fprintf(stderr, "strata-plan: %s\n", strata_last_error());
            fprintf(stderr, "strata-plan: every problem in %s:\n", model);
            stage_tensor_list_report(stderr, &list, st);
            goto done;
        }
    }
    if (stage_memory_model_build(mm, cfg, st, &opt) != 0) goto fail;
    if (stages > cfg->num_layers) {
        fprintf(stderr, "strata-plan: %d stages for %d layers: every stage needs a layer\n", stages,
                cfg->num_layers);
        exit_code = STRATA_EXIT_USAGE;
        goto done;
    }

    const char *how = "even split";
    if (ranges_text) {
        how = "explicit ranges";
        if (stage_plan_check_ranges(ranges, stages, cfg->num_layers, 1) != 0) {
            fprintf(stderr, "strata-plan: --ranges: %s\n", strata_last_error());
            exit_code = STRATA_EXIT_USAGE;
            goto done;
        }
        if (stage_plan_price(plan, mm, ranges, stages) != 0) goto fail;
        for (int s = 0; s < stages && mem_text; ++s)
            plan->stages[s].memory_bytes = mem[s];
    } else if (mem_text) {
        how = "memory-proportional split";
        if (stage_plan_balanced(plan, mm, mem, stages) != 0) goto fail;
    } else if (stage_plan_even(ranges, cfg->num_layers, stages) != 0 ||
               stage_plan_price(plan, mm, ranges, stages) != 0) {
        goto fail;
    }

    char desc[512], total[32];
    model_config_describe(cfg, desc, sizeof desc);
    printf("model     %s\n", desc);
    if (weights) {
        stage_plan_format_size(total, sizeof total, stage_tensor_list_bytes(&list, st));
        printf("weights   %s: %d tensors checked, %s%s\n", model, list.count, total,
               list.head_is_embed ? " (LM head = tied embedding)" : "");
    } else {
        printf("weights   none in %s: sizes estimated from config.json shapes (%s)\n", model,
               cfg->torch_dtype[0] ? cfg->torch_dtype : "bf16 assumed");
    }
    printf("kv        %d B/element, max-seq %d, batch %d; workspace for %d-token steps\n", kv_bytes,
           opt.max_seq, opt.batch, opt.chunk_tokens);
    printf("plan      %s of %d layers over %d stages\n\n", how, cfg->num_layers, stages);
    print_plan(plan, mem_text != NULL);
    exit_code = STRATA_EXIT_OK;
    for (int s = 0; s < stages && mem_text; ++s) {
        if (plan->stages[s].total_bytes > plan->stages[s].memory_bytes) {
            fprintf(stderr, "strata-plan: stage %d does not fit its node's memory\n", s);
            exit_code = STRATA_EXIT_INPUT;
        }
    }
    goto done;
fail:
    fprintf(stderr, "strata-plan: %s\n", strata_last_error());
done:
    stage_tensor_list_free(&list);
    safetensors_close(st);
    free(cfg);
    free(plan);
    free(mm);
    return exit_code;
}
