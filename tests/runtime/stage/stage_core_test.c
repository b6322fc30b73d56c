/* cmocka tests of the stage core without sockets: the generation loop (tokens equal the
 * golden model's and are identical for every split), the multiplexer (batched requests
 * equal solo runs; decode rows of several requests share one microbatch; chunked prefill
 * keeps several stages busy), frame checks, cancellation and link loss. Stage 0's admission and
 * prefix reuse have their own tests (stage_admission_test.c, stage_prefix_test.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "tests/runtime/stage/stage_test_pipeline.h"
#include "wire/message.h"

static struct tp_golden golden_tied, golden_untied, golden_long;

static int setup(void **state) {
    (void)state;
    if (tp_golden_load(&golden_tied, "qwen3_gqa_tied") < 0 ||
        tp_golden_load(&golden_untied, "qwen3_mha_untied") < 0 ||
        tp_golden_load(&golden_long, "qwen3_long_prompt") < 0) {
        print_error("golden load failed: %s\n", strata_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&golden_tied);
    tp_golden_free(&golden_untied);
    tp_golden_free(&golden_long);
    return 0;
}

static struct tp_pipeline pipe_a, pipe_b; /* large: keep off the stack */

/* Runs the golden prompt through S stages; checks tokens against the golden and returns
 * the last-stage result (owned by p). */
static const struct stage_result *run_golden(struct tp_pipeline *p, struct tp_golden *g, int S,
                                             const int *bounds, int chunk) {
    struct stage_request req;
    int32_t tokens[256];
    int ended, code, n;
    char msg[512];
    assert_int_equal(tp_pipeline_init(p, g, S, bounds, 256, 4, chunk), 0);
    tp_request(&req, 77, g->prompt, g->prompt_len, g->n_steps);
    assert_int_equal(tp_submit(p, 1, &req), 0);
    tp_run(p, 100000);
    n = tp_client_tokens(p, 77, tokens, 256, &ended, &code, msg, sizeof msg);
    if (code != 0) print_error("request failed: %s\n", msg);
    assert_int_equal(code, 0);
    assert_true(ended);
    assert_int_equal(n, g->n_steps);
    assert_memory_equal(tokens, g->generated, sizeof(int32_t) * (size_t)n);
    const struct stage_result *r = tp_last_result(p, 77);
    assert_non_null(r);
    assert_int_equal(r->n_tokens, g->n_steps);
    assert_non_null(r->logits);
    assert_memory_equal(r->tokens, g->generated, sizeof(int32_t) * (size_t)n);
    for (int s = 0; s < S; s++) {
        struct stage_core_stats st;
        stage_core_get_stats(p->cores[s], &st);
        assert_int_equal(st.active_requests, 0); /* every stage freed its KV slot */
    }
    return r;
}

static void test_splits_identical(void **state) {
    struct tp_golden *cases[] = {&golden_tied, &golden_untied, &golden_long};
    (void)state;
    for (int c = 0; c < 3; c++) {
        struct tp_golden *g = cases[c];
        const struct stage_result *one = run_golden(&pipe_a, g, 1, NULL, 16);
        for (int S = 2; S <= 4; S++) {
            const struct stage_result *split = run_golden(&pipe_b, g, S, NULL, 16);
            assert_memory_equal(split->logits, one->logits,
                                sizeof(float) * (size_t)g->n_steps * g->cfg.vocab_size);
            tp_pipeline_free(&pipe_b);
        }
        {
            int bounds[] = {0, 3, 4}; /* uneven explicit split */
            const struct stage_result *split = run_golden(&pipe_b, g, 2, bounds, 16);
            assert_memory_equal(split->logits, one->logits,
                                sizeof(float) * (size_t)g->n_steps * g->cfg.vocab_size);
            tp_pipeline_free(&pipe_b);
        }
        tp_pipeline_free(&pipe_a);
    }
}

/* Eight requests with different prompts at once through 4 stages: each equals its solo run,
 * and decode rows of different requests share microbatches. */
static void test_concurrent_equals_solo(void **state) {
    struct tp_golden *g = &golden_long;
    int32_t prompts[8][8], solo[8][16], got[16];
    int ended, code, n;
    char msg[512];
    struct stage_request req;
    struct stage_core_stats st;
    (void)state;
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < 8; k++)
            prompts[i][k] = g->prompt[(i * 5 + k) % g->prompt_len];
        assert_int_equal(tp_pipeline_init(&pipe_a, g, 4, NULL, 128, 8, 4), 0);
        tp_request(&req, 100 + i, prompts[i], 3 + i % 5, 12);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
        tp_run(&pipe_a, 100000);
        n = tp_client_tokens(&pipe_a, 100 + i, solo[i], 16, &ended, &code, msg, sizeof msg);
        assert_int_equal(code, 0);
        assert_int_equal(n, 12);
        tp_pipeline_free(&pipe_a);
    }
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 4, NULL, 128, 8, 4), 0);
    for (int i = 0; i < 8; i++) {
        tp_request(&req, 100 + i, prompts[i], 3 + i % 5, 12);
        assert_int_equal(tp_submit(&pipe_a, (uint32_t)(i % 3), &req), 0);
    }
    tp_run(&pipe_a, 100000);
    for (int i = 0; i < 8; i++) {
        n = tp_client_tokens(&pipe_a, 100 + i, got, 16, &ended, &code, msg, sizeof msg);
        assert_int_equal(code, 0);
        assert_int_equal(n, 12);
        assert_memory_equal(got, solo[i], sizeof(int32_t) * 12);
    }
    /* Every event went to the client that sent the request. */
    for (int e = 0; e < pipe_a.num_events; e++)
        assert_int_equal(pipe_a.event_client[e], (uint32_t)((pipe_a.events[e].nonce - 100) % 3));
    stage_core_get_stats(pipe_a.cores[2], &st);
    /* 8 requests x (prefill chunks + 11 decode rows) on 4 stages: stage 0 forms groups of
     * 2 requests, so stage 2 ran about half as many microbatches as request steps. */
    print_message("stage 2: %llu microbatches for %d request steps\n",
                  (unsigned long long)st.microbatches, 8 * 12);
    assert_true(st.microbatches <= 8 * 12 * 3 / 4);
    tp_pipeline_free(&pipe_a);
}

/* With a long prompt in small chunks, stage 1 computes chunk k while stage 0 computes k+1. */
static void test_chunked_prefill_overlaps(void **state) {
    struct tp_golden *g = &golden_long;
    struct stage_request req;
    int both_busy = 0;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 128, 2, 8), 0);
    tp_request(&req, 5, g->prompt, g->prompt_len, 2);
    assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    for (int round = 0; round < 10; round++) {
        if (stage_core_has_work(pipe_a.cores[0]) && stage_core_has_work(pipe_a.cores[1]))
            both_busy++;
        tp_round(&pipe_a);
    }
    assert_true(both_busy >= 3); /* 40 tokens / 8 = 5 chunks in flight one after another */
    tp_pipeline_free(&pipe_a);
}

/* S requests on S stages: stage 0 staggers them into S groups, so in steady state every
 * stage has work in the same round (no stage waits for a request's round trip). */
static void test_all_stages_busy(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    int32_t prompt[4] = {11, 12, 13, 14};
    int all_busy = 0, rounds = 0;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 4, NULL, 128, 4, 16), 0);
    for (int i = 0; i < 4; i++) {
        tp_request(&req, 60 + i, prompt, 1 + i, 40);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    for (int round = 0; round < 100; round++) {
        int busy = 0;
        tp_route(&pipe_a);
        for (int r = 0; r < 4; r++)
            busy += stage_core_has_work(pipe_a.cores[r]);
        if (round >= 8) { /* past the pipeline fill */
            rounds++;
            all_busy += busy == 4;
        }
        tp_round(&pipe_a);
    }
    print_message("all 4 stages busy in %d of %d steady-state rounds\n", all_busy, rounds);
    assert_true(all_busy * 10 >= rounds * 9);
    tp_pipeline_free(&pipe_a);
}

/* Stage 0 of a pipeline cuts each prompt into S chunks and computes one prompt chunk per
 * microbatch, every request's prompt before further decode rows; the tokens stay those of
 * each request alone. */
static void test_stage0_streams_prompt_chunks(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    struct stage_core_stats st;
    int32_t prompts[4][8], solo[4][6], got[8];
    int ended, code;
    char msg[512];
    (void)state;
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 8; k++)
            prompts[i][k] = g->prompt[(3 * i + k) % g->prompt_len];
        assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 64, 4, 16), 0);
        tp_request(&req, 30 + i, prompts[i], 8, 6);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
        tp_run(&pipe_a, 10000);
        assert_int_equal(
            tp_client_tokens(&pipe_a, 30 + i, solo[i], 6, &ended, &code, msg, sizeof msg), 6);
        tp_pipeline_free(&pipe_a);
    }
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 64, 4, 16), 0);
    for (int i = 0; i < 4; i++) {
        tp_request(&req, 30 + i, prompts[i], 8, 6);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    }
    /* 4 prompts of 8 rows on 2 stages: 8 chunks of 4 rows (not 4 of --chunk 16), one per
     * microbatch although stage 0 may batch 2 requests. */
    for (int step = 1; step <= 8; step++) {
        assert_int_equal(stage_core_step(pipe_a.cores[0]), 1);
        stage_core_get_stats(pipe_a.cores[0], &st);
        assert_int_equal(st.rows, 4 * step);
    }
    tp_run(&pipe_a, 10000);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tp_client_tokens(&pipe_a, 30 + i, got, 8, &ended, &code, msg, sizeof msg),
                         6);
        assert_int_equal(code, 0);
        assert_memory_equal(got, solo[i], sizeof(int32_t) * 6);
    }
    tp_pipeline_free(&pipe_a);
}

/* One stage with several requests: one step advances every ready request. */
static void test_multiplexer_batches_decode(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    int32_t prompt[4] = {1, 2, 3, 4};
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 1, NULL, 64, 4, 16), 0);
    for (int i = 0; i < 4; i++) {
        tp_request(&req, 1 + i, prompt, 1 + i, 5);
        assert_int_equal(tp_submit(&pipe_a, 9, &req), 0);
    }
    assert_int_equal(stage_core_step(pipe_a.cores[0]), 4); /* four prefills, one microbatch */
    assert_int_equal(stage_core_step(pipe_a.cores[0]), 4); /* four decode rows */
    tp_run(&pipe_a, 1000);
    tp_pipeline_free(&pipe_a);
}

/* Forwards a Request for `nonce` with `params` (prompt of zeros) to `core` on PREV, as the
 * previous stage does when it admits a request. */
static void send_forwarded_request(struct stage_core *core, uint64_t nonce,
                                   const struct request_params *params) {
    struct wire_arena arena;
    struct stage_request req;
    int32_t *prompt = calloc((size_t)params->prompt_len, sizeof *prompt);
    memset(&req, 0, sizeof req);
    req.nonce = nonce;
    req.prompt = prompt;
    req.prompt_len = params->prompt_len;
    req.max_tokens = params->max_tokens;
    req.num_stop_ids = params->num_stop_ids;
    memcpy(req.stop_ids, params->stop_ids, sizeof req.stop_ids);
    req.sampling = params->sampling;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(stage_core_on_frame(core, STAGE_LINK_PREV, 0, wire_arena_frame(&arena),
                                         wire_arena_frame_len(&arena)),
                     0);
    wire_arena_free(&arena);
    free(prompt);
}

/* Builds an activation frame for stage 1 of a 2-stage pipeline by hand; with `params` the
 * request's forwarded Request goes first. */
static void send_activation(struct stage_core *core, int from, int to, uint64_t nonce,
                            uint64_t step, uint64_t pos, int rows, int H,
                            const struct request_params *params) {
    struct wire_arena arena;
    struct wire_activation msg;
    float *hidden = calloc((size_t)rows * H, sizeof(float));
    memset(&msg, 0, sizeof msg);
    msg.stage_from = from;
    msg.stage_to = to;
    msg.step = step;
    msg.pos = pos;
    msg.nonce = nonce;
    msg.hidden = (struct wire_tensor){.defined = 1,
                                      .dtype = WIRE_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {rows, H},
                                      .codec = WIRE_CODEC_NONE,
                                      .data = hidden,
                                      .nbytes = sizeof(float) * rows * H};
    if (params) send_forwarded_request(core, nonce, params);
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_activation(&arena, &msg), 0);
    assert_int_equal(stage_core_on_frame(core, STAGE_LINK_PREV, 0, wire_arena_frame(&arena),
                                         wire_arena_frame_len(&arena)),
                     0);
    wire_arena_free(&arena);
    free(hidden);
}

/* Pops frames until an Error on `link`; returns its code and copies its message. */
static int pop_error(struct stage_core *core, enum stage_link link, char *msg, size_t cap) {
    struct stage_frame f;
    int code = 0;
    while (stage_core_pop_frame(core, &f)) {
        struct wire_error e;
        if (code == 0 && f.link == link && wire_read_error(&e, f.data, f.len) == 0) {
            code = e.code;
            snprintf(msg, cap, "%s", e.message);
        }
    }
    return code;
}

static void test_frame_checks(void **state) {
    struct tp_golden *g = &golden_tied;
    struct request_params params = {.prompt_len = 3, .max_tokens = 4, .sampling = {.top_p = 1.0f}};
    int H = g->cfg.hidden_size;
    char msg[512];
    struct stage_core *c1;
    struct stage_core_stats st;
    static const uint8_t garbage[64] = {1, 2, 3};
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 32, 2, 8), 0);
    c1 = pipe_a.cores[1];
    /* Wrong destination stage. */
    send_activation(c1, 0, 2, 1, 0, 0, 3, H, &params);
    assert_int_equal(pop_error(c1, STAGE_LINK_PREV, msg, sizeof msg), STRATA_EFORMAT);
    assert_non_null(strstr(msg, "expected 0 -> 1"));
    /* Good first chunk, then a chunk at the wrong position. */
    send_activation(c1, 0, 1, 2, 0, 0, 2, H, &params);
    stage_core_get_stats(c1, &st);
    assert_int_equal(st.active_requests, 1);
    send_activation(c1, 0, 1, 2, 0, 1, 1, H, NULL);
    assert_int_equal(pop_error(c1, STAGE_LINK_PREV, msg, sizeof msg), STRATA_EFORMAT);
    assert_non_null(strstr(msg, "expected step 0 pos 2"));
    stage_core_get_stats(c1, &st);
    assert_int_equal(st.active_requests, 0); /* the failed request freed its slot */
    /* Wrong step for a decode row. */
    send_activation(c1, 0, 1, 3, 0, 0, 3, H, &params);
    send_activation(c1, 0, 1, 3, 2, 3, 1, H, NULL);
    assert_int_equal(pop_error(c1, STAGE_LINK_NEXT, msg, sizeof msg), STRATA_EFORMAT);
    assert_non_null(strstr(msg, "expected step 1 pos 3"));
    /* A non-opening frame for a request this stage never saw. */
    send_activation(c1, 0, 1, 4, 1, 5, 1, H, NULL);
    assert_int_equal(pop_error(c1, STAGE_LINK_PREV, msg, sizeof msg), STRATA_EFORMAT);
    assert_non_null(strstr(msg, "unknown request"));
    /* Wrong hidden width. */
    send_activation(c1, 0, 1, 6, 0, 0, 3, H / 2, &params);
    assert_int_equal(pop_error(c1, STAGE_LINK_PREV, msg, sizeof msg), STRATA_EFORMAT);
    /* Bytes that are no frame, and a client frame where none belongs. */
    assert_int_equal(stage_core_on_frame(c1, STAGE_LINK_PREV, 0, garbage, sizeof garbage),
                     STRATA_EFORMAT);
    {
        struct stage_request req;
        struct wire_arena arena;
        int32_t prompt[1] = {1};
        tp_request(&req, 9, prompt, 1, 2);
        wire_arena_init(&arena, 0);
        request_build(&arena, &req);
        assert_true(stage_core_on_frame(c1, STAGE_LINK_CLIENT, 0, wire_arena_frame(&arena),
                                        wire_arena_frame_len(&arena)) < 0);
        wire_arena_free(&arena);
    }
    tp_pipeline_free(&pipe_a);
}

/* Frame `frame` [len] patched: the only 8-byte occurrence of `from` becomes `to`. */
static void patch_u64(uint8_t *frame, size_t len, uint64_t from, uint64_t to) {
    int found = 0;
    for (size_t i = 0; i + 8 <= len; i++)
        if (memcmp(frame + i, &from, 8) == 0) {
            memcpy(frame + i, &to, 8);
            found++;
        }
    assert_int_equal(found, 1);
}

/* A stage that admits a Request forwards the same bytes to the next stage before any
 * activation; a later stage refuses one it has no slot for, upstream. */
static void test_request_forwarded_before_activations(void **state) {
    struct tp_golden *g = &golden_tied;
    struct request_params params = {.prompt_len = 3, .max_tokens = 4, .sampling = {.top_p = 1.0f}};
    struct stage_core *c1;
    struct stage_frame f;
    int n_frames = 0;
    char msg[512];
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 3, NULL, 32, 2, 8), 0);
    c1 = pipe_a.cores[1];
    send_forwarded_request(c1, 11, &params);
    while (stage_core_pop_frame(c1, &f)) {
        struct wire_request req;
        assert_int_equal(f.link, STAGE_LINK_NEXT);
        assert_int_equal(wire_read_request(&req, f.data, f.len), 0);
        assert_true(req.nonce == 11 && req.prompt_len == 3 && req.max_tokens == 4);
        n_frames++;
    }
    assert_int_equal(n_frames, 1);
    /* Stage 0 forwards a client's request at admission, ahead of its first activation. */
    {
        struct stage_request req;
        tp_request(&req, 12, g->prompt, g->prompt_len, 2);
        assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
        assert_int_equal(stage_core_step(pipe_a.cores[0]), 1);
        assert_int_equal(stage_core_pop_frame(pipe_a.cores[0], &f), 1);
        enum wire_kind kind;
        assert_int_equal(wire_verify(&kind, NULL, f.data, f.len), 0);
        assert_int_equal(kind, WIRE_KIND_REQUEST);
        assert_int_equal(f.link, STAGE_LINK_NEXT);
        assert_int_equal(stage_core_pop_frame(pipe_a.cores[0], &f), 1);
        assert_int_equal(wire_verify(&kind, NULL, f.data, f.len), 0);
        assert_int_equal(kind, WIRE_KIND_ACTIVATION);
    }
    /* Slots on stage 1: 11 and one more; the third is refused upstream. */
    send_forwarded_request(c1, 13, &params);
    send_forwarded_request(c1, 14, &params);
    assert_int_equal(pop_error(c1, STAGE_LINK_PREV, msg, sizeof msg), STRATA_EBUSY);
    assert_non_null(strstr(msg, "KV slots are in use"));
    tp_pipeline_free(&pipe_a);
}

/* Nonce 0 is reserved: a client Request with it is an unusable frame (the driver answers
 * with a connection-level Error and drops the client), an Error with nonce 0 from a stage
 * is a connection error (no request is blamed), an activation with it is refused. */
static void test_nonce_zero_is_connection_level(void **state) {
    struct tp_golden *g = &golden_tied;
    struct request_params params = {.prompt_len = 3, .max_tokens = 4, .sampling = {.top_p = 1.0f}};
    struct stage_request req;
    struct wire_arena arena;
    struct stage_core_stats st;
    struct wire_error err = {.code = STRATA_EFORMAT, .message = "bad frame: junk", .nonce = 0};
    uint8_t *frame;
    size_t len;
    int H = g->cfg.hidden_size;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 32, 2, 8), 0);
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    tp_request(&req, 0x5a5a5a5a5a5a5a5aull, g->prompt, g->prompt_len, 2);
    assert_int_equal(request_build(&arena, &req), 0);
    len = wire_arena_frame_len(&arena);
    frame = malloc(len);
    memcpy(frame, wire_arena_frame(&arena), len);
    patch_u64(frame, len, req.nonce, 0);
    assert_int_equal(stage_core_on_frame(pipe_a.cores[0], STAGE_LINK_CLIENT, 1, frame, len),
                     STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "nonce 0 is reserved"));
    free(frame);
    stage_core_get_stats(pipe_a.cores[0], &st);
    assert_int_equal(st.active_requests, 0);

    /* A request open on stage 1, then a connection-level Error from stage 0. */
    send_forwarded_request(pipe_a.cores[1], 21, &params);
    assert_int_equal(wire_build_error(&arena, &err), 0);
    assert_int_equal(stage_core_on_frame(pipe_a.cores[1], STAGE_LINK_PREV, 0,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     STRATA_EPEER);
    assert_non_null(strstr(strata_last_error(), "connection error: bad frame: junk"));
    stage_core_get_stats(pipe_a.cores[1], &st);
    assert_int_equal(st.active_requests, 1); /* no request was blamed */
    /* An Error with the request's own nonce fails exactly that request. */
    err.nonce = 21;
    assert_int_equal(wire_build_error(&arena, &err), 0);
    assert_int_equal(stage_core_on_frame(pipe_a.cores[1], STAGE_LINK_PREV, 0,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     0);
    stage_core_get_stats(pipe_a.cores[1], &st);
    assert_int_equal(st.active_requests, 0);
    /* An activation with nonce 0. */
    {
        float *hidden = calloc((size_t)H, sizeof(float));
        struct wire_activation act = {.stage_from = 0, .stage_to = 1, .nonce = 0};
        act.hidden = (struct wire_tensor){.defined = 1,
                                          .dtype = WIRE_DTYPE_F32,
                                          .ndim = 2,
                                          .shape = {1, H},
                                          .data = hidden,
                                          .nbytes = sizeof(float) * H};
        assert_int_equal(wire_build_activation(&arena, &act), 0);
        assert_int_equal(stage_core_on_frame(pipe_a.cores[1], STAGE_LINK_PREV, 0,
                                             wire_arena_frame(&arena),
                                             wire_arena_frame_len(&arena)),
                         STRATA_EFORMAT);
        assert_non_null(strstr(strata_last_error(), "reserved nonce 0"));
        free(hidden);
    }
    /* The router turns a nonce-0 Error to a client into a connection event. */
    err.nonce = 0;
    assert_int_equal(wire_build_error(&arena, &err), 0);
    {
        struct request_event ev;
        assert_int_equal(
            request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
        assert_int_equal(ev.kind, REQUEST_EVENT_CONNECTION_ERROR);
    }
    wire_arena_free(&arena);
    tp_pipeline_free(&pipe_a);
}

/* Sends Control Ping `seq` to `core` on PREV (the core answers with a Pong on PREV). */
static void send_ping(struct stage_core *core, struct wire_arena *arena, uint64_t seq) {
    struct wire_control ping = {.kind = WIRE_CONTROL_PING, .nonce = 0, .seq = seq};
    assert_int_equal(wire_build_control(arena, &ping), 0);
    assert_int_equal(stage_core_on_frame(core, STAGE_LINK_PREV, 0, wire_arena_frame(arena),
                                         wire_arena_frame_len(arena)),
                     0);
}

/* Pops one frame and checks it is the Pong for `seq`; returns its data pointer. */
static const uint8_t *pop_pong(struct stage_core *core, uint64_t seq) {
    struct stage_frame f;
    struct wire_control pong;
    assert_int_equal(stage_core_pop_frame(core, &f), 1);
    assert_int_equal((uintptr_t)f.data % 64, 0);
    assert_int_equal(wire_read_control(&pong, f.data, f.len), 0);
    assert_int_equal(pong.kind, WIRE_CONTROL_PONG);
    assert_true(pong.seq == seq);
    return f.data;
}

/* The outgoing frame queue reuses its buffer: frames keep their order and bytes when the
 * driver drains part of the queue between calls (compaction) and when a backlog makes it
 * grow; once drained, the next frame lands in the same place again (no new buffer). */
static void test_frame_queue_reuses_its_buffer(void **state) {
    struct tp_golden *g = &golden_tied;
    struct wire_arena arena;
    struct stage_core *c1;
    const uint8_t *again;
    uint64_t next_in = 1, next_out = 1;
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 32, 2, 8), 0);
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    c1 = pipe_a.cores[1];
    send_ping(c1, &arena, next_in++);
    pop_pong(c1, next_out++);
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 7 + round * 40; i++) /* a growing backlog */
            send_ping(c1, &arena, next_in++);
        for (int i = 0; i < 3 + round * 20; i++) /* drained in part only */
            pop_pong(c1, next_out++);
    }
    while (next_out < next_in)
        pop_pong(c1, next_out++);
    {
        struct stage_frame f;
        assert_int_equal(stage_core_pop_frame(c1, &f), 0);
    }
    send_ping(c1, &arena, next_in++);
    again = pop_pong(c1, next_out++);
    send_ping(c1, &arena, next_in++);
    assert_ptr_equal(pop_pong(c1, next_out++), again);
    wire_arena_free(&arena);
    tp_pipeline_free(&pipe_a);
}

static void test_cancel_frees_every_stage(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    struct wire_arena arena;
    int32_t tokens[64];
    int ended, code, n;
    char msg[512];
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 3, NULL, 64, 2, 8), 0);
    tp_request(&req, 42, g->prompt, g->prompt_len, 30);
    assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    for (int i = 0; i < 12; i++)
        tp_round(&pipe_a);
    n = tp_client_tokens(&pipe_a, 42, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_true(n > 0 && !ended);
    wire_arena_init(&arena, 0);
    request_build_cancel(&arena, 42);
    assert_int_equal(stage_core_on_frame(pipe_a.cores[0], STAGE_LINK_CLIENT, 1,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     0);
    wire_arena_free(&arena);
    tp_run(&pipe_a, 1000);
    tp_client_tokens(&pipe_a, 42, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_ECANCELED);
    for (int r = 0; r < 3; r++) {
        struct stage_core_stats st;
        stage_core_get_stats(pipe_a.cores[r], &st);
        assert_int_equal(st.active_requests, 0);
        assert_int_equal(pipe_a.num_results[r], 1);
        assert_int_equal(pipe_a.results[r][0].finish, STAGE_FINISH_CANCELLED);
    }
    tp_pipeline_free(&pipe_a);
}

/* A dead link between stages 1 and 2 of 4: every stage fails the request, the client hears
 * a clear error, and a new request is served once the link is back (here: at once). */
static void test_link_down_fails_everywhere(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    int32_t tokens[64];
    int ended, code;
    char msg[512];
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 4, NULL, 64, 2, 8), 0);
    tp_request(&req, 7, g->prompt, g->prompt_len, 30);
    assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    for (int i = 0; i < 10; i++)
        tp_round(&pipe_a);
    stage_core_on_link_down(pipe_a.cores[1], STAGE_LINK_NEXT, 0, "connection reset");
    stage_core_on_link_down(pipe_a.cores[2], STAGE_LINK_PREV, 0, "connection reset");
    tp_run(&pipe_a, 1000);
    tp_client_tokens(&pipe_a, 7, tokens, 64, &ended, &code, msg, sizeof msg);
    assert_int_equal(code, STRATA_EPEER);
    assert_non_null(strstr(msg, "connection reset"));
    for (int r = 0; r < 4; r++) {
        struct stage_core_stats st;
        stage_core_get_stats(pipe_a.cores[r], &st);
        assert_int_equal(st.active_requests, 0);
        assert_int_equal(pipe_a.results[r][0].finish, STAGE_FINISH_ERROR);
    }
    tp_request(&req, 8, g->prompt, g->prompt_len, g->n_steps);
    assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    tp_run(&pipe_a, 100000);
    assert_int_equal(tp_client_tokens(&pipe_a, 8, tokens, 64, &ended, &code, msg, sizeof msg),
                     g->n_steps);
    assert_int_equal(code, 0);
    assert_memory_equal(tokens, g->generated, sizeof(int32_t) * (size_t)g->n_steps);
    tp_pipeline_free(&pipe_a);
}

/* Valid frames with bytes flipped, truncated or extended, fed to every stage on every link:
 * never a crash (the sanitizer pass runs this too), and the pipeline still serves a
 * request with the golden tokens afterwards. */
static void test_mutated_frames(void **state) {
    struct tp_golden *g = &golden_tied;
    struct stage_request req;
    struct wire_arena arena;
    uint8_t *seeds[4], buf[4096];
    size_t seed_len[4];
    uint64_t rng = 12345;
    int32_t tokens[64];
    int ended, code;
    char msg[512];
    int H = g->cfg.hidden_size;
    float hidden[2 * 64] = {0};
    struct wire_activation act = {.stage_from = 0, .stage_to = 1, .nonce = 3};
    int32_t token = 5;
    struct wire_token_result tr = {.nonce = 3, .tokens = &token, .num_tokens = 1};
    (void)state;
    assert_int_equal(tp_pipeline_init(&pipe_a, g, 2, NULL, 32, 2, 8), 0);
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    tp_request(&req, 3, g->prompt, g->prompt_len, 3);
    act.hidden = (struct wire_tensor){.defined = 1,
                                      .dtype = WIRE_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {2, H},
                                      .data = hidden,
                                      .nbytes = sizeof(float) * 2 * H};
    for (int k = 0; k < 4; k++) {
        if (k == 0)
            request_build(&arena, &req);
        else if (k == 1)
            wire_build_activation(&arena, &act);
        else if (k == 2)
            wire_build_token_result(&arena, &tr);
        else
            request_build_cancel(&arena, 3);
        seed_len[k] = wire_arena_frame_len(&arena);
        seeds[k] = malloc(seed_len[k]);
        memcpy(seeds[k], wire_arena_frame(&arena), seed_len[k]);
    }
    for (int i = 0; i < 3000; i++) {
        int k = i % 4;
        size_t len = seed_len[k];
        assert_true(len <= sizeof buf);
        memcpy(buf, seeds[k], len);
        for (int flips = 1 + (int)(rng % 4); flips > 0; flips--) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[(rng >> 33) % len] ^= (uint8_t)(1u << ((rng >> 20) % 8));
        }
        if (i % 7 == 0) len = (size_t)((rng >> 40) % len);
        stage_core_on_frame(pipe_a.cores[0], STAGE_LINK_CLIENT, 1, buf, len);
        stage_core_on_frame(pipe_a.cores[1], STAGE_LINK_PREV, 0, buf, len);
        stage_core_on_frame(pipe_a.cores[0], STAGE_LINK_PREV, 0, buf, len);
        stage_core_on_frame(pipe_a.cores[1], STAGE_LINK_NEXT, 0, buf, len);
        if (i % 50 == 0) tp_run(&pipe_a, 2000);
    }
    tp_run(&pipe_a, 20000);
    /* The driver drops a link that delivered a bad frame; that frees whatever the garbage
     * opened (e.g. a request admitted from a mutated first chunk). */
    stage_core_on_link_down(pipe_a.cores[0], STAGE_LINK_NEXT, 0, "dropped after bad frames");
    stage_core_on_link_down(pipe_a.cores[1], STAGE_LINK_PREV, 0, "dropped after bad frames");
    tp_run(&pipe_a, 20000);
    for (int r = 0; r < 2; r++) {
        struct stage_core_stats st;
        stage_core_get_stats(pipe_a.cores[r], &st);
        assert_int_equal(st.active_requests, 0);
    }
    pipe_a.num_events = 0;
    for (int k = 0; k < 4; k++)
        free(seeds[k]);
    wire_arena_free(&arena);
    tp_request(&req, 999, g->prompt, g->prompt_len, g->n_steps);
    assert_int_equal(tp_submit(&pipe_a, 1, &req), 0);
    tp_run(&pipe_a, 100000);
    assert_int_equal(tp_client_tokens(&pipe_a, 999, tokens, 64, &ended, &code, msg, sizeof msg),
                     g->n_steps);
    assert_int_equal(code, 0);
    assert_memory_equal(tokens, g->generated, sizeof(int32_t) * (size_t)g->n_steps);
    tp_pipeline_free(&pipe_a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits_identical),
        cmocka_unit_test(test_concurrent_equals_solo),
        cmocka_unit_test(test_chunked_prefill_overlaps),
        cmocka_unit_test(test_multiplexer_batches_decode),
        cmocka_unit_test(test_all_stages_busy),
        cmocka_unit_test(test_stage0_streams_prompt_chunks),
        cmocka_unit_test(test_frame_checks),
        cmocka_unit_test(test_request_forwarded_before_activations),
        cmocka_unit_test(test_nonce_zero_is_connection_level),
        cmocka_unit_test(test_frame_queue_reuses_its_buffer),
        cmocka_unit_test(test_cancel_frees_every_stage),
        cmocka_unit_test(test_link_down_fails_everywhere),
        cmocka_unit_test(test_mutated_frames),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
