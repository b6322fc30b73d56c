/* cmocka tests of prefix reuse (runtime/stage/stage_prefix.c) without sockets: a prompt that
 * begins with a finished request's blocks, or with its answer, gives the cold run's tokens and
 * logits bit for bit on 1-3 stages (decoded or speculated); a stage that lost its blocks makes
 * stage 0 fall back to a cold run; every block returns to its pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_blocks.h"
#include "runtime/base/status.h"
#include "tests/runtime/stage/stage_test_pipeline.h"
#include "wire/message.h"

static struct tp_golden golden_long;

static int setup(void **state) {
    (void)state;
    if (tp_golden_load(&golden_long, "qwen3_long_prompt") < 0) {
        print_error("golden load failed: %s\n", strata_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&golden_long);
    return 0;
}

static struct tp_pipeline pipe_a, pipe_b; /* large: keep off the stack */

/* One request through p (speculate: enum wire_speculate); its last stage's result (tokens
 * and logits). */
static const struct stage_result *run_prompt_spec(struct tp_pipeline *p, uint64_t nonce,
                                                  const int32_t *prompt, int prompt_len, int steps,
                                                  int speculate) {
    struct stage_request req;
    tp_request(&req, nonce, prompt, prompt_len, steps);
    req.speculate = speculate;
    assert_int_equal(tp_submit(p, 1, &req), 0);
    tp_run(p, 100000);
    const struct stage_result *r = tp_last_result(p, nonce);
    assert_non_null(r);
    if (r->status) fail_msg("request %llu: %s", (unsigned long long)nonce, r->message);
    assert_non_null(r->logits);
    return r;
}

static const struct stage_result *run_prompt(struct tp_pipeline *p, uint64_t nonce,
                                             const int32_t *prompt, int prompt_len, int steps) {
    return run_prompt_spec(p, nonce, prompt, prompt_len, steps, WIRE_SPECULATE_DEFAULT);
}

static void assert_same_result(const struct stage_result *a, const struct stage_result *b, int V) {
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_memory_equal(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens);
    assert_memory_equal(a->logits, b->logits, sizeof(float) * (size_t)a->n_tokens * (size_t)V);
}

/* Prefix reuse: a request whose prompt begins with the whole blocks of a finished one attaches
 * them from every stage's cache and prefills only the rest, and gives the same tokens and
 * logits, bit for bit, as the same request served cold, on 1, 2 and 3 stages: the same
 * prompt again (2 of its 2 full blocks reused, 8 rows computed) and a longer one that
 * continues it with the answer (2 reused, 32 computed). Every block returns to its pool. */
static void test_prefix_reuse_exact(void **state) {
    struct tp_golden *g = &golden_long;
    const int V = g->cfg.vocab_size, P = g->prompt_len;
    int32_t longer[128];
    (void)state;
    memcpy(longer, g->prompt, sizeof(int32_t) * (size_t)P);
    memcpy(longer + P, g->generated, sizeof(int32_t) * (size_t)g->n_steps);
    const int L = P + g->n_steps;
    assert_true(P >= 2 * KV_BLOCK + 1 && L <= 128);
    for (int S = 1; S <= 3; S++) {
        struct stage_core_stats st;
        assert_int_equal(tp_pipeline_init(&pipe_b, g, S, NULL, 128, 4, 16), 0);
        const struct stage_result *cold = run_prompt(&pipe_b, 1, g->prompt, P, 6);
        const struct stage_result *cold_long = run_prompt(&pipe_b, 2, longer, L, 6);
        assert_int_equal(tp_pipeline_init(&pipe_a, g, S, NULL, 128, 4, 16), 0);
        run_prompt(&pipe_a, 10, g->prompt, P, 3); /* leaves the prompt's 2 blocks cached */
        const struct stage_result *warm = run_prompt(&pipe_a, 11, g->prompt, P, 6);
        assert_same_result(warm, cold, V);
        stage_core_get_stats(pipe_a.cores[0], &st);
        assert_int_equal(st.prefix_hits, 1);
        assert_int_equal(st.prefix_cached_tokens, 2 * KV_BLOCK);
        const struct stage_result *warm_long = run_prompt(&pipe_a, 12, longer, L, 6);
        assert_same_result(warm_long, cold_long, V);
        stage_core_get_stats(pipe_a.cores[0], &st);
        assert_int_equal(st.prefix_hits, 2);
        assert_int_equal(st.prefix_cached_tokens, 4 * KV_BLOCK);
        for (int r = 0; r < S; r++) {
            struct stage_kv_usage u;
            stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
            assert_int_equal(u.free + u.cached, u.blocks); /* none held */
            assert_true(u.cached >= 4);                    /* the longer prompt's 4 blocks */
            assert_int_equal(u.promised, 0);
            stage_core_get_stats(pipe_a.cores[r], &st);
            assert_int_equal(st.active_requests, 0);
        }
        tp_pipeline_free(&pipe_a);
        tp_pipeline_free(&pipe_b);
    }
}

/* The answer's blocks are kept too: a request of the 40-token prompt that generates 20 tokens
 * leaves 3 blocks (the prompt's 2 and positions 32..47, 8 of them generated: every generated
 * token but the last went through every stage); the next turn, the prompt with that answer
 * and the rest of the golden's (64 tokens), reuses all 3 and computes 16 rows, with the cold
 * tokens and logits bit for bit, on 1, 2 and 3 stages, whether the answer was decoded a token
 * a step or speculated (n-gram drafts: its KV written by verification rows, the rejected
 * drafts' rows dropped). A turn that departs from the answer reuses only the blocks before
 * it. Every block returns to its pool. */
static void test_prefix_reuse_answer(void **state) {
    struct tp_golden *g = &golden_long;
    const int V = g->cfg.vocab_size, P = g->prompt_len;
    int32_t longer[128], other[128];
    (void)state;
    memcpy(longer, g->prompt, sizeof(int32_t) * (size_t)P);
    memcpy(longer + P, g->generated, sizeof(int32_t) * (size_t)g->n_steps);
    const int L = P + g->n_steps;
    assert_true(P == 40 && L == 64);
    memcpy(other, longer, sizeof longer);
    other[P + 3] = (other[P + 3] + 1) % V; /* the answer differs inside block 2 */
    for (int run = 0; run < 6; run++) {
        const int S = 1 + run / 2, spec = run % 2 ? WIRE_SPECULATE_NGRAM : WIRE_SPECULATE_OFF;
        struct stage_core_stats st;
        assert_int_equal(tp_pipeline_init(&pipe_b, g, S, NULL, 128, 4, 16), 0);
        const struct stage_result *cold = run_prompt(&pipe_b, 1, longer, L, 6);
        const struct stage_result *cold_other = run_prompt(&pipe_b, 2, other, L, 6);
        assert_int_equal(tp_pipeline_init(&pipe_a, g, S, NULL, 128, 4, 16), 0);
        const struct stage_result *first = run_prompt_spec(&pipe_a, 10, g->prompt, P, 20, spec);
        assert_memory_equal(first->tokens, g->generated, sizeof(int32_t) * 20);
        stage_core_get_stats(pipe_a.cores[0], &st);
        if (spec == WIRE_SPECULATE_NGRAM) /* drafts were both accepted and rejected */
            assert_true(st.spec_accepted > 0 && st.spec_drafted > st.spec_accepted);
        for (int r = 0; r < S; r++) {
            struct stage_kv_usage u;
            stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
            assert_int_equal(u.cached, 3); /* the prompt's 2, the answer's 1 */
        }
        assert_same_result(run_prompt(&pipe_a, 11, longer, L, 6), cold, V);
        stage_core_get_stats(pipe_a.cores[0], &st);
        assert_int_equal(st.prefix_hits, 1);
        assert_int_equal(st.prefix_cached_tokens, 3 * KV_BLOCK);
        assert_same_result(run_prompt(&pipe_a, 12, other, L, 6), cold_other, V);
        stage_core_get_stats(pipe_a.cores[0], &st);
        assert_int_equal(st.prefix_hits, 2);
        assert_int_equal(st.prefix_cached_tokens, 5 * KV_BLOCK); /* 2 more: the prompt's */
        for (int r = 0; r < S; r++) {
            struct stage_kv_usage u;
            stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
            assert_int_equal(u.free + u.cached, u.blocks); /* none held */
            assert_int_equal(u.promised, 0);
            stage_core_get_stats(pipe_a.cores[r], &st);
            assert_int_equal(st.active_requests, 0);
        }
        tp_pipeline_free(&pipe_a);
        tp_pipeline_free(&pipe_b);
    }
}

/* A later stage that lost its cached blocks (restarted with an empty pool): stage 0's check
 * comes back marked, the request is cancelled where it was attached and sent again cold, and
 * gives the cold bits; stage 0 forgot its keys, so the next request is cold too and the pools
 * agree again, and the one after reuses the blocks on both stages. */
static void test_prefix_miss_falls_back(void **state) {
    struct tp_golden *g = &golden_long;
    const int V = g->cfg.vocab_size, P = g->prompt_len;
    struct stage_core_stats st;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_b, g, 1, NULL, 128, 4, 16), 0);
    const struct stage_result *cold = run_prompt(&pipe_b, 1, g->prompt, P, 6);
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 128, 4, 16), 0);
    run_prompt(&pipe_a, 20, g->prompt, P, 2);
    stage_backend_kv_forget(pipe_a.stages[1].backend); /* stage 1 "restarted" */
    assert_same_result(run_prompt(&pipe_a, 21, g->prompt, P, 6), cold, V);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.prefix_fallbacks, 1);
    assert_int_equal(st.prefix_hits, 0);
    assert_int_equal(st.prefix_cached_tokens, 0);
    assert_same_result(run_prompt(&pipe_a, 22, g->prompt, P, 6), cold, V);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.prefix_hits, 1);
    assert_int_equal(st.prefix_fallbacks, 1);
    for (int r = 0; r < 2; r++) {
        struct stage_kv_usage u;
        stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
        assert_int_equal(u.free + u.cached, u.blocks);
        assert_int_equal(u.promised, 0);
        stage_core_get_stats(pipe_a.cores[r], &st);
        assert_int_equal(st.active_requests, 0);
    }
    tp_pipeline_free(&pipe_a);
    tp_pipeline_free(&pipe_b);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_reuse_exact),
        cmocka_unit_test(test_prefix_reuse_answer),
        cmocka_unit_test(test_prefix_miss_falls_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
