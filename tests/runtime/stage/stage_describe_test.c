/* cmocka tests of the ring describe in the stage core (runtime/stage/stage_describe.c),
 * without sockets: a client's Control Describe goes round 1, 2 and 3 stages and comes back
 * listing exactly the layer ranges and roles the stages were opened with; it does not change
 * the tokens of a request in flight; and every way it can fail (a ring link down at arrival
 * or lost on the way, a dropped frame, a bad answer, too many, nonce 0) gives the client an
 * Error with its nonce rather than silence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/base/version.h"
#include "runtime/stage/client.h"
#include "tests/runtime/stage/stage_test_pipeline.h"
#include "wire/message.h"

static struct tp_golden golden;
static struct tp_pipeline pipe; /* large: keep off the stack */

/* What stage 0 answered (captured before routing: a routed frame's bytes die). */
static struct {
    int answers;
    uint32_t client_id;
    uint64_t nonce;
    struct client_describe d;
} seen;

static void capture(void *ctx, int stage, const struct stage_frame *f) {
    struct wire_control msg;
    enum wire_kind kind;
    (void)ctx;
    if (stage != 0 || f->link != STAGE_LINK_CLIENT || wire_verify(&kind, NULL, f->data, f->len) ||
        kind != WIRE_KIND_CONTROL || wire_read_control(&msg, f->data, f->len))
        return;
    assert_int_equal(client_describe_read(&seen.d, f->data, f->len), 0);
    seen.answers++;
    seen.client_id = f->client_id;
    seen.nonce = msg.nonce;
}

static int setup(void **state) {
    (void)state;
    if (tp_golden_load(&golden, "qwen3_gqa_tied") < 0) { /* 4 layers */
        print_error("golden load failed: %s\n", strata_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&golden);
    return 0;
}

static void open_pipe(int S, const int *bounds) {
    memset(&seen, 0, sizeof seen);
    assert_int_equal(tp_pipeline_init(&pipe, &golden, S, bounds, 64, 2, 4), 0);
    pipe.inspect = capture;
}

static int send_describe(uint32_t client_id, uint64_t nonce) {
    struct wire_arena arena;
    struct wire_control msg = {.kind = WIRE_CONTROL_DESCRIBE, .nonce = nonce};
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_control(&arena, &msg), 0);
    int rc = stage_core_on_frame(pipe.cores[0], STAGE_LINK_CLIENT, client_id,
                                 wire_arena_frame(&arena), wire_arena_frame_len(&arena));
    wire_arena_free(&arena);
    return rc;
}

/* The Error the client got for `nonce` (its code; message copied). */
static int error_for(uint64_t nonce, char *message, size_t cap) {
    int32_t tokens[4];
    int ended, code;
    tp_client_tokens(&pipe, nonce, tokens, 4, &ended, &code, message, cap);
    assert_true(ended);
    return code;
}

/* The static part of every entry (the load fields are the callers'). */
static void check_ranges(int S, const int *bounds) {
    assert_int_equal(seen.answers, 1);
    assert_int_equal(seen.d.num_stages, S);
    for (int r = 0; r < S; r++) {
        const struct client_stage_info *e = &seen.d.stages[r];
        assert_int_equal(e->stage_index, r);
        assert_int_equal(e->num_stages, S);
        assert_int_equal(e->layer_start, bounds[r]);
        assert_int_equal(e->layer_end, bounds[r + 1]);
        assert_int_equal(e->embed, r == 0);
        assert_int_equal(e->head, r == S - 1);
        assert_int_equal(e->vision, 0);
        assert_int_equal(e->tp, 1);
        assert_int_equal(e->kvp, 1);
        assert_int_equal(e->threads, 1);
        assert_int_equal(e->max_seq, 64);
        assert_int_equal(e->max_batch, 2);
        assert_string_equal(e->device, "cpu, 1 thread"); /* the backend's own words */
        assert_string_equal(e->weights_dtype, "bf16");
        assert_string_equal(e->version, "strata " STRATA_VERSION);
    }
}

static void test_lists_the_ranges_started_with(void **state) {
    static const int b1[] = {0, 4}, b2[] = {0, 2, 4}, b3[] = {0, 1, 3, 4};
    const int *bounds[] = {b1, b2, b3};
    (void)state;
    for (int S = 1; S <= 3; S++) {
        open_pipe(S, bounds[S - 1]);
        assert_int_equal(send_describe(7, 4242), 0);
        tp_run(&pipe, 100);
        assert_int_equal(seen.client_id, 7);
        assert_int_equal(seen.nonce, 4242);
        check_ranges(S, bounds[S - 1]);
        for (int r = 0; r < S; r++) /* idle: no slot in use, nothing queued */
            assert_true(seen.d.stages[r].kv_slots_in_use == 0 && seen.d.stages[r].queue_depth == 0);
        char table[4096];
        client_describe_table(table, sizeof table, &seen.d);
        if (S == 3) {
            assert_non_null(strstr(table, "\n0     [0,1)      embed "));
            assert_non_null(strstr(table, "\n1     [1,3)      -  "));
            assert_non_null(strstr(table, "\n2     [3,4)      head "));
            assert_null(strstr(table, "since start"));
            client_describe_totals(table, sizeof table, &seen.d);
            assert_non_null(strstr(table, "stage 0 since start: queue 0 waited (mean 0 ms), 0 "
                                          "refused full, 0 past their deadline; prefix cache 0 of "
                                          "0 prompts"));
        }
        tp_pipeline_free(&pipe);
    }
}

/* A describe sent while a request is mid-generation: answered, and the request's tokens are
 * still the golden ones. */
static void test_does_not_disturb_requests(void **state) {
    static const int bounds[] = {0, 1, 3, 4};
    struct stage_request req;
    int32_t tokens[256];
    int ended, code;
    char msg[256];
    (void)state;
    open_pipe(3, bounds);
    tp_request(&req, 77, golden.prompt, golden.prompt_len, golden.n_steps);
    assert_int_equal(tp_submit(&pipe, 1, &req), 0);
    for (int i = 0; i < 6; i++)
        tp_round(&pipe);
    assert_int_equal(send_describe(2, 5151), 0);
    tp_run(&pipe, 100000);
    check_ranges(3, bounds);
    /* It saw the request: stage 0 held its KV slot when the describe passed. */
    assert_int_equal(seen.d.stages[0].kv_slots_in_use, 1);
    for (int r = 0; r < 3; r++)
        assert_true(seen.d.stages[r].kv_slots_in_use <= 1 && seen.d.stages[r].queue_depth <= 2);
    int n = tp_client_tokens(&pipe, 77, tokens, 256, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, 0);
    assert_int_equal(n, golden.n_steps);
    assert_memory_equal(tokens, golden.generated, sizeof(int32_t) * (size_t)n);
    tp_pipeline_free(&pipe);
}

static void test_failures_are_errors_not_silence(void **state) {
    static const int bounds[] = {0, 2, 4};
    struct stage_frame f;
    char msg[512];
    (void)state;
    open_pipe(2, bounds);
    /* The link to stage 1 is down when it arrives: at once. */
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 1000, 0, 1, 500), 0);
    assert_int_equal(send_describe(1, 11), 0);
    tp_route(&pipe);
    assert_int_equal(error_for(11, msg, sizeof msg), STRATA_EPEER);
    assert_non_null(strstr(msg, "the link to stage 1 is down"));
    /* Lost on the way (stage 0's frame never reaches stage 1): the timeout ends it. */
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 2000, 0, 0, 500), 0);
    assert_int_equal(send_describe(1, 12), 0);
    while (stage_core_pop_frame(pipe.cores[0], &f)) {
    }
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 2400, 0, 0, 500), 1);
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 2501, 0, 0, 500), 0);
    tp_route(&pipe);
    assert_int_equal(error_for(12, msg, sizeof msg), STRATA_ETIMEOUT);
    assert_non_null(strstr(msg, "did not come back round the ring within 500 ms"));
    /* A ring link lost while it is in flight: at once. */
    assert_int_equal(send_describe(1, 13), 0);
    while (stage_core_pop_frame(pipe.cores[0], &f)) {
    }
    assert_int_equal(stage_core_on_link_down(pipe.cores[0], STAGE_LINK_PREV, 0, "peer closed"), 0);
    tp_route(&pipe);
    assert_int_equal(error_for(13, msg, sizeof msg), STRATA_EPEER);
    assert_non_null(strstr(msg, "ring link from the last stage went down: peer closed"));
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 3000, 0, 0, 500), 0);
    /* Nonce 0 is reserved: a bad frame (the driver drops that client). */
    assert_int_equal(send_describe(1, 0), STRATA_EFORMAT);
    /* More than 16 in flight: the 17th is refused, busy; the 16 are answered. */
    for (int i = 0; i < 17; i++)
        assert_int_equal(send_describe(3, 100 + (uint64_t)i), 0);
    tp_run(&pipe, 100);
    assert_int_equal(error_for(116, msg, sizeof msg), STRATA_EBUSY);
    assert_non_null(strstr(msg, "16 describes are in flight already"));
    assert_int_equal(seen.answers, 16);
    /* A client that leaves takes its describe with it: nothing is sent for it later. */
    assert_int_equal(send_describe(4, 31), 0);
    while (stage_core_pop_frame(pipe.cores[0], &f)) {
    }
    assert_int_equal(stage_core_on_link_down(pipe.cores[0], STAGE_LINK_CLIENT, 4, "gone"), 0);
    assert_int_equal(stage_core_describe_tick(pipe.cores[0], 9000, 0, 0, 500), 0);
    assert_false(stage_core_pop_frame(pipe.cores[0], &f));
    tp_pipeline_free(&pipe);
}

/* An answer that does not list stages 0 .. S-1 (a stage started with another --num-stages)
 * is an error to the client, not a wrong table. */
static void test_bad_answer_refused(void **state) {
    static const int bounds[] = {0, 2, 4};
    struct stage_frame f;
    struct wire_arena arena;
    char msg[512];
    (void)state;
    open_pipe(2, bounds);
    assert_int_equal(send_describe(1, 21), 0);
    uint64_t seq = 0;
    while (stage_core_pop_frame(pipe.cores[0], &f)) {
        struct wire_control c;
        assert_int_equal(wire_read_control(&c, f.data, f.len), 0);
        seq = c.seq;
    }
    struct wire_stage_info only = {
        .stage_index = 0, .num_stages = 2, .layer_end = 2, .tp = 1, .kvp = 1};
    struct wire_control back = {
        .kind = WIRE_CONTROL_DESCRIBE, .nonce = 21, .seq = seq, .stages = &only, .num_stages = 1};
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_control(&arena, &back), 0);
    assert_int_equal(stage_core_on_frame(pipe.cores[0], STAGE_LINK_PREV, 0,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     0);
    wire_arena_free(&arena);
    tp_route(&pipe);
    assert_int_equal(error_for(21, msg, sizeof msg), STRATA_EPEER);
    assert_non_null(strstr(msg, "not stages 0 .. 1 in order"));
    assert_int_equal(seen.answers, 0);
    tp_pipeline_free(&pipe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lists_the_ranges_started_with),
        cmocka_unit_test(test_does_not_disturb_requests),
        cmocka_unit_test(test_failures_are_errors_not_silence),
        cmocka_unit_test(test_bad_answer_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
