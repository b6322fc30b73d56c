/* The simulator's set-up and summary (see pipeline_sim.h): options checked, the run's state
 * and report allocated, one PRNG stream per link direction, every stage's model and core
 * loaded on its own thread (all at once), and after the run the report's numbers (TTFT,
 * tokens/s, utilisation, bubble fraction) with the client's tokens cross-checked against
 * the last stage's record. Apart from pipeline_sim.c, the event loop, so that the loop
 * reads as the simulation alone; the state both share is pipeline_sim_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"
#include "sim/pipeline_sim.h"
#include "sim/pipeline_sim_internal.h"
#include "sim/sim_grid.h"
#include "sim/stage_thread.h"

void sim_options_default(struct sim_options *opt) {
    memset(opt, 0, sizeof *opt);
    sim_link_params_default(&opt->link);
    opt->seed = 1;
    opt->num_requests = 1;
    opt->num_threads = 1;
    opt->compute = SIM_COMPUTE_WALL;
    opt->row_layer_cost_ns = 1000;
    opt->kill_stage = -1;
    opt->partition_stage = -1;
    opt->peer_timeout_ns = 2000000000ll;
    opt->request_timeout_ns = 60000000000ll;
    opt->keep_logits = 1;
    opt->tp = opt->kvp = 1;
}

void sim_report_free(struct sim_report *report) {
    if (!report) return;
    if (report->requests)
        for (int i = 0; i < report->num_requests; i++) {
            free(report->requests[i].tokens);
            free(report->requests[i].logits);
        }
    free(report->requests);
    free(report->stages);
    memset(report, 0, sizeof *report);
}

int sim_check_options(const struct sim_options *opt) {
    if (!opt->cfg || (!opt->weights && !opt->no_weights) || !opt->requests)
        return strata_set_error(STRATA_EINVAL, "simulator: model, weights and requests needed");
    if (opt->no_weights &&
        (opt->compute != SIM_COMPUTE_MODEL || !opt->profile || !opt->perf || opt->tp > 1 ||
         opt->kvp > 1 || opt->speculate || opt->draft_cfg || opt->device))
        return strata_set_error(STRATA_EINVAL,
                                "simulator: without weights only the performance model's time is "
                                "charged (compute model with a profile), on whole stages (no TP / "
                                "KVP), without speculation, on no other device");
    int rc = sim_split_check(&opt->split);
    if (rc < 0) return rc;
    if (opt->split.num_layers != opt->cfg->num_layers)
        return strata_set_error(STRATA_EINVAL, "simulator: split is for %d layers, model has %d",
                                opt->split.num_layers, opt->cfg->num_layers);
    if (opt->num_requests < 1 || opt->num_requests > 4096)
        return strata_set_error(STRATA_EINVAL, "simulator: %d requests (need 1 .. 4096)",
                                opt->num_requests);
    for (int i = 0; i < opt->num_requests; i++)
        if (opt->requests[i].prompt_len < 1 || opt->requests[i].max_tokens < 1)
            return strata_set_error(STRATA_EINVAL,
                                    "simulator: request %d needs a prompt and max_tokens >= 1", i);
        else if (opt->requests[i].after < 0 || opt->requests[i].after > i)
            return strata_set_error(STRATA_EINVAL,
                                    "simulator: request %d follows request %d: not an earlier one",
                                    i + 1, opt->requests[i].after);
        else if (opt->requests[i].answer_tokens < 0 ||
                 (opt->requests[i].answer_tokens > 0 &&
                  (opt->requests[i].after == 0 ||
                   opt->requests[opt->requests[i].after - 1].answer_tokens > 0 ||
                   opt->requests[i].prompt_len !=
                       opt->requests[opt->requests[i].after - 1].prompt_len +
                           opt->requests[i].answer_tokens)))
            return strata_set_error(STRATA_EINVAL,
                                    "simulator: request %d: a next turn follows a first turn and "
                                    "declares its prompt and answer's length",
                                    i + 1);
    if (opt->num_threads < 1)
        return strata_set_error(STRATA_EINVAL, "simulator: threads must be >= 1");
    if (opt->tp * opt->kvp > 1 && cli_device_is_cuda(opt->device))
        return strata_set_error(STRATA_EINVAL, "simulator: %s", SIM_GRID_CUDA_REFUSED);
    int S = opt->split.num_stages;
    if (opt->kill_stage >= S || opt->partition_stage >= S)
        return strata_set_error(STRATA_ERANGE,
                                "simulator: fault on stage %d but the split has %d stages",
                                opt->kill_stage >= S ? opt->kill_stage : opt->partition_stage, S);
    if ((opt->kill_stage >= 0 && opt->kill_at_ns < 0) ||
        (opt->partition_stage >= 0 && opt->partition_at_ns < 0))
        return strata_set_error(STRATA_EINVAL, "simulator: fault time must be >= 0");
    if (opt->peer_timeout_ns <= 0 || opt->request_timeout_ns <= 0)
        return strata_set_error(STRATA_EINVAL, "simulator: timeouts must be > 0");
    if (opt->compute == SIM_COMPUTE_FIXED && opt->row_layer_cost_ns < 0)
        return strata_set_error(STRATA_EINVAL, "simulator: row cost must be >= 0");
    for (int c = 0; c < opt->num_conn_link; c++)
        if (opt->conn_link_set[c] && (rc = sim_link_params_check(&opt->conn_link[c])) < 0)
            return rc;
    return sim_link_params_check(&opt->link);
}

/* Runs on the stage's thread: loads its layer range and builds its core. */
static int stage_load(void *arg) {
    struct sim_stage *st = arg;
    int rc = st->grid_opt.tp * st->grid_opt.kvp > 1
                 ? sim_grid_start(&st->grid, &st->open.tp, &st->grid_opt, &st->open)
                 : 0;
    if (rc == 0) rc = stage_open(&st->stage, &st->open, NULL);
    st->core = st->stage.core;
    return rc;
}

/* Loads every stage's model and core, each on its own thread, all at once. */
static int build_stages(struct sim *sim) {
    const struct sim_options *opt = sim->opt;
    int S = sim->num_stages, max_seq = 1, rc = 0;
    for (int i = 0; i < opt->num_requests; i++) {
        int need = opt->requests[i].prompt_len + opt->requests[i].max_tokens;
        if (need > max_seq) max_seq = need;
    }
    struct grid_config grid = {
        .pp = S, .tp = opt->tp, .kvp = opt->kvp, .kvp_tokens = opt->kvp_tokens, .moe = opt->moe};
    if (opt->tp * opt->kvp > 1 && (rc = grid_config_check(&grid, opt->cfg, max_seq))) return rc;
    sim->kvp_tokens = grid.kvp_tokens;
    sim->max_seq = max_seq;
    sim->decode_context = 0;
    for (int i = 0; i < opt->num_requests; i++) /* the middle of each request's decode */
        sim->decode_context +=
            (opt->requests[i].prompt_len + opt->requests[i].max_tokens / 2.0) / opt->num_requests;
    for (int r = 0; r < S; r++) {
        struct sim_stage *st = &sim->stages[r];
        rc = stage_thread_start(&st->thread);
        if (rc < 0) return rc;
        st->open = (struct stage_open_options){.cfg = opt->cfg,
                                               .weights = opt->weights,
                                               .stage_index = r,
                                               .num_stages = S,
                                               .layer_start = opt->split.bounds[r],
                                               .layer_end = opt->split.bounds[r + 1],
                                               .device = opt->no_weights ? "timing" : opt->device,
                                               .num_threads = opt->num_threads,
                                               .weights_dtype = opt->weights_dtype,
                                               .kv_dtype = opt->kv_dtype,
                                               .max_seq = max_seq,
                                               .max_batch = opt->num_requests,
                                               .chunk_size = opt->chunk_size,
                                               .speculate = opt->speculate,
                                               .speculate_k = opt->speculate_k,
                                               .speculate_waves = opt->speculate_waves,
                                               .draft_cfg = opt->draft_cfg,
                                               .draft_weights = opt->draft_weights,
                                               .keep_logits = opt->keep_logits &&
                                                              !opt->no_weights && r == S - 1};
        st->grid_opt = (struct sim_grid_options){.cfg = opt->cfg,
                                                 .kv_dtype = opt->kv_dtype,
                                                 .weights = opt->weights,
                                                 .stage_index = r,
                                                 .tp = opt->tp,
                                                 .kvp = opt->kvp,
                                                 .kvp_tokens = grid.kvp_tokens,
                                                 .moe = opt->moe,
                                                 .max_seq = max_seq,
                                                 .num_slots = opt->num_requests,
                                                 .num_threads = opt->num_threads};
        sim->report->stages[r].first_step_ns = -1;
        sim->report->stages[r].layer_start = st->open.layer_start;
        sim->report->stages[r].layer_end = st->open.layer_end;
    }
    for (int r = 0; r < S; r++) {
        int submitted = stage_thread_submit(&sim->stages[r].thread, stage_load, &sim->stages[r]);
        if (submitted < 0) return submitted;
    }
    char first_error[512] = "";
    for (int r = 0; r < S; r++) {
        int result = stage_thread_wait(&sim->stages[r].thread);
        if (result < 0 && rc == 0) {
            rc = result;
            snprintf(first_error, sizeof first_error, "stage %d (layers %d-%d): %s", r,
                     opt->split.bounds[r], opt->split.bounds[r + 1], strata_last_error());
        }
    }
    if (rc < 0) return strata_set_error(rc, "%s", first_error);
    return 0;
}

int sim_setup(struct sim *sim, struct sim_report *report, const struct sim_options *opt) {
    int S = opt->split.num_stages, R = opt->num_requests;
    memset(sim, 0, sizeof *sim);
    memset(report, 0, sizeof *report);
    sim->opt = opt;
    sim->report = report;
    sim->num_stages = S;
    sim->requests_left = R;
    report->num_stages = S;
    report->num_requests = R;
    int rc = vclock_init(&sim->clock);
    if (rc < 0) return rc;
    sim->stages = calloc((size_t)S, sizeof *sim->stages);
    sim->links = calloc((size_t)(2 * S + 2), sizeof *sim->links);
    sim->client = calloc((size_t)R, sizeof *sim->client);
    sim->last_tokens = calloc((size_t)R, sizeof *sim->last_tokens);
    sim->last_n_tokens = calloc((size_t)R, sizeof *sim->last_n_tokens);
    report->requests = calloc((size_t)R, sizeof *report->requests);
    report->stages = calloc((size_t)S, sizeof *report->stages);
    if (!sim->stages || !sim->links || !sim->client || !sim->last_tokens || !sim->last_n_tokens ||
        !report->requests || !report->stages)
        return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
    for (int i = 0; i < R; i++) {
        report->requests[i].nonce = (uint64_t)i + 1;
        report->requests[i].tokens = calloc((size_t)opt->requests[i].max_tokens, sizeof(int32_t));
        if (!report->requests[i].tokens)
            return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
        sim->last_n_tokens[i] = -1;
    }
    /* Each link direction gets its own PRNG stream derived from the seed. */
    for (int l = 0; l < 2 * S + 2; l++) {
        const struct sim_link_params *params = &opt->link;
        int conn = l / 2;
        if (S > 1 && conn < S && conn < opt->num_conn_link && opt->conn_link_set[conn])
            params = &opt->conn_link[conn];
        rc = sim_link_init(&sim->links[l], params,
                           opt->seed * 0x9E3779B97F4A7C15ull + (uint64_t)l * 0xD1B54A32D192ED03ull);
        if (rc < 0) return rc;
    }
    return build_stages(sim);
}

void sim_teardown(struct sim *sim) {
    if (sim->stages)
        for (int r = 0; r < sim->num_stages; r++) {
            struct sim_stage *st = &sim->stages[r];
            stage_thread_stop(&st->thread);
            stage_close(&st->stage); /* a grid's leader sends its followers STOP */
            sim_grid_stop(st->grid); /* a follower's failure already failed requests */
            st->grid = NULL;
            st->core = NULL;
            sim_stage_clear_inbox(st);
        }
    if (sim->last_tokens)
        for (int i = 0; i < sim->opt->num_requests; i++)
            free(sim->last_tokens[i]);
    free(sim->last_tokens);
    free(sim->last_n_tokens);
    free(sim->stages);
    free(sim->links);
    free(sim->client);
    vclock_free(&sim->clock);
}

/* Fills the report's summary numbers and checks the client's tokens against the last
 * stage's record of the same request. */
void sim_summarise(struct sim *sim) {
    struct sim_report *report = sim->report;
    const struct sim_options *opt = sim->opt;
    int S = sim->num_stages, ok = 0;
    uint64_t total_tokens = 0;
    double ttft_sum = 0.0;
    for (int i = 0; i < opt->num_requests; i++) {
        struct sim_request_outcome *o = &report->requests[i];
        if (o->done_ns > report->makespan_ns) report->makespan_ns = o->done_ns;
        if (o->status != 0) {
            report->failed_requests++;
            continue;
        }
        ok++;
        total_tokens += (uint64_t)o->n_tokens;
        ttft_sum += (double)o->ttft_ns;
        if (sim->last_n_tokens[i] != o->n_tokens ||
            memcmp(sim->last_tokens[i], o->tokens, sizeof(int32_t) * (size_t)o->n_tokens) != 0)
            sim_record_protocol_error(sim, "client tokens differ from the last stage's record");
        if (opt->keep_logits && !opt->no_weights && !o->logits)
            sim_record_protocol_error(sim, "the last stage reported no logits for a request");
    }
    report->mean_ttft_ns = ok ? ttft_sum / ok : 0.0;
    if (sim->stages[0].core) {
        struct stage_core_stats st;
        stage_core_get_stats(sim->stages[0].core, &st);
        report->prefix_cached_tokens = st.prefix_cached_tokens;
        report->spec_steps = st.spec_steps;
        report->spec_drafted = st.spec_drafted;
        report->spec_accepted = st.spec_accepted;
    }
    report->tokens_per_s =
        report->makespan_ns > 0 ? (double)total_tokens * 1e9 / (double)report->makespan_ns : 0.0;
    int64_t busy = 0;
    for (int r = 0; r < S; r++)
        busy += report->stages[r].busy_ns;
    report->utilisation =
        report->makespan_ns > 0 ? (double)busy / ((double)S * (double)report->makespan_ns) : 0.0;
    if (report->utilisation > 1.0) report->utilisation = 1.0;
    report->bubble_fraction = 1.0 - report->utilisation;
    for (int l = 0; l < 2 * S + 2; l++)
        report->retransmits += sim->links[l].retransmits;
}
