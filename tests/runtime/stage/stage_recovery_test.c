/* In-flight recovery in the stage core (runtime/stage/stage_recovery.c), in process: three
 * cores on the golden deep8 model, two requests in flight (greedy, and temperature 0.8 with
 * a seed); stage 1 "dies" (its core replaced by a fresh one, its links reported down) and
 * the requests end with the tokens and logits of an undisturbed run, stale frames of the old
 * ring included; the same for a Qwen3-VL request (golden image inputs). Also: a held request gives
 * up with ETIMEOUT naming the timeout; a client resubmission with resume tokens to a fresh stage 0
 * resumes the request; with recovery off (timeout 0) the requests fail at once as before.
 * KV-restoring recovery (stage_recovery_kv.c): with send_kv on every stage the replay restores
 * each stage's KV from stage 0's copies (and only then), with the same tokens and logits; the
 * AUTO rule replays in full when the measured link is slower than recomputing, and so does
 * a request whose copies did not fit the cap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_core.h"
#include "tests/runtime/stage/stage_test_pipeline.h"
#include "tests/test_util.h"

#define S 3
#define MAX_TOKENS 24

static struct tp_golden g_golden;
static int g_send_kv; /* restart_of: the new stage's send_kv */

static int setup(void **state) {
    (void)state;
    return tp_golden_load(&g_golden, "qwen3_deep8");
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&g_golden);
    return 0;
}

static void requests(struct stage_request req[2]) {
    tp_request(&req[0], 1, g_golden.prompt, g_golden.prompt_len, MAX_TOKENS);
    tp_request(&req[1], 2, g_golden.prompt + 2, 6, MAX_TOKENS);
    req[1].sampling.temperature = 0.8f;
    req[1].sampling.top_k = 40;
    req[1].sampling.seed = 9;
}

static void init(struct tp_pipeline *p) {
    if (tp_pipeline_init(p, &g_golden, S, NULL, 128, 4, 4) < 0) fail_msg("%s", strata_last_error());
}

/* Replaces stage r by a fresh process's core (same layers), as a restart would. */
static void restart_of(struct tp_pipeline *p, struct tp_golden *g, int r) {
    int L = g->cfg.num_layers, base = L / S, rem = L % S;
    int start = r * base + (r < rem ? r : rem), end = start + base + (r < rem ? 1 : 0);
    struct stage_open_options so = {.cfg = &g->cfg,
                                    .weights = g->st,
                                    .stage_index = r,
                                    .num_stages = S,
                                    .layer_start = start,
                                    .layer_end = end,
                                    .num_threads = 1,
                                    .max_seq = 128,
                                    .max_batch = 4,
                                    .chunk_size = 4,
                                    .keep_logits = 1,
                                    .send_kv = g_send_kv};
    for (int i = 0; i < p->num_results[r]; i++)
        stage_result_free(&p->results[r][i]);
    p->num_results[r] = 0;
    stage_close(&p->stages[r]);
    if (stage_open(&p->stages[r], &so, NULL) < 0) fail_msg("%s", strata_last_error());
    p->cores[r] = p->stages[r].core;
}

static void restart(struct tp_pipeline *p, int r) {
    restart_of(p, &g_golden, r);
}

/* Rounds until the client has seen `tokens` tokens of `nonce` (mid-request). */
static void run_until_tokens(struct tp_pipeline *p, uint64_t nonce, int tokens) {
    for (int i = 0; i < 10000; i++) {
        int32_t have[256];
        int ended, code;
        if (tp_client_tokens(p, nonce, have, 256, &ended, &code, NULL, 0) >= tokens) return;
        tp_round(p);
    }
    fail_msg("request %llu never reached %d tokens", (unsigned long long)nonce, tokens);
}

static float *read_golden_f32(const char *name, const char *file, size_t want) {
    char path[4200], *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s/%s", test_path("tests/golden"), name, file);
    if (cli_read_file(&data, &len, path) < 0 || len != want * sizeof(float))
        fail_msg("%s: %zu bytes, want %zu", path, len, want * sizeof(float));
    return (float *)data;
}

/* The last stage's finished (not dropped) result for a nonce. */
static const struct stage_result *finished(const struct tp_pipeline *p, uint64_t nonce) {
    for (int i = 0; i < p->num_results[S - 1]; i++) {
        const struct stage_result *r = &p->results[S - 1][i];
        if (r->nonce == nonce &&
            (r->finish == STAGE_FINISH_STOP || r->finish == STAGE_FINISH_LENGTH))
            return r;
    }
    return NULL;
}

/* Rounds with a recovery tick on stage 0 every round (5 ms of virtual time each). */
static void run_ticking(struct tp_pipeline *p, int64_t *now, int rounds) {
    for (int i = 0; i < rounds; i++) {
        stage_core_recovery_tick(p->cores[0], *now, 1);
        *now += 5;
        tp_round(p);
    }
}

static void check_same(const struct tp_pipeline *ref, const struct tp_pipeline *p) {
    for (uint64_t nonce = 1; nonce <= 2; nonce++) {
        int32_t want[64], got[64];
        int ended, code, n_want, n_got;
        char msg[256];
        n_want = tp_client_tokens(ref, nonce, want, 64, &ended, &code, msg, sizeof msg);
        n_got = tp_client_tokens(p, nonce, got, 64, &ended, &code, msg, sizeof msg);
        if (!ended || code != 0)
            fail_msg("request %llu did not finish: %s", (unsigned long long)nonce, msg);
        assert_int_equal(n_got, MAX_TOKENS); /* no token delivered twice, none lost */
        assert_int_equal(n_want, n_got);
        assert_memory_equal(want, got, sizeof(int32_t) * (size_t)n_got);
        const struct stage_result *a = finished(ref, nonce), *b = finished(p, nonce);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(a->n_tokens, b->n_tokens);
        assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens);
        assert_memory_equal(a->logits, b->logits, sizeof(float) * (size_t)a->n_tokens * a->vocab);
    }
}

static void reference_run(struct tp_pipeline *ref) {
    struct stage_request req[2];
    requests(req);
    init(ref);
    assert_int_equal(tp_submit(ref, 1, &req[0]), 0);
    assert_int_equal(tp_submit(ref, 1, &req[1]), 0);
    tp_run(ref, 10000);
}

static void middle_stage_restart_gives_identical_tokens(void **state) {
    (void)state;
    static struct tp_pipeline ref, p;
    struct stage_request req[2];
    struct stage_core_stats st;
    int64_t now = 1000;
    reference_run(&ref);
    requests(req);
    init(&p);
    stage_core_set_recovery_timeout(p.cores[0], 5000);
    assert_int_equal(tp_submit(&p, 1, &req[0]), 0);
    assert_int_equal(tp_submit(&p, 1, &req[1]), 0);
    run_until_tokens(&p, 1, 3); /* mid-request: some tokens out */
    /* Stage 1 dies: what it had queued is lost with it; its neighbours see their links go. */
    restart(&p, 1);
    stage_core_on_link_down(p.cores[0], STAGE_LINK_NEXT, 0, "killed");
    stage_core_on_link_down(p.cores[2], STAGE_LINK_PREV, 0, "killed");
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.held_requests, 2);
    run_ticking(&p, &now, 3000);
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.replayed, 2);
    assert_int_equal(st.recovered, 2);
    assert_int_equal(st.active_requests, 0);
    check_same(&ref, &p);
    tp_pipeline_free(&p);
    tp_pipeline_free(&ref);
}

static void stage0_restart_with_client_resubmission(void **state) {
    (void)state;
    static struct tp_pipeline ref, p;
    struct stage_request req[2];
    int64_t now = 1000;
    reference_run(&ref);
    requests(req);
    init(&p);
    stage_core_set_recovery_timeout(p.cores[0], 5000);
    assert_int_equal(tp_submit(&p, 1, &req[0]), 0);
    assert_int_equal(tp_submit(&p, 1, &req[1]), 0);
    run_until_tokens(&p, 1, 3);
    restart(&p, 0);
    stage_core_set_recovery_timeout(p.cores[0], 5000);
    stage_core_on_link_down(p.cores[1], STAGE_LINK_PREV, 0, "killed");
    stage_core_on_link_down(p.cores[2], STAGE_LINK_NEXT, 0, "killed");
    tp_route(&p);
    for (int i = 0; i < 2; i++) { /* the client resubmits with the tokens it has */
        int32_t have[64];
        int ended, code, n = tp_client_tokens(&p, req[i].nonce, have, 64, &ended, &code, NULL, 0);
        assert_false(ended);
        assert_true(n > 0 && n < MAX_TOKENS);
        req[i].resume_tokens = have;
        req[i].num_resume_tokens = n;
        assert_int_equal(tp_submit(&p, 1, &req[i]), 0);
    }
    run_ticking(&p, &now, 3000);
    check_same(&ref, &p);
    tp_pipeline_free(&p);
    tp_pipeline_free(&ref);
}

static void held_request_times_out_with_a_clear_error(void **state) {
    (void)state;
    static struct tp_pipeline p;
    struct stage_request req[2];
    struct stage_core_stats st;
    struct stage_frame f;
    int timeouts = 0;
    requests(req);
    init(&p);
    stage_core_set_recovery_timeout(p.cores[0], 300);
    assert_int_equal(tp_submit(&p, 1, &req[0]), 0);
    tp_run(&p, 20);
    stage_core_on_link_down(p.cores[0], STAGE_LINK_NEXT, 0, "killed");
    assert_int_equal(stage_core_recovery_tick(p.cores[0], 100, 0), 1); /* held, stamped */
    assert_int_equal(stage_core_recovery_tick(p.cores[0], 399, 0), 1);
    assert_int_equal(stage_core_recovery_tick(p.cores[0], 400, 0), 0); /* 300 ms: gives up */
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.active_requests, 0);
    while (stage_core_pop_frame(p.cores[0], &f)) {
        struct request_event ev;
        if (f.link == STAGE_LINK_CLIENT && request_event_decode(&ev, f.data, f.len) == 0 &&
            ev.kind == REQUEST_EVENT_ERROR) {
            assert_int_equal(ev.code, STRATA_ETIMEOUT);
            assert_non_null(strstr(ev.message, "--recovery-timeout-ms 300"));
            assert_non_null(strstr(ev.message, "killed"));
            timeouts++;
        }
    }
    assert_int_equal(timeouts, 1);
    tp_pipeline_free(&p);
}

static void recovery_off_fails_at_once(void **state) {
    (void)state;
    static struct tp_pipeline p;
    struct stage_request req[2];
    struct stage_core_stats st;
    requests(req);
    init(&p); /* stage_open's default: recovery_timeout_ms 0 */
    assert_int_equal(tp_submit(&p, 1, &req[0]), 0);
    tp_run(&p, 20);
    stage_core_on_link_down(p.cores[0], STAGE_LINK_NEXT, 0, "killed");
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.active_requests, 0);
    assert_int_equal(st.held_requests, 0);
    tp_pipeline_free(&p);
}

/* A Qwen3-VL request (the golden image: grid, merged embeddings, DeepStack) survives stage 1's
 * restart: stage 0 still holds its vision inputs and replays its image rows. */
static void vl_request_recovers(void **state) {
    (void)state;
    static struct tp_golden vg;
    static struct tp_pipeline ref, p;
    struct stage_request req;
    struct request_vision vision;
    struct vl_grid grid = {1, 4, 6}; /* golden.json image_grid_thw: 6 tokens */
    int32_t want[256], got[256];
    int ended, code, n_img = 0, n_want, n_got;
    int64_t now = 1000;
    char msg[512];
    assert_int_equal(tp_golden_load(&vg, "qwen3_vl"), 0);
    int H = vg.cfg.hidden_size, K = vg.cfg.vision.num_deepstack;
    for (int i = 0; i < vg.prompt_len; i++)
        n_img += vg.prompt[i] == vg.cfg.image_token_id;
    float *embeds = read_golden_f32("qwen3_vl", "vision_embeds.f32", (size_t)n_img * H);
    float *deepstack = read_golden_f32("qwen3_vl", "deepstack.f32", (size_t)K * n_img * H);
    vision = (struct request_vision){.grids = &grid,
                                     .num_images = 1,
                                     .n_image_tokens = n_img,
                                     .hidden_size = H,
                                     .embeds = embeds,
                                     .num_deepstack = K,
                                     .deepstack = deepstack};
    tp_request(&req, 5, vg.prompt, vg.prompt_len, vg.n_steps);
    req.vision = &vision;
    for (int run = 0; run < 2; run++) {
        struct tp_pipeline *q = run ? &p : &ref;
        if (tp_pipeline_init(q, &vg, S, NULL, 128, 4, 4) < 0) fail_msg("%s", strata_last_error());
        stage_core_set_recovery_timeout(q->cores[0], 5000);
        assert_int_equal(tp_submit(q, 1, &req), 0);
    }
    tp_run(&ref, 100000);
    run_until_tokens(&p, 5, 2);
    restart_of(&p, &vg, 1);
    stage_core_on_link_down(p.cores[0], STAGE_LINK_NEXT, 0, "killed");
    stage_core_on_link_down(p.cores[2], STAGE_LINK_PREV, 0, "killed");
    run_ticking(&p, &now, 3000);
    struct stage_core_stats st;
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.replayed, 1); /* image rows and >= 2 generated tokens replayed */
    n_want = tp_client_tokens(&ref, 5, want, 256, &ended, &code, msg, sizeof msg);
    assert_int_equal(n_want, vg.n_steps);
    assert_memory_equal(want, vg.generated, sizeof(int32_t) * (size_t)n_want); /* transformers' */
    n_got = tp_client_tokens(&p, 5, got, 256, &ended, &code, msg, sizeof msg);
    if (!ended || code != 0) fail_msg("VL request did not finish: %s", msg);
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, sizeof(int32_t) * (size_t)n_got);
    const struct stage_result *a = finished(&ref, 5), *b = finished(&p, 5);
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a->logits, b->logits, sizeof(float) * (size_t)a->n_tokens * a->vocab);
    tp_pipeline_free(&p);
    tp_pipeline_free(&ref);
    free(embeds);
    free(deepstack);
    tp_golden_free(&vg);
}

/* Stage 1 of 3 restarted with send_kv everywhere, stage 0 in `mode` with a `cap`-byte budget
 * for the copies and the given measured costs; `restored` requests are expected to be
 * rebuilt from their copies (the rest replay in full), all with the undisturbed results. */
static void kv_scenario(enum stage_kv_recovery mode, size_t cap, double row_ns, double link_bps,
                        int restored) {
    static struct tp_pipeline ref, p;
    struct stage_request req[2];
    struct stage_core_stats st;
    int64_t now = 1000;
    reference_run(&ref);
    requests(req);
    if (tp_pipeline_init_kv(&p, &g_golden, S, NULL, 128, 4, 4, 1) < 0)
        fail_msg("%s", strata_last_error());
    stage_core_set_recovery_timeout(p.cores[0], 5000);
    stage_core_set_kv_recovery(p.cores[0], mode, cap);
    stage_core_set_recovery_costs(p.cores[0], row_ns, link_bps);
    assert_int_equal(tp_submit(&p, 1, &req[0]), 0);
    assert_int_equal(tp_submit(&p, 1, &req[1]), 0);
    run_until_tokens(&p, 1, 3);
    g_send_kv = 1;
    restart(&p, 1);
    g_send_kv = 0;
    stage_core_on_link_down(p.cores[0], STAGE_LINK_NEXT, 0, "killed");
    stage_core_on_link_down(p.cores[2], STAGE_LINK_PREV, 0, "killed");
    run_ticking(&p, &now, 3000);
    stage_core_get_stats(p.cores[0], &st);
    assert_int_equal(st.replayed, 2);
    assert_int_equal(st.recovered, 2);
    assert_int_equal(st.kv_restored, restored);
    /* Rows not recomputed: prompt - 1 of each (16 and 6 ids); row P - 1 gives step 0's logits. */
    assert_int_equal(st.kv_rows_saved, restored == 2 ? 15 + 5 : 0);
    for (int r = 1; r < S; r++) {
        stage_core_get_stats(p.cores[r], &st);
        assert_int_equal(st.kv_restored, restored); /* the new stage 1 and the survivor */
    }
    check_same(&ref, &p);
    tp_pipeline_free(&p);
    tp_pipeline_free(&ref);
}

static void kv_copies_restore_every_stage(void **state) {
    (void)state;
    kv_scenario(STAGE_KV_RECOVERY_RESTORE, 64u << 20, 0, 0, 2);
}

static void kv_auto_rule_restores_when_cheaper(void **state) {
    (void)state;
    /* 1 ms per row against 1 GB/s for ~100 KB of copies: restoring is cheaper. */
    kv_scenario(STAGE_KV_RECOVERY_AUTO, 64u << 20, 1e6, 1e9, 2);
}

static void kv_auto_rule_replays_when_the_link_is_slow(void **state) {
    (void)state;
    /* 1 us per row against 1 kB/s: the copies would take longer to send than the replay. */
    kv_scenario(STAGE_KV_RECOVERY_AUTO, 64u << 20, 1e3, 1e3, 0);
}

static void kv_copies_over_the_cap_replay_in_full(void **state) {
    (void)state;
    kv_scenario(STAGE_KV_RECOVERY_RESTORE, 1024, 0, 0, 0);
}

static void kv_forced_replay_ignores_the_copies(void **state) {
    (void)state;
    kv_scenario(STAGE_KV_RECOVERY_REPLAY, 64u << 20, 0, 0, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(middle_stage_restart_gives_identical_tokens),
        cmocka_unit_test(stage0_restart_with_client_resubmission),
        cmocka_unit_test(held_request_times_out_with_a_clear_error),
        cmocka_unit_test(recovery_off_fails_at_once),
        cmocka_unit_test(vl_request_recovers),
        cmocka_unit_test(kv_copies_restore_every_stage),
        cmocka_unit_test(kv_auto_rule_restores_when_cheaper),
        cmocka_unit_test(kv_auto_rule_replays_when_the_link_is_slow),
        cmocka_unit_test(kv_copies_over_the_cap_replay_in_full),
        cmocka_unit_test(kv_forced_replay_ignores_the_copies),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
