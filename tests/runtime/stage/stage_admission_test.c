/* cmocka tests of stage 0's admission (runtime/stage/stage_admission.c) without sockets: what
 * it refuses and why (slots, --max-seq, the vocabulary), its queue (arrival order, a full
 * queue, a cancelled or disconnected waiter, the deadline) and a KV pool smaller than the
 * slots (requests wait for blocks; every block returns). */
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

static struct tp_golden golden_tied;

static int setup(void **state) {
    (void)state;
    if (tp_golden_load(&golden_tied, "qwen3_gqa_tied") < 0) {
        print_error("golden load failed: %s\n", strata_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&golden_tied);
    return 0;
}

static struct tp_pipeline pipe_a; /* large: keep off the stack */

/* Refused at once: a request past --max-batch's slots, one past --max-seq, one outside the
 * vocabulary; the others run, and freed slots admit new ones. */
static void test_admission_control(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    int32_t tokens[8], prompt[2] = {3, 4};
    int ended, code;
    char msg[512];
    struct stage_core_stats st;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 16, 2, 8), 0);
    for (int i = 0; i < 3; i++) {
        tp_request(&req, 10 + i, prompt, 2, 4);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    tp_route(&pipe_a);
    tp_client_tokens(&pipe_a, 12, tokens, 8, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_EBUSY);
    assert_non_null(strstr(msg, "--max-batch 2"));
    tp_request(&req, 20, prompt, 2, 20); /* 2 + 20 - 1 > max_seq 16 */
    tp_submit(&pipe_a, 1, &req);
    tp_route(&pipe_a);
    tp_client_tokens(&pipe_a, 20, tokens, 8, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_ERANGE);
    assert_non_null(strstr(msg, "--max-seq"));
    tp_request(&req, 21, prompt, 2, 4);
    prompt[1] = 99999; /* outside the vocabulary */
    tp_submit(&pipe_a, 1, &req);
    tp_route(&pipe_a);
    tp_client_tokens(&pipe_a, 21, tokens, 8, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_EINVAL);
    prompt[1] = 4;
    tp_run(&pipe_a, 10000);
    tp_client_tokens(&pipe_a, 10, tokens, 8, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, 0);
    assert_true(ended);
    /* Slots are free again: a new request is admitted. */
    tp_request(&req, 30, prompt, 2, 4);
    tp_submit(&pipe_a, 1, &req);
    tp_run(&pipe_a, 10000);
    tp_client_tokens(&pipe_a, 30, tokens, 8, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, 0);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.active_requests, 0);
    tp_pipeline_free(&pipe_a);
}

/* Stage 0's admission queue: with 2 KV slots and room for 3 waiting, 6 requests at once: 5
 * are answered with the golden tokens in arrival order of admission, the 6th is refused
 * (EBUSY naming --max-queue); a waiting request cancelled by its client, or whose client
 * disconnects, leaves the queue; every slot is free at the end on every stage. */
static void test_admission_queue(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    struct stage_core_stats st;
    int32_t tokens[64];
    int ended, code, n;
    char msg[512];
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 3, NULL, 64, 2, 8), 0);
    assert_int_equal(stage_core_set_admission(pipe_a.cores[0], 3, 0), 0);
    for (int i = 0; i < 6; i++) {
        tp_request(&req, 50 + i, g->prompt, g->prompt_len, g->n_steps);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    tp_route(&pipe_a);
    n = tp_client_tokens(&pipe_a, 55, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_EBUSY);
    assert_non_null(strstr(msg, "--max-queue 3"));
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queue_depth, 3);
    assert_int_equal(st.queue_full, 1);
    tp_run(&pipe_a, 100000);
    for (int i = 0; i < 5; i++) {
        n = tp_client_tokens(&pipe_a, 50 + i, tokens, 64, &ended, &code, msg, sizeof msg);
        if (code) print_error("request %d: %s\n", 50 + i, msg);
        assert_int_equal(code, 0);
        assert_true(ended);
        assert_int_equal(n, g->n_steps);
        assert_memory_equal(tokens, g->generated, sizeof(int32_t) * (size_t)n);
    }
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queued, 3);
    assert_int_equal(st.queue_admitted, 3);
    assert_int_equal(st.queue_depth, 0);
    assert_int_equal(st.refused, 1);

    /* Two running, then one waiting of client 1 (cancelled) and two of client 2 (gone). */
    for (int i = 0; i < 5; i++) {
        tp_request(&req, 60 + i, g->prompt, g->prompt_len, g->n_steps);
        assert_int_equal(tp_submit(&pipe_a, i < 3 ? 1 : 2, &req), 0);
    }
    tp_route(&pipe_a);
    struct wire_arena arena;
    wire_arena_init(&arena, 0);
    request_build_cancel(&arena, 62);
    assert_int_equal(stage_core_on_frame(pipe_a.cores[0], STAGE_LINK_CLIENT, 1,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     0);
    wire_arena_free(&arena);
    assert_int_equal(stage_core_on_link_down(pipe_a.cores[0], STAGE_LINK_CLIENT, 2, "gone"), 0);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queue_depth, 0);
    tp_route(&pipe_a);
    tp_client_tokens(&pipe_a, 62, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_ECANCELED);
    tp_run(&pipe_a, 100000);
    for (int i = 0; i < 2; i++) {
        n = tp_client_tokens(&pipe_a, 60 + i, tokens, 64, &ended, &code, msg, sizeof msg);
        assert_int_equal(code, 0);
        assert_int_equal(n, g->n_steps);
    }
    for (int r = 0; r < 3; r++) {
        stage_core_get_stats(pipe_a.cores[r], &st);
        assert_int_equal(st.active_requests, 0);
    }
    tp_pipeline_free(&pipe_a);
}

/* A waiting request past the queue's deadline (the driver's clock) is refused with EBUSY
 * naming --queue-timeout-ms; the running ones are untouched. */
static void test_admission_deadline(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    struct stage_core_stats st;
    int32_t tokens[64];
    int ended, code;
    char msg[512];
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 64, 2, 8), 0);
    assert_int_equal(stage_core_set_admission(pipe_a.cores[0], 4, 100), 0);
    stage_core_describe_tick(pipe_a.cores[0], 1000, 0, 0, 30000);
    for (int i = 0; i < 3; i++) {
        tp_request(&req, 70 + i, g->prompt, g->prompt_len, g->n_steps);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    tp_route(&pipe_a);
    stage_core_describe_tick(pipe_a.cores[0], 1050, 0, 0, 30000); /* within the deadline */
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queue_depth, 1);
    stage_core_describe_tick(pipe_a.cores[0], 1101 + 1, 0, 0, 30000);
    tp_route(&pipe_a);
    tp_client_tokens(&pipe_a, 72, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_EBUSY);
    assert_non_null(strstr(msg, "--queue-timeout-ms 100"));
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queue_expired, 1);
    assert_int_equal(st.queue_depth, 0);
    tp_run(&pipe_a, 100000);
    tp_client_tokens(&pipe_a, 70, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, 0);
    tp_pipeline_free(&pipe_a);
}

/* A KV pool smaller than the slots: requests reserve prompt + max_tokens when they start,
 * so with blocks for two of them only two run and the others wait in the queue; every one
 * is answered with the golden tokens, and every block returns to every stage's pool. */
static void test_kv_pool_queue(void **state) {
    struct tp_golden *g = &golden_tied;
    const struct model_config *c = &g->cfg;
    const int S = c->num_layers % 2 == 0 ? 2 : 1, layers = c->num_layers / S;
    const int need = g->prompt_len + g->n_steps - 1, per_request = kv_blocks_for(need);
    const size_t block = 2 * sizeof(float) * (size_t)layers * (size_t)c->num_kv_heads * KV_BLOCK *
                         (size_t)c->head_dim;
    struct stage_request req;
    struct stage_core_stats st;
    struct stage_kv_usage u;
    int32_t tokens[64];
    int ended, code, n;
    char msg[512];
    (void)state;
    /* Blocks for two requests and a part of a third; 8 slots. */
    assert_int_equal(tp_pipeline_init_pool(&pipe_a, g, S, NULL, need, 8, 8, 0,
                                           block * (size_t)(3 * per_request - 1)),
                     0);
    assert_int_equal(stage_core_set_admission(pipe_a.cores[0], 8, 0), 0);
    for (int r = 0; r < S; r++) {
        stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
        assert_int_equal(u.blocks, 3 * per_request - 1);
        assert_int_equal(u.block_positions, KV_BLOCK);
    }
    for (int i = 0; i < 6; i++) {
        tp_request(&req, 70 + i, g->prompt, g->prompt_len, g->n_steps);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    tp_route(&pipe_a);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.active_requests, 2);
    assert_int_equal(st.queue_depth, 4);
    stage_backend_kv_usage(pipe_a.stages[0].backend, &u);
    assert_true(u.free - u.promised < per_request); /* the third does not fit */
    tp_run(&pipe_a, 100000);
    for (int i = 0; i < 6; i++) {
        n = tp_client_tokens(&pipe_a, 70 + i, tokens, 64, &ended, &code, msg, sizeof msg);
        if (code) print_error("request %d: %s\n", 70 + i, msg);
        assert_int_equal(code, 0);
        assert_true(ended);
        assert_int_equal(n, g->n_steps);
        assert_memory_equal(tokens, g->generated, sizeof(int32_t) * (size_t)n);
    }
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.queue_admitted, 4);
    assert_int_equal(st.refused, 0);
    for (int r = 0; r < S;
         r++) { /* every block back (free, or cached: the answers'), nothing promised */
        stage_backend_kv_usage(pipe_a.stages[r].backend, &u);
        assert_int_equal(u.free + u.cached, u.blocks);
        assert_int_equal(u.promised, 0);
    }
    tp_pipeline_free(&pipe_a);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_control),
        cmocka_unit_test(test_admission_queue),
        cmocka_unit_test(test_kv_pool_queue),
        cmocka_unit_test(test_admission_deadline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
