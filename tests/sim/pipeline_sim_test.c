/* The simulated pipeline on a golden model: failures end with clear errors (kill of a
 * middle stage, of stage 0, partition of the last stage) instead of hanging; with the fixed
 * compute cost a run's times are reproducible from its seed while tokens and logits never
 * depend on timing; more concurrent requests fill the pipeline; bad options are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "sim/compare.h"
#include "sim/pipeline_sim.h"
#include "sim/split.h"
#include "tests/test_util.h"

#define MODEL_CASE "tests/golden/qwen3_gqa_tied"
#define MAX_REQUESTS 4
#define MAX_TOKENS 12

struct fixture {
    struct model_config cfg;
    struct safetensors *weights;
    int32_t prompts[MAX_REQUESTS][3];
    struct sim_request_spec specs[MAX_REQUESTS];
};

static int setup(void **state) {
    static struct fixture f;
    memset(&f, 0, sizeof f);
    const char *dir = test_path(MODEL_CASE);
    if (model_config_load(&f.cfg, dir) < 0 || safetensors_open(&f.weights, dir) < 0) {
        print_error("cannot open %s: %s\n", dir, strata_last_error());
        return -1;
    }
    for (int i = 0; i < MAX_REQUESTS; i++) {
        for (int j = 0; j < 3; j++)
            f.prompts[i][j] = (int32_t)((17 * i + 5 * j + 3) % f.cfg.vocab_size);
        f.specs[i].prompt = f.prompts[i];
        f.specs[i].prompt_len = 3;
        f.specs[i].max_tokens = MAX_TOKENS;
        f.specs[i].sampling.top_p = 1.0f;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    safetensors_close(f->weights);
    return 0;
}

/* Even split into S stages, fixed compute cost (deterministic virtual times). */
static void options_for(struct sim_options *opt, struct fixture *f, int stages, int requests) {
    sim_options_default(opt);
    opt->cfg = &f->cfg;
    opt->weights = f->weights;
    assert_int_equal(sim_split_even(&opt->split, f->cfg.num_layers, stages), 0);
    opt->num_requests = requests;
    opt->requests = f->specs;
    opt->compute = SIM_COMPUTE_FIXED;
    opt->row_layer_cost_ns = 20000;
    opt->link.latency_ns = 50000;
    opt->peer_timeout_ns = 30000000; /* 30 ms keepalive */
}

static void expect_all_failed(const struct sim_report *report, const char *needle,
                              int64_t before_ns) {
    assert_int_equal(report->failed_requests, report->num_requests);
    for (int i = 0; i < report->num_requests; i++) {
        const struct sim_request_outcome *o = &report->requests[i];
        assert_int_not_equal(o->status, 0);
        if (!strstr(o->message, needle))
            fail_msg("request %d: message '%s' lacks '%s'", i + 1, o->message, needle);
        assert_true(o->done_ns <= before_ns);
        assert_true(o->n_tokens < MAX_TOKENS);
    }
}

static void killed_middle_stage_fails_every_request(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report healthy, killed;
    options_for(&opt, f, 3, 2);
    assert_int_equal(sim_run(&healthy, &opt), 0);
    assert_int_equal(healthy.failed_requests, 0);
    int64_t half = healthy.makespan_ns / 2;
    opt.kill_stage = 1;
    opt.kill_at_ns = half;
    assert_int_equal(sim_run(&killed, &opt), 0);
    /* Peers hear of the reset after one latency; the error reaches the client soon after. */
    expect_all_failed(&killed, "stage 1 was killed", half + 5000000);
    sim_report_free(&healthy);
    sim_report_free(&killed);
}

static void killed_first_stage_closes_the_client_connection(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report report;
    options_for(&opt, f, 2, 2);
    opt.kill_stage = 0;
    opt.kill_at_ns = 400000;
    assert_int_equal(sim_run(&report, &opt), 0);
    expect_all_failed(&report, "connection to stage 0 lost", 400000 + 50000);
    assert_int_equal(report.requests[0].status, STRATA_ECLOSED);
    sim_report_free(&report);
}

static void partitioned_last_stage_is_detected_by_keepalive(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report report;
    options_for(&opt, f, 4, 2);
    opt.partition_stage = 3;
    opt.partition_at_ns = 500000;
    assert_int_equal(sim_run(&report, &opt), 0);
    /* Nothing reaches the client after the partition; the keepalive fires 30 ms later. */
    expect_all_failed(&report, "unreachable", 500000 + opt.peer_timeout_ns + 5000000);
    for (int i = 0; i < report.num_requests; i++)
        assert_true(report.requests[i].done_ns >= 500000 + opt.peer_timeout_ns);
    sim_report_free(&report);
}

/* Everything lost and no keepalive help: the client's own deadline ends the run. */
static void request_timeout_ends_a_silent_pipeline(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report report;
    options_for(&opt, f, 2, 1);
    opt.partition_stage = 1;
    opt.partition_at_ns = 0;
    opt.peer_timeout_ns = 3600000000000ll;
    opt.link.retransmit_timeout_ns = 1000000000;
    opt.link.max_retransmits = 30;
    opt.request_timeout_ns = 5000000000ll;
    assert_int_equal(sim_run(&report, &opt), 0);
    expect_all_failed(&report, "request timeout", opt.request_timeout_ns);
    assert_int_equal(report.requests[0].status, STRATA_ETIMEOUT);
    sim_report_free(&report);
}

static void fixed_cost_times_repeat_and_tokens_ignore_timing(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report a, b, c, single;
    options_for(&opt, f, 4, 3);
    opt.link.jitter_ns = 80000;
    opt.link.loss = 0.2;
    opt.link.retransmit_timeout_ns = 300000;
    opt.link.max_retransmits = 30;
    opt.seed = 11;
    assert_int_equal(sim_run(&a, &opt), 0);
    assert_int_equal(sim_run(&b, &opt), 0);
    opt.seed = 12;
    assert_int_equal(sim_run(&c, &opt), 0);
    assert_int_equal(a.failed_requests, 0);
    assert_true(a.retransmits > 0);
    int times_differ = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(a.requests[i].ttft_ns, b.requests[i].ttft_ns);
        assert_int_equal(a.requests[i].done_ns, b.requests[i].done_ns);
        times_differ |= a.requests[i].done_ns != c.requests[i].done_ns;
    }
    assert_int_equal(a.events, b.events);
    assert_true(times_differ);
    /* Other seed, other times, same bits; and the same bits as one stage. */
    char why[512];
    options_for(&opt, f, 1, 3);
    assert_int_equal(sim_run(&single, &opt), 0);
    if (!sim_reports_identical(&single, &a, why, sizeof why))
        fail_msg("4 stages differ from 1: %s", why);
    if (!sim_reports_identical(&single, &c, why, sizeof why)) fail_msg("seed 12 differs: %s", why);
    sim_report_free(&a);
    sim_report_free(&b);
    sim_report_free(&c);
    sim_report_free(&single);
}

static void concurrent_requests_fill_the_pipeline(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report one, full;
    options_for(&opt, f, 4, 1);
    opt.link.latency_ns = 0;
    assert_int_equal(sim_run(&one, &opt), 0);
    options_for(&opt, f, 4, 4);
    opt.link.latency_ns = 0;
    assert_int_equal(sim_run(&full, &opt), 0);
    /* One request keeps one stage of four busy at a time, but for its prompt's chunks
     * (stage 0 cuts a prompt into S chunks that stream through the stages): little more
     * than 25% utilisation (28% here: 3 prompt rows, 11 decode rows). */
    assert_true(one.utilisation > 0.0 && one.utilisation <= 0.30);
    assert_true(full.utilisation > one.utilisation);
    assert_true(full.tokens_per_s > one.tokens_per_s);
    assert_true(full.bubble_fraction < one.bubble_fraction);
    for (int r = 0; r < 4; r++)
        assert_true(full.stages[r].busy_ns > 0 && full.stages[r].steps > 0);
    sim_report_free(&one);
    sim_report_free(&full);
}

/* A slower stage 0 -> 1 connection delays the first token by exactly the extra latency
 * (one crossing; unlimited bandwidth and fixed compute keep the arithmetic exact). */
static void per_connection_latency_applies_to_its_connection(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report fast, slow;
    struct sim_link_params conn[2];
    int set[2] = {1, 0};
    options_for(&opt, f, 2, 1);
    opt.link.bandwidth_gbps = 0.0;
    assert_int_equal(sim_run(&fast, &opt), 0);
    conn[0] = opt.link;
    conn[0].latency_ns = 5000000;
    conn[1] = opt.link;
    opt.conn_link = conn;
    opt.conn_link_set = set;
    opt.num_conn_link = 2;
    assert_int_equal(sim_run(&slow, &opt), 0);
    assert_int_equal(slow.requests[0].ttft_ns - fast.requests[0].ttft_ns,
                     5000000 - opt.link.latency_ns);
    char why[512];
    assert_true(sim_reports_identical(&fast, &slow, why, sizeof why));
    sim_report_free(&fast);
    sim_report_free(&slow);
}

/* The identity check sees a single flipped logit bit, a changed token and a failure. */
static void comparison_catches_one_flipped_bit(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report base, run;
    char why[512];
    options_for(&opt, f, 1, 2);
    assert_int_equal(sim_run(&base, &opt), 0);
    options_for(&opt, f, 2, 2);
    assert_int_equal(sim_run(&run, &opt), 0);
    assert_true(sim_reports_identical(&base, &run, why, sizeof why));
    struct sim_request_outcome *o = &run.requests[1];
    size_t k = (size_t)(o->n_tokens - 1) * (size_t)o->vocab + 7;
    uint32_t bits;
    memcpy(&bits, &o->logits[k], sizeof bits);
    bits ^= 1u;
    memcpy(&o->logits[k], &bits, sizeof bits);
    assert_false(sim_reports_identical(&base, &run, why, sizeof why));
    assert_non_null(strstr(why, "request 2: logit"));
    bits ^= 1u;
    memcpy(&o->logits[k], &bits, sizeof bits);
    o->tokens[0] ^= 1;
    assert_false(sim_reports_identical(&base, &run, why, sizeof why));
    assert_non_null(strstr(why, "request 2: token 0"));
    o->tokens[0] ^= 1;
    run.requests[0].status = STRATA_ETIMEOUT;
    assert_false(sim_reports_identical(&base, &run, why, sizeof why));
    assert_non_null(strstr(why, "request 1 failed"));
    sim_report_free(&base);
    sim_report_free(&run);
}

static void bad_options_are_refused(void **state) {
    struct fixture *f = *state;
    struct sim_options opt;
    struct sim_report report;
    options_for(&opt, f, 2, 1);
    opt.kill_stage = 2;
    assert_int_equal(sim_run(&report, &opt), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "2 stages"));
    options_for(&opt, f, 2, 1);
    opt.link.loss = -0.5;
    assert_int_equal(sim_run(&report, &opt), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "loss"));
    options_for(&opt, f, 2, 1);
    opt.split.num_layers = 3;
    assert_int_not_equal(sim_run(&report, &opt), 0);
    /* A TP / KVP grid on a CUDA device: refused with the reason before anything opens. */
    for (int kvp = 1; kvp <= 2; ++kvp) {
        options_for(&opt, f, 2, 1);
        opt.tp = 3 - kvp;
        opt.kvp = kvp;
        opt.device = "cuda:0";
        assert_int_equal(sim_run(&report, &opt), STRATA_EINVAL);
        assert_non_null(strstr(strata_last_error(), "CUDA TP / KVP ranks need one GPU each"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_middle_stage_fails_every_request),
        cmocka_unit_test(killed_first_stage_closes_the_client_connection),
        cmocka_unit_test(partitioned_last_stage_is_detected_by_keepalive),
        cmocka_unit_test(request_timeout_ends_a_silent_pipeline),
        cmocka_unit_test(fixed_cost_times_repeat_and_tokens_ignore_timing),
        cmocka_unit_test(concurrent_requests_fill_the_pipeline),
        cmocka_unit_test(per_connection_latency_applies_to_its_connection),
        cmocka_unit_test(comparison_catches_one_flipped_bit),
        cmocka_unit_test(bad_options_are_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
