/* strata-sim: runs a model as a pipeline of S in-process stages over simulated links and
 * checks that every split gives bit-identical tokens and logits to the single-stage run.
 *
 * Each row of its table is one simulated run (sim/pipeline_sim.h): the split, whether its
 * tokens and logits match the single-stage baseline bit for bit, and the simulated TTFT,
 * tokens/s and pipeline utilisation for the given link parameters and the measured
 * compute times. Exit 0 when every run matched, 1 on any difference or failure, 2 on a
 * bad command line, 3 on a bad model directory. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/perf_model.h"
#include "runtime/model/safetensors.h"
#include "sim/compare.h"
#include "sim/pipeline_sim.h"
#include "sim/sim_cli.h"
#include "sim/sim_vision.h"
#include "sim/split.h"

#define WARM_PROMPT (2 * 16 + 1) /* two whole KV blocks and the row that gives a token */

/* Golden data of a model directory (tests/golden/<case>/), when present. */
struct golden {
    int have;
    int32_t prompt[SIM_MAX_PROMPT];
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
    g->prompt_len = root ? json_int_array(g->prompt, SIM_MAX_PROMPT,
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
static int run_split(struct sim_report *report, struct sim_cli *cli, const struct sim_split *split,
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
    if (opt.no_weights) { /* placeholders: nothing to compare but that each request ended */
        verdict = report->failed_requests ? "FAILED" : "timing";
        if (report->failed_requests) *any_failure = 1;
    } else if (baseline) {
        int same = sim_reports_identical(baseline, report, why, sizeof why);
        verdict = same ? "yes" : (report->failed_requests ? "FAILED" : "NO");
        if (!same) *any_failure = 1;
    } else if (report->failed_requests) {
        verdict = "FAILED";
        *any_failure = 1;
    }
    /* --warm: the repeats (the second third) against their first runs, the next turns (the
     * last third) against the rest of their first runs' answers, and reused blocks. */
    if (cli->warm && !report->failed_requests && !why[0]) {
        const int R = report->num_requests / 3;
        if (!opt.no_weights &&
            (!sim_repeats_identical(report, R, why, sizeof why) ||
             !sim_next_turns_identical(report, R, 2 * R, cli->sampling.temperature <= 0.0f, why,
                                       sizeof why))) {
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
    if (cli->warm && report->prefix_cached_tokens > 0 && !why[0]) {
        const int R = report->num_requests / 3;
        long long turns = 0;
        for (int i = 2 * R; i < 3 * R; i++)
            turns += report->requests[i].cached_tokens;
        printf("    warm repeats: %llu prompt tokens from the KV cache%s; of them the next turns' "
               "%lld, their answers' blocks included\n",
               (unsigned long long)report->prefix_cached_tokens,
               opt.no_weights ? "" : ", bit-identical", turns);
    }
    if (baseline && opt.speculate && !report->failed_requests) {
        printf("    speculation: %llu decode steps carried %llu drafts, %llu accepted (%.0f%%)\n",
               (unsigned long long)report->spec_steps, (unsigned long long)report->spec_drafted,
               (unsigned long long)report->spec_accepted,
               report->spec_drafted
                   ? 100.0 * (double)report->spec_accepted / (double)report->spec_drafted
                   : 0.0);
        if (report->spec_drafted == 0) { /* then nothing was verified: say so, and fail */
            printf("    difference: --speculate: no decode step carried a draft (nothing in the "
                   "sequences recurred), so the check did not run\n");
            *any_failure = 1;
        }
    }
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
static int run_stage_count(struct sim_cli *cli, int L, int S, uint64_t *rng,
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
    int32_t base_prompt[SIM_MAX_PROMPT];
    int prompt_len, max_tokens;
    int lengthened; /* --warm lengthened the golden prompt */
    struct sim_split explicit_split;
    struct sim_request_spec *specs;
    int32_t *prompts;
    struct sim_report baseline;
    struct model_config draft_cfg; /* --draft-model */
    struct safetensors *draft_weights;
    struct perf_device profile; /* --compute model */
    struct perf_layers *perf;
};

static void session_close(struct session *ss) {
    sim_report_free(&ss->baseline);
    free(ss->specs);
    free(ss->prompts);
    golden_free(&ss->golden);
    sim_vision_free(&ss->vision);
    safetensors_close(ss->weights);
    safetensors_close(ss->draft_weights);
    free(ss->perf);
}

/* Model, weights, golden data and the base prompt; returns an exit code (0 = opened). */
static int open_inputs(struct session *ss, const struct sim_cli *cli) {
    /* --no-weights: config.json alone (a golden's answers mean nothing without them). */
    if (model_config_load(&ss->cfg, cli->model_dir) < 0 ||
        (!cli->sim.no_weights &&
         (safetensors_open(&ss->weights, cli->model_dir) < 0 ||
          golden_load(&ss->golden, cli->model_dir, ss->cfg.vocab_size) < 0))) {
        fprintf(stderr, "strata-sim: %s\n", strata_last_error());
        if (!ss->weights && !cli->sim.no_weights && ss->cfg.num_layers > 0)
            fprintf(stderr, "(to simulate its timing without the weights: --no-weights "
                            "--compute model --profile FILE)\n");
        return STRATA_EXIT_INPUT;
    }
    if (cli->profile &&
        (perf_device_load(&ss->profile, cli->profile) < 0 ||
         !(ss->perf = malloc(sizeof *ss->perf)) || perf_layers_build(ss->perf, &ss->cfg) < 0)) {
        fprintf(stderr, "strata-sim: --profile: %s\n",
                ss->perf ? strata_last_error() : "out of memory");
        return STRATA_EXIT_INPUT;
    }
    if (cli->draft_model && (model_config_load(&ss->draft_cfg, cli->draft_model) < 0 ||
                             safetensors_open(&ss->draft_weights, cli->draft_model) < 0)) {
        fprintf(stderr, "strata-sim: --draft-model: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    if (cli->prompt_text) {
        ss->prompt_len = cli_parse_ids(ss->base_prompt, SIM_MAX_PROMPT, cli->prompt_text, 0,
                                       ss->cfg.vocab_size - 1);
        if (ss->prompt_len < 1) {
            fprintf(stderr, "strata-sim: --prompt needs comma-separated ids in [0, %d)\n",
                    ss->cfg.vocab_size);
            return STRATA_EXIT_USAGE;
        }
    } else if (cli->prompt_tokens) {
        ss->prompt_len = cli->prompt_tokens;
        for (int i = 0; i < ss->prompt_len; i++)
            ss->base_prompt[i] = (int32_t)((i * 7 + 1) % ss->cfg.vocab_size);
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
static int check_against_model(struct session *ss, const struct sim_cli *cli) {
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
static int build_requests(struct session *ss, struct sim_cli *cli) {
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
    const int R = cli->requests, total = cli->warm ? 3 * R : R;
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
    cli->sim.profile = cli->profile ? &ss->profile : NULL;
    cli->sim.perf = ss->perf;
    cli->sim.weights = ss->weights;
    cli->sim.seed = cli->seed;
    for (int i = R; i < 2 * R && i < total; i++) { /* --warm: each again, once it has finished */
        ss->specs[i] = ss->specs[i - R];
        ss->specs[i].after = i - R + 1;
    }
    /* and its next turn: the prompt and the first half of the answer, then the rest */
    const int half = ss->max_tokens / 2 > 0 ? ss->max_tokens / 2 : 1;
    for (int i = 2 * R; i < total; i++) {
        ss->specs[i] = ss->specs[i - 2 * R];
        ss->specs[i].after = i - 2 * R + 1;
        ss->specs[i].prompt = NULL;
        ss->specs[i].answer_tokens = half;
        ss->specs[i].prompt_len += half;
        ss->specs[i].max_tokens = ss->max_tokens - half > 0 ? ss->max_tokens - half : 1;
    }
    cli->sim.num_requests = total;
    cli->sim.requests = ss->specs;
    return STRATA_EXIT_OK;
}

static void print_header(const struct session *ss, const struct sim_cli *cli) {
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
           cli->sim.no_weights ? "the performance model on --profile's device; no weights "
                                 "(timing only: stages compute nothing, tokens are placeholders)"
           : cli->sim.compute == SIM_COMPUTE_MODEL ? "the performance model on --profile's device"
           : cli->sim.compute == SIM_COMPUTE_FIXED ? "fixed cost per row and layer"
           : cli->sim.compute == SIM_COMPUTE_CPU   ? "measured thread CPU time"
                                                   : "measured wall time");
    if (cli->sim.tp * cli->sim.kvp > 1)
        printf("grid: every stage is TP %d x KVP %d ranks (threads; KV positions per KVP rank: "
               "%s), MoE %s; the baseline is one rank (no TP / KVP)\n",
               cli->sim.tp, cli->sim.kvp, cli->sim.kvp_tokens ? "--kvp-tokens" : "aligned split",
               cli->sim.moe == TP_MOE_SPLIT ? "split" : "expert");
    if (cli->sim.speculate)
        printf("speculation: %s%s drafts, up to %d per decode step, verified by the last stage "
               "in every run but the baseline (which decodes without drafts)\n",
               cli->draft_model ? "draft model " : "n-gram",
               cli->draft_model ? cli->draft_model : "",
               cli->sim.speculate_k ? cli->sim.speculate_k : 4);
    if (cli->warm)
        printf("warm: each request is sent again once it has finished, the same prompt from the "
               "KV blocks it left cached, and then its next turn, the prompt and the first half "
               "of its answer, from the blocks of both; the repeat must equal its first run and "
               "the next turn the rest of its answer, bit for bit\n");
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
static void report_golden(const struct session *ss, const struct sim_cli *cli) {
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
    if (!g->have || cli->sim.no_weights || golden_has_image || cli->prompt_text || ss->lengthened ||
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
static int run_all(struct session *ss, struct sim_cli *cli) {
    int any_failure = 0, runs = 0, L = ss->cfg.num_layers, rc;
    struct sim_split single;
    uint64_t rng = cli->seed;
    sim_split_even(&single, L, 1);
    /* Under a grid the baseline is one rank (no TP, no KVP): TP and KVP change no bit, so
     * the grid's single stage and every split are compared with it. */
    struct sim_cli one = *cli;
    one.sim.tp = one.sim.kvp = 1;
    one.sim.kvp_tokens = 0;
    one.sim.speculate = 0; /* and decodes one token per step */
    one.sim.draft_cfg = NULL;
    one.sim.draft_weights = NULL;
    rc = run_split(&ss->baseline, &one, &single, NULL, &any_failure);
    if (rc < 0) /* a model the stages cannot load is bad input; anything else a failure */
        return (rc == STRATA_ENOTFOUND || rc == STRATA_EFORMAT) ? STRATA_EXIT_INPUT
                                                                : STRATA_EXIT_FAILURE;
    report_golden(ss, cli);
    if (cli->sim.tp * cli->sim.kvp > 1 || cli->sim.speculate) {
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
    if (cli->sim.no_weights)
        printf("OK: %d split runs simulated (timing only: no weights, no bits compared)\n", runs);
    else
        printf("OK: %d split runs, all bit-identical to the single-stage baseline%s\n", runs,
               cli->sim.tp * cli->sim.kvp > 1 ? " (one rank, no TP / KVP)" : "");
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    struct sim_cli cli;
    static struct session ss; /* large: prompt buffer */
    int code = sim_cli_parse(&cli, argc, argv);
    if (code == -1) {
        sim_cli_usage(stdout);
        return STRATA_EXIT_OK;
    }
    if (code != 0) return code;
    code = open_inputs(&ss, &cli);
    if (ss.draft_weights) {
        cli.sim.draft_cfg = &ss.draft_cfg;
        cli.sim.draft_weights = ss.draft_weights;
    }
    if (code == STRATA_EXIT_OK) code = check_against_model(&ss, &cli);
    if (code == STRATA_EXIT_OK) code = build_requests(&ss, &cli);
    if (code == STRATA_EXIT_OK) {
        print_header(&ss, &cli);
        code = run_all(&ss, &cli);
    }
    session_close(&ss);
    return code;
}
