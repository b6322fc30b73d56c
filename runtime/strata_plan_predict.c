/* strata-plan --predict (see strata_plan_predict.h). */
#include "runtime/strata_plan_predict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

/* One profile for every stage, or one per stage. Returns the exit code, -1 to go on. */
static int load_profiles(struct perf_device *d, int S, const char *list) {
    char buf[8192];
    if (snprintf(buf, sizeof buf, "%s", list) >= (int)sizeof buf) {
        fprintf(stderr, "strata-plan: --profile list too long\n");
        return STRATA_EXIT_USAGE;
    }
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == S) {
            fprintf(stderr, "strata-plan: --profile lists more than the %d stages\n", S);
            return STRATA_EXIT_USAGE;
        }
        if (perf_device_load(&d[n++], tok)) {
            fprintf(stderr, "strata-plan: --profile: %s\n", strata_last_error());
            return STRATA_EXIT_INPUT;
        }
    }
    if (n != 1 && n != S) {
        fprintf(stderr,
                "strata-plan: --profile gives %d profiles for %d stages (one, or one "
                "per stage)\n",
                n, S);
        return STRATA_EXIT_USAGE;
    }
    for (int s = n; s < S; s++)
        d[s] = d[0];
    return -1;
}

static void print_text(const struct perf_prediction *p, const struct perf_device *d,
                       const struct plan_predict_args *pa) {
    const int B = pa->opt.batch > 1 ? pa->opt.batch : 1, S = p->num_stages;
    printf("\npredicted (runtime/model/perf_model.h; link %.0f us, %.2f GB/s; prompt %d tokens "
           "in chunks of %d):\n",
           pa->link.latency_us, pa->link.gbps, pa->opt.prompt_tokens, pa->opt.chunk_tokens);
    printf("%-6s %-12s %-34s %12s %12s", "stage", "layers", "device", "MB/token", "ms/step b=1");
    if (B > 1) printf(" %9s b=%-3d", "ms/step", (B + S - 1) / S);
    printf(" %14s\n", "ms/prefill chunk");
    for (int s = 0; s < S; s++) {
        const struct perf_stage *st = &p->stages[s];
        char range[32], dev[40];
        snprintf(range, sizeof range, "[%d, %d)", st->range.layer_start, st->range.layer_end);
        snprintf(dev, sizeof dev, "%.24s (%s)", d[s].name, d[s].source);
        printf("%-6d %-12s %-34s %12.1f %12.2f", s, range, dev, st->bytes_per_token / 1e6,
               st->decode_ms_1);
        if (B > 1) printf(" %15.2f", st->decode_ms_b);
        printf(" %14.1f\n", st->prefill_ms_chunk);
    }
    printf("decode: %.1f tokens/s at batch 1", p->tokens_per_s_1);
    if (B > 1) printf(", %.1f tokens/s at batch %d", p->tokens_per_s_b, B);
    printf("; hop %.3f ms\ntime to first token: %.0f ms for %d prompt tokens\n", p->hop_ms_1,
           p->ttft_ms, pa->opt.prompt_tokens);
    if (p->bottleneck_stage >= 0)
        printf("bottleneck: stage %d (%.2f ms of the %.2f ms per token)\n", p->bottleneck_stage,
               p->stages[p->bottleneck_stage].decode_ms_1, 1e3 / p->tokens_per_s_1);
    else
        printf("bottleneck: the links (%d hops of %.3f ms per token)\n", S, p->hop_ms_1);
}

static void print_json(const struct perf_prediction *p, const struct perf_device *d,
                       const struct plan_predict_args *pa) {
    printf("{\"stages\": [");
    for (int s = 0; s < p->num_stages; s++) {
        const struct perf_stage *st = &p->stages[s];
        printf(
            "%s\n  {\"stage\": %d, \"layers\": [%d, %d], \"device\": \"%s\", \"source\": \"%s\", "
            "\"bytes_per_token\": %.0f, \"decode_ms_batch1\": %.4f, \"decode_ms_batch\": %.4f, "
            "\"prefill_ms_chunk\": %.4f}",
            s ? "," : "", s, st->range.layer_start, st->range.layer_end, d[s].name, d[s].source,
            st->bytes_per_token, st->decode_ms_1, st->decode_ms_b, st->prefill_ms_chunk);
    }
    printf(
        "],\n \"predicted\": {\"decode_tokens_per_s\": %.4f, \"decode_tokens_per_s_batch\": %.4f, "
        "\"batch\": %d, \"ttft_ms\": %.4f, \"prompt_tokens\": %d, \"hop_ms\": %.4f, "
        "\"bottleneck_stage\": %d}}\n",
        p->tokens_per_s_1, p->tokens_per_s_b, pa->opt.batch, p->ttft_ms, pa->opt.prompt_tokens,
        p->hop_ms_1, p->bottleneck_stage);
}

int plan_print_prediction(const struct model_config *cfg, const struct stage_plan *plan,
                          const struct plan_predict_args *pa) {
    const int S = plan->num_stages;
    struct perf_device *d = calloc((size_t)S, sizeof *d);
    struct perf_layers *pl = calloc(1, sizeof *pl);
    struct perf_prediction *p = calloc(1, sizeof *p);
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    int code = d && pl && p ? load_profiles(d, S, pa->profiles) : STRATA_EXIT_FAILURE;
    for (int s = 0; s < S; s++)
        ranges[s] = plan->stages[s].range;
    if (code < 0 &&
        (perf_layers_build(pl, cfg) || perf_predict(p, pl, ranges, S, d, &pa->link, &pa->opt))) {
        fprintf(stderr, "strata-plan: --predict: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
    }
    if (code < 0) {
        if (pa->json)
            print_json(p, d, pa);
        else
            print_text(p, d, pa);
        code = STRATA_EXIT_OK;
    }
    free(d);
    free(pl);
    free(p);
    return code;
}
