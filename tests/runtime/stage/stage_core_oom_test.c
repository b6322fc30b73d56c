/* Out of memory never drops an Error frame or a result silently. The test binary wraps
 * aligned_alloc (the outgoing frame queue's only allocator, runtime/stage/stage_pool.c)
 * with -Wl,--wrap so it can fail on demand: a refused request's Error frame then cannot
 * be queued, and the core must report that loss as a result record after the refusal. */
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

void *__real_aligned_alloc(size_t alignment, size_t size);
void *__wrap_aligned_alloc(size_t alignment, size_t size);

static int fail_aligned_alloc;

void *__wrap_aligned_alloc(size_t alignment, size_t size) {
    return fail_aligned_alloc ? NULL : __real_aligned_alloc(alignment, size);
}

static struct tp_golden golden;
static struct tp_pipeline pipe_one;

static void test_lost_error_frame_is_reported(void **state) {
    struct stage_request req;
    struct stage_frame frame;
    struct stage_result result;
    struct stage_core_stats stats;
    struct wire_arena arena;
    (void)state;
    assert_int_equal(tp_golden_load(&golden, "qwen3_gqa_tied"), 0);
    assert_int_equal(tp_pipeline_init(&pipe_one, &golden, 1, NULL, 16, 2, 8), 0);
    /* 40 prompt tokens do not fit --max-seq 16: refused with an Error to the client. */
    tp_request(&req, 5, golden.prompt, 40, 4);
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(request_build(&arena, &req), 0);
    fail_aligned_alloc = 1;
    assert_int_equal(stage_core_on_frame(pipe_one.cores[0], STAGE_LINK_CLIENT, 1,
                                         wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
                     0);
    fail_aligned_alloc = 0;
    wire_arena_free(&arena);
    assert_int_equal(stage_core_pop_frame(pipe_one.cores[0], &frame), 0); /* not queued */
    assert_int_equal(stage_core_pop_result(pipe_one.cores[0], &result), 1);
    assert_int_equal(result.nonce, 5); /* the refusal itself */
    assert_int_equal(result.finish, STAGE_FINISH_ERROR);
    stage_result_free(&result);
    assert_int_equal(stage_core_pop_result(pipe_one.cores[0], &result), 1);
    assert_int_equal(result.nonce, 0); /* ... and the loss, named */
    assert_int_equal(result.status, STRATA_ENOMEM);
    if (!strstr(result.message, "1 frame(s) or result(s) could not be queued") ||
        !strstr(result.message, "an Error frame for request 5"))
        fail_msg("loss record says: %s", result.message);
    stage_result_free(&result);
    assert_int_equal(stage_core_pop_result(pipe_one.cores[0], &result), 0);
    stage_core_get_stats(pipe_one.cores[0], &stats);
    assert_int_equal(stats.lost, 1);
    /* With memory back, the next refusal's Error frame goes out as usual. */
    tp_request(&req, 6, golden.prompt, 40, 4);
    assert_int_equal(tp_submit(&pipe_one, 1, &req), 0);
    assert_int_equal(stage_core_pop_frame(pipe_one.cores[0], &frame), 1);
    assert_int_equal(frame.link, STAGE_LINK_CLIENT);
    tp_pipeline_free(&pipe_one);
    tp_golden_free(&golden);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_error_frame_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
