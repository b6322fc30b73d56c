/* cmocka tests of the request frames (runtime/stage/request.h): a request round-trips as a wire
 * Request, the runtime limits are checked with a clear error, nonce 0 is reserved (never
 * built, a nonce-0 Error decodes as a connection error), client events decode, other
 * frames are refused. Qwen3-VL inputs round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/stage/request.h"
#include "wire/message.h"

static void test_request_round_trip(void **state) {
    struct wire_arena arena;
    struct wire_request msg;
    struct request_params p;
    int32_t prompt[3] = {5, 6, 7};
    struct stage_request req = {
        .nonce = 99,
        .prompt = prompt,
        .prompt_len = 3,
        .max_tokens = 40,
        .num_stop_ids = 2,
        .stop_ids = {7, 151645},
        .sampling = {
            .temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .seed = 0xFEEDFACECAFEBEEFULL}};
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(
        wire_read_request(&msg, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_true(msg.nonce == 99);
    assert_int_equal(msg.prompt_len, 3);
    assert_memory_equal(msg.prompt, prompt, sizeof prompt);
    assert_int_equal(request_params_from_wire(&p, &msg), 0);
    assert_int_equal(p.prompt_len, 3);
    assert_int_equal(p.max_tokens, 40);
    assert_int_equal(p.num_stop_ids, 2);
    assert_int_equal(p.stop_ids[0], 7);
    assert_int_equal(p.stop_ids[1], 151645);
    assert_true(p.sampling.temperature == 0.7f);
    assert_int_equal(p.sampling.top_k, 20);
    assert_true(p.sampling.top_p == 0.9f);
    assert_true(p.sampling.seed == 0xFEEDFACECAFEBEEFULL);
    /* The client side refuses what it must never send. */
    req.prompt_len = 0;
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    req.prompt_len = 3;
    req.num_stop_ids = REQUEST_MAX_STOP_IDS + 1;
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    req.num_stop_ids = 0;
    req.max_tokens = 0;
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    wire_arena_free(&arena);
}

/* The Qwen3-VL inputs travel as Request.image_grids / vision_embeds / deepstack. */
static void test_vision_round_trip(void **state) {
    struct wire_arena arena;
    struct wire_request msg;
    int32_t prompt[3] = {5, 500, 7};
    struct vl_grid grids[2] = {{1, 4, 6}, {1, 2, 2}};
    float embeds[7 * 2], deepstack[3 * 7 * 2];
    for (int i = 0; i < 14; i++)
        embeds[i] = (float)i * 0.5f;
    for (int i = 0; i < 42; i++)
        deepstack[i] = -(float)i;
    struct request_vision v = {grids, 2, 7, 2, embeds, 3, deepstack};
    struct stage_request req = {.nonce = 5, .prompt = prompt, .prompt_len = 3, .max_tokens = 2};
    req.sampling.top_p = 1.0f;
    req.vision = &v;
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(
        wire_read_request(&msg, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(msg.num_images, 2);
    assert_memory_equal(msg.image_grids, grids, sizeof grids);
    assert_int_equal(msg.vision_embeds.ndim, 2);
    assert_true(msg.vision_embeds.shape[0] == 7 && msg.vision_embeds.shape[1] == 2);
    assert_memory_equal(msg.vision_embeds.data, embeds, sizeof embeds);
    assert_int_equal(msg.deepstack.ndim, 3);
    assert_true(msg.deepstack.shape[0] == 3 && msg.deepstack.shape[1] == 7);
    assert_memory_equal(msg.deepstack.data, deepstack, sizeof deepstack);
    /* No DeepStack: the field stays absent. A vision block without grids is refused. */
    v.num_deepstack = 0;
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(
        wire_read_request(&msg, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_false(msg.deepstack.defined);
    v.num_images = 0;
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    wire_arena_free(&arena);
}

/* Image files for a vision stage travel as Request.image_files + sizes + formats. */
static void test_image_files_round_trip(void **state) {
    struct wire_arena arena;
    struct wire_request msg;
    int32_t prompt[3] = {502, 500, 503};
    static const uint8_t files[7] = {0x89, 'P', 'N', 0xff, 0xd8, 0xff, 0};
    static const uint32_t sizes[2] = {3, 4};
    static const uint8_t formats[2] = {WIRE_IMAGE_PNG, WIRE_IMAGE_JPEG};
    struct stage_request req = {.nonce = 9,
                                .prompt = prompt,
                                .prompt_len = 3,
                                .max_tokens = 2,
                                .image_files = files,
                                .image_file_sizes = sizes,
                                .image_formats = formats,
                                .num_image_files = 2};
    req.sampling.top_p = 1.0f;
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    assert_int_equal(
        wire_read_request(&msg, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(msg.num_image_files, 2);
    assert_int_equal(msg.image_files_len, 7);
    assert_memory_equal(msg.image_files, files, 7);
    assert_memory_equal(msg.image_file_sizes, sizes, sizeof sizes);
    assert_memory_equal(msg.image_formats, formats, 2);
    assert_int_equal(msg.num_images, 0);
    wire_arena_free(&arena);
}

static void test_runtime_limits_refused(void **state) {
    static const int32_t prompt[2] = {1, 2};
    static const int32_t many[REQUEST_MAX_STOP_IDS + 1] = {0};
    static const int32_t negative[1] = {-3};
    struct wire_request good = {
        .nonce = 3, .prompt = prompt, .prompt_len = 2, .max_tokens = 4, .top_p = 1.0f};
    struct wire_request msg;
    struct request_params p;
    (void)state;
    assert_int_equal(request_params_from_wire(&p, &good), 0);
    msg = good;
    msg.stop_ids = many;
    msg.num_stop_ids = REQUEST_MAX_STOP_IDS + 1;
    assert_int_equal(request_params_from_wire(&p, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "stop ids"));
    msg = good;
    msg.stop_ids = negative;
    msg.num_stop_ids = 1;
    assert_int_equal(request_params_from_wire(&p, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "stop id -3"));
    msg = good;
    msg.max_tokens = -1;
    assert_int_equal(request_params_from_wire(&p, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "max_tokens"));
    msg = good;
    msg.nonce = 0;
    assert_int_equal(request_params_from_wire(&p, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "reserved"));
}

/* Nonce 0 is reserved: never built, never cancelled; an Error with it is a connection
 * error, and a token with it is malformed. */
static void test_nonce_zero_reserved(void **state) {
    struct wire_arena arena;
    struct request_event ev;
    int32_t prompt[1] = {1}, token = 4;
    struct stage_request req = {.nonce = 0, .prompt = prompt, .prompt_len = 1, .max_tokens = 2};
    struct wire_error err = {.code = STRATA_EFORMAT, .message = "bad frame: garbage", .nonce = 0};
    struct wire_token_result tr = {.nonce = 0, .tokens = &token, .num_tokens = 1};
    (void)state;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "nonce 0 is reserved"));
    assert_int_equal(request_build_cancel(&arena, 0), STRATA_EINVAL);
    assert_int_equal(wire_build_error(&arena, &err), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(ev.kind, REQUEST_EVENT_CONNECTION_ERROR);
    assert_int_equal(ev.code, STRATA_EFORMAT);
    assert_string_equal(ev.message, "bad frame: garbage");
    assert_int_equal(wire_build_token_result(&arena, &tr), 0);
    assert_int_equal(
        request_event_decode(&ev, wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
        STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "reserved nonce 0"));
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
    assert_true(ev.nonce == 6);
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
        cmocka_unit_test(test_request_round_trip),
        cmocka_unit_test(test_vision_round_trip),
        cmocka_unit_test(test_image_files_round_trip),
        cmocka_unit_test(test_runtime_limits_refused),
        cmocka_unit_test(test_nonce_zero_reserved),
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
