/* cmocka tests of the request frames (runtime/request.h): parameters round-trip, malformed
 * parameters are refused with a clear error, client events decode, other frames are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/request.h"
#include "runtime/status.h"
#include "wire/message.h"

static void test_params_round_trip(void **state) {
    struct request_params in = {
        .prompt_len = 17,
        .max_tokens = 40,
        .num_stop_ids = 2,
        .stop_ids = {7, 151645},
        .sampling = {
            .temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .seed = 0xFEEDFACECAFEBEEFULL}};
    struct request_params out;
    struct wire_tensor t;
    int64_t words[REQUEST_PARAMS_WORDS];
    (void)state;
    request_params_pack(&t, words, &in);
    assert_int_equal(request_params_unpack(&out, &t), 0);
    assert_int_equal(out.prompt_len, 17);
    assert_int_equal(out.max_tokens, 40);
    assert_int_equal(out.num_stop_ids, 2);
    assert_int_equal(out.stop_ids[1], 151645);
    assert_true(out.sampling.temperature == 0.7f);
    assert_int_equal(out.sampling.top_k, 20);
    assert_true(out.sampling.top_p == 0.9f);
    assert_true(out.sampling.seed == 0xFEEDFACECAFEBEEFULL);
}

static void test_params_refused(void **state) {
    struct request_params p = {.prompt_len = 3, .max_tokens = 4}, out;
    struct wire_tensor t;
    int64_t words[REQUEST_PARAMS_WORDS];
    (void)state;
    request_params_pack(&t, words, &p);
    words[0] ^= 1;
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "magic"));
    request_params_pack(&t, words, &p);
    words[2] = 0;
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "max_tokens"));
    request_params_pack(&t, words, &p);
    words[7] = REQUEST_MAX_STOP_IDS + 1;
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EINVAL);
    request_params_pack(&t, words, &p);
    words[1] = -5;
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EINVAL);
    request_params_pack(&t, words, &p);
    t.dtype = WIRE_DTYPE_I32;
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EFORMAT);
    memset(&t, 0, sizeof t);
    assert_int_equal(request_params_unpack(&out, &t), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "missing"));
}

static void test_request_frame(void **state) {
    struct wire_arena arena;
    struct wire_activation msg;
    struct request_params p;
    int32_t prompt[3] = {5, 6, 7};
    struct stage_request req = {.nonce = 99,
                                .prompt = prompt,
                                .prompt_len = 3,
                                .max_tokens = 8,
                                .sampling = {.top_p = 1.0f}};
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(
        wire_read_activation(&msg, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(msg.stage_from, -1);
    assert_int_equal(msg.stage_to, 0);
    assert_true(msg.nonce == 99);
    assert_int_equal(msg.hidden.dtype, WIRE_DTYPE_I32);
    assert_memory_equal(msg.hidden.data, prompt, sizeof prompt);
    assert_int_equal(request_params_unpack(&p, &msg.attention_mask), 0);
    assert_int_equal(p.prompt_len, 3);
    req.prompt_len = 0;
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    wire_arena_free(&arena);
}

static void test_events(void **state) {
    struct wire_arena arena;
    struct request_event ev;
    int32_t token = 42;
    struct wire_token_result tr = {
        .nonce = 5, .step = 3, .tokens = &token, .num_tokens = 1, .finish = WIRE_FINISH_STOP};
    struct wire_error err = {.code = STRATA_EBUSY, .message = "all slots in use", .nonce = 6};
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_token_result(&arena, &tr), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_TOKEN);
    assert_int_equal(ev.token, 42);
    assert_true(ev.step == 3 && ev.nonce == 5 && ev.finish == WIRE_FINISH_STOP);
    assert_int_equal(wire_build_error(&arena, &err), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_ERROR);
    assert_int_equal(ev.code, STRATA_EBUSY);
    assert_string_equal(ev.message, "all slots in use");
    assert_int_equal(request_build_cancel(&arena, 5), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
        STRATA_EFORMAT);
    tr.num_tokens = 0;
    assert_int_equal(wire_build_token_result(&arena, &tr), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
        STRATA_EFORMAT);
    wire_arena_free(&arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_round_trip),
        cmocka_unit_test(test_params_refused),
        cmocka_unit_test(test_request_frame),
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
