/* strata-plan --predict (see strata_plan_predict.h). */
#include "runtime/strata_plan_predict.h"

#include <math.h>
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
    char probed[64] = "";
    if (pa->link.mean_us.n)
        snprintf(probed, sizeof probed, ", probed at %d frame sizes", pa->link.mean_us.n);
    printf("\npredicted (runtime/model/perf_model.h; link %.0f us, %.2f GB/s%s; prompt %d tokens "
           "in chunks of %d):\n",
           pa->link.latency_us, pa->link.gbps, probed, pa->opt.prompt_tokens, p->chunk_rows);
    printf("%-6s %-12s %-34s %12s %12s", "stage", "layers", "device", "MB/token", "ms/step b=1");
    if (B > 1) printf(" %9s b=%-3d", "ms/step", perf_rows_per_step(B, S));
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
        "\"batch\": %d, \"ttft_ms\": %.4f, \"prompt_tokens\": %d, \"chunk_rows\": %d, "
        "\"hop_ms\": %.4f, \"bottleneck_stage\": %d}}\n",
        p->tokens_per_s_1, p->tokens_per_s_b, pa->opt.batch, p->ttft_ms, pa->opt.prompt_tokens,
        p->chunk_rows, p->hop_ms_1, p->bottleneck_stage);
}

int plan_print_prediction(const struct model_config *cfg, const struct stage_plan *plan,
                          const struct plan_predict_args *pa) {
    const int S = plan->num_stages;
    struct perf_device *d = calloc((size_t)S, sizeof *d);
    struct perf_layers *pl = calloc(1, sizeof *pl);
    struct perf_prediction *p = calloc(1, sizeof *p);
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    int code = d && pl && p ? load_profiles(d, S, pa->profiles) : STRATA_EXIT_FAILURE;
    for (int s = 0; code < 0 && (pa->tp > 1 || pa->kvp > 1) && s < S; s++) {
        perf_device_set_tp(&d[s], pa->tp > 1 ? pa->tp : 1, NULL);
        if (pa->kvp > 1)
            perf_device_set_kvp(&d[s], pa->kvp, pa->kvp_tokens, pa->max_seq,
                                fmin(perf_options_context(&pa->opt), pa->max_seq));
    }
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

static int tp_of(const struct perf_device *d) {
    return d->tp > 1 ? d->tp : 1;
}

static int kvp_of(const struct perf_device *d) {
    return d->kvp > 1 ? d->kvp : 1;
}

/* A host of N devices: the TP t x KVP k groups (t k = N) this model and --max-seq allow, TP
 * first, into x->choice; its dev becomes the first (the even and memory plans run it). 0, or
 * the largest TP's refusal when none fits. */
static int host_choices(struct perf_host *x, const struct model_config *cfg, int max_seq,
                        double context) {
    const int n = x->dev.tp > 1 ? x->dev.tp : 1;
    x->n_choices = 0;
    if (n == 1) return 0;
    for (int k = 1; k <= n && x->n_choices < PERF_MAX_CHOICES; k *= 2) {
        struct grid_config grid = {.pp = 1, .tp = n / k, .kvp = k, .moe = TP_MOE_EXPERT_PARALLEL};
        if (grid_config_check(&grid, cfg, max_seq)) continue;
        struct perf_device *c = &x->choice[x->n_choices++];
        *c = x->dev;
        c->tp = n / k;
        perf_device_set_kvp(c, k, grid.kvp_tokens, max_seq, context);
    }
    if (x->n_choices == 0) { /* the reason TP over all of them fails, as the error */
        struct grid_config all = {.pp = 1, .tp = n, .kvp = 1, .moe = TP_MOE_EXPERT_PARALLEL};
        return grid_config_check(&all, cfg, max_seq);
    }
    x->dev = x->choice[0];
    return 0;
}

/* The prediction of given ranges on the hosts in file order (the even / memory plans). */
static int predict_on(struct perf_prediction *p, const struct perf_layers *pl,
                      const struct perf_hosts *h, const struct stage_range *ranges, int S,
                      const struct perf_options *opt) {
    struct perf_device devs[STAGE_PLAN_MAX_STAGES];
    struct perf_link hops[STAGE_PLAN_MAX_STAGES];
    int order[STAGE_PLAN_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        devs[s] = h->host[s].dev;
        order[s] = s;
    }
    perf_hosts_ring(hops, h, order, S);
    return perf_predict_hops(p, pl, ranges, S, devs, hops, opt);
}

static void compare_row(const char *what, const struct perf_prediction *p, const char *why, int B) {
    if (why) {
        printf("  %-30s %s\n", what, why);
        return;
    }
    printf("  %-30s %9.1f tok/s at batch 1", what, p->tokens_per_s_1);
    if (B > 1) printf(", %9.1f at batch %d", p->tokens_per_s_b, B);
    printf(", first token %.0f ms\n", p->ttft_ms);
}

int plan_print_placement(const struct model_config *cfg, const struct stage_memory_model *mm,
                         const char *model_dir, const struct plan_predict_args *pa) {
    struct perf_hosts *h = calloc(1, sizeof *h);
    struct perf_layers *pl = calloc(1, sizeof *pl);
    struct perf_placement *best = calloc(1, sizeof *best);
    struct perf_prediction *even = calloc(1, sizeof *even), *prop = calloc(1, sizeof *prop);
    struct stage_plan *plan = calloc(1, sizeof *plan);
    int code = STRATA_EXIT_OK;
    if (!h || !pl || !best || !even || !prop || !plan) {
        code = STRATA_EXIT_FAILURE;
        goto done;
    }
    if (perf_hosts_load(h, pa->hosts) || perf_layers_build(pl, cfg)) {
        fprintf(stderr, "strata-plan: --hosts: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    for (int x = 0; x < h->n; x++) { /* a host's devices must split this model some way */
        const int devices = h->host[x].dev.tp;
        const double context = fmin(perf_options_context(&pa->opt), pa->max_seq);
        if (host_choices(&h->host[x], cfg, pa->max_seq, context)) {
            fprintf(stderr,
                    "strata-plan: --hosts: %s (%d devices): %s (and no KV-parallel split "
                    "of them fits either)\n",
                    h->host[x].name, devices, strata_last_error());
            code = STRATA_EXIT_INPUT;
            goto done;
        }
    }
    if (pa->link_given) h->link = pa->link;
    if (perf_place(best, pl, mm, h, &pa->opt, pa->goal)) {
        fprintf(stderr, "strata-plan: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    const int S = best->num_stages, B = pa->opt.batch > 1 ? pa->opt.batch : 1, n = h->n;
    /* beside it: every host in file order, even split and memory-proportional */
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    uint64_t mem[STAGE_PLAN_MAX_STAGES], need[STAGE_PLAN_MAX_STAGES];
    const char *even_why = NULL, *prop_why = NULL;
    char even_buf[160], prop_buf[160];
    int m = n < cfg->num_layers ? n : cfg->num_layers;
    if (stage_plan_even(ranges, cfg->num_layers, m) == 0) {
        int file_order[STAGE_PLAN_MAX_STAGES];
        for (int s = 0; s < m; s++)
            file_order[s] = s;
        struct perf_device devs[STAGE_PLAN_MAX_STAGES];
        for (int s = 0; s < m; s++)
            devs[s] = h->host[file_order[s]].dev;
        perf_place_memory(need, mm, devs, ranges, m, pl->kv_heads);
        for (int s = 0; s < m && !even_why; s++)
            if (need[s] > h->host[s].mem_bytes) {
                snprintf(even_buf, sizeof even_buf, "does not fit: stage %d (%s) needs %.1f GiB", s,
                         h->host[s].name, need[s] / 1073741824.0);
                even_why = even_buf;
            }
        if (!even_why && predict_on(even, pl, h, ranges, m, &pa->opt)) even_why = "(failed)";
    }
    for (int s = 0; s < m; s++) /* a TP x KVP group's stage has its devices' memory */
        mem[s] = h->host[s].mem_bytes * (uint64_t)tp_of(&h->host[s].dev) *
                 (uint64_t)kvp_of(&h->host[s].dev);
    if (stage_plan_balanced(plan, mm, mem, m) == 0) {
        for (int s = 0; s < m; s++)
            ranges[s] = plan->stages[s].range;
        if (predict_on(prop, pl, h, ranges, m, &pa->opt)) prop_why = "(failed)";
    } else {
        snprintf(prop_buf, sizeof prop_buf, "does not fit: %.100s", strata_last_error());
        prop_why = prop_buf;
    }
    if (pa->json) {
        printf("{\"stages\": [");
        for (int s = 0; s < S; s++)
            printf("%s\n  {\"host\": \"%s\", \"cpus\": \"%s\", \"layers\": [%d, %d], \"tp\": %d, "
                   "\"kvp\": %d, \"memory_bytes\": %llu, \"decode_ms_batch1\": %.4f}",
                   s ? "," : "", h->host[best->host[s]].name, h->host[best->host[s]].cpus,
                   best->ranges[s].layer_start, best->ranges[s].layer_end, tp_of(&best->dev[s]),
                   kvp_of(&best->dev[s]), (unsigned long long)best->stage_bytes[s],
                   best->pred.stages[s].decode_ms_1);
        printf("],\n \"predicted\": {\"decode_tokens_per_s\": %.4f, "
               "\"decode_tokens_per_s_batch\": %.4f, \"batch\": %d, \"ttft_ms\": %.4f, "
               "\"bottleneck_stage\": %d},\n \"even\": ",
               best->pred.tokens_per_s_1, best->pred.tokens_per_s_b, B, best->pred.ttft_ms,
               best->pred.bottleneck_stage);
        if (even_why)
            printf("null");
        else
            printf("{\"decode_tokens_per_s\": %.4f, \"ttft_ms\": %.4f}", even->tokens_per_s_1,
                   even->ttft_ms);
        printf(",\n \"memory_proportional\": ");
        if (prop_why)
            printf("null}\n");
        else
            printf("{\"decode_tokens_per_s\": %.4f, \"ttft_ms\": %.4f}}\n", prop->tokens_per_s_1,
                   prop->ttft_ms);
        goto done;
    }
    printf("placement for %s latency over %d host(s) (%s; %.0f orders tried; link %.0f us, %.2f "
           "GB/s):\n",
           pa->goal == PERF_GOAL_THROUGHPUT ? "throughput, then" : "lowest", n,
           n <= PERF_PLACE_EXACT_HOSTS ? "every ordered subset" : "the file's order, prefixes",
           best->orders_tried, h->link.latency_us, h->link.gbps);
    printf("%-6s %-16s %-12s %6s %12s %12s %12s\n", "stage", "host", "layers", "TPxKVP", "memory",
           "of device", "ms/step b=1");
    for (int s = 0; s < S; s++) {
        const struct perf_host *x = &h->host[best->host[s]];
        char range[32], need_s[32], have[32];
        snprintf(range, sizeof range, "[%d, %d)", best->ranges[s].layer_start,
                 best->ranges[s].layer_end);
        stage_plan_format_size(need_s, sizeof need_s, best->stage_bytes[s]);
        stage_plan_format_size(have, sizeof have, x->mem_bytes);
        char grid[32];
        snprintf(grid, sizeof grid, "%dx%d", tp_of(&best->dev[s]), kvp_of(&best->dev[s]));
        printf("%-6d %-16s %-12s %6s %12s %12s %12.2f\n", s, x->name, range, grid, need_s, have,
               best->pred.stages[s].decode_ms_1);
    }
    printf("predicted:\n");
    compare_row("this placement", &best->pred, NULL, B);
    compare_row("even, all hosts in file order", even, even_why, B);
    compare_row("memory-proportional, same", prop, prop_why, B);
    printf("command lines (ports and addresses to adapt; a TP / KVP stage is one process per "
           "device, group rank 0 serving it):\n");
    for (int s = 0; s < S; s++) {
        const struct perf_host *x = &h->host[best->host[s]];
        const struct perf_device *d = &best->dev[s];
        const int t = tp_of(d), k = kvp_of(d), cuda = !strcmp(x->dev.device, "cuda");
        struct grid_config grid = {.pp = 1, .tp = t, .kvp = k, .moe = TP_MOE_EXPERT_PARALLEL};
        if (k > 1) grid_config_check(&grid, cfg, pa->max_seq); /* its kvp_tokens */
        for (int r = 0; r < t * k; r++) { /* group rank r = kvp rank x t + tp rank */
            /* up to 8 peers of 64-character host names */
            char dev[32] = "", tp[1024] = "", ring[160] = "";
            if (cuda) snprintf(dev, sizeof dev, " --device cuda:%d", r);
            size_t used = 0;
            if (t > 1) used = (size_t)snprintf(tp, sizeof tp, " --tp %d --tp-rank %d", t, r % t);
            if (k > 1)
                used += (size_t)snprintf(tp + used, sizeof tp - used,
                                         " --kvp %d --kvp-rank %d --kvp-tokens %d", k, r / t,
                                         grid.kvp_tokens);
            if (t * k > 1) used += (size_t)snprintf(tp + used, sizeof tp - used, " --tp-peers");
            for (int q = 0; t * k > 1 && q < t * k && used < sizeof tp; q++)
                used += (size_t)snprintf(tp + used, sizeof tp - used, "%s%s:%d", q ? "," : " ",
                                         x->name, 7100 + q);
            if (r == 0)
                snprintf(ring, sizeof ring,
                         " --listen 0.0.0.0:7000 --next-host %s --next-port 7000",
                         h->host[best->host[(s + 1) % S]].name);
            printf("  %s: strata-stage --model %s --num-stages %d --stage-idx %d --layer-start %d "
                   "--layer-end %d --threads %d%s%s%s%s%s\n",
                   x->name, model_dir, S, s, best->ranges[s].layer_start, best->ranges[s].layer_end,
                   x->dev.threads > 0 ? x->dev.threads : 1, x->cpus[0] ? " --cpus " : "", x->cpus,
                   dev, tp, ring);
        }
    }
done:
    free(h);
    free(pl);
    free(best);
    free(even);
    free(prop);
    free(plan);
    return code;
}
