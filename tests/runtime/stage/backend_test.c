/* The backend seam (runtime/stage/backend.h): device selection and refusals, role-checked
 * calls, and the core reading its range from the backend: a core cannot be built on a
 * backend whose range or roles contradict its place in the ring, and what it reports is
 * exactly what the backend computes. Golden model: qwen3_gqa_tied (4 layers). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"
#include "tests/runtime/stage/stage_test_pipeline.h"

static struct tp_golden golden;

static int setup(void **state) {
    (void)state;
    return tp_golden_load(&golden, "qwen3_gqa_tied");
}

static int teardown(void **state) {
    (void)state;
    tp_golden_free(&golden);
    return 0;
}

static int open_backend(struct stage_backend **be, const char *device, int start, int end,
                        int embed, int head) {
    struct stage_backend_options o = {
        .cfg = &golden.cfg,
        .weights = golden.st,
        .role = {.layer_start = start, .layer_end = end, .with_embed = embed, .with_head = head},
        .device = device,
        .num_threads = 1,
        .max_seq = 32,
        .num_slots = 2};
    return stage_backend_open(be, &o);
}

static void expect_error(int rc, int code, const char *text) {
    assert_int_equal(rc, code);
    if (!strstr(strata_last_error(), text))
        fail_msg("error '%s' does not contain '%s'", strata_last_error(), text);
}

static void test_devices(void **state) {
    struct stage_backend *be = NULL;
    (void)state;
    assert_int_equal(open_backend(&be, NULL, 0, 4, 1, 1), 0);
    assert_string_equal(be->device_kind, "cpu");
    stage_backend_free(be);
    assert_int_equal(open_backend(&be, "cpu", 0, 4, 1, 1), 0);
    stage_backend_free(be);
    /* cuda opens where a device exists; elsewhere (no device, or a build with
     * --define=strata_cuda=0) it is refused with the reason, never run on the CPU. */
    for (int i = 0; i < 2; ++i) {
        const char *dev = i ? "cuda" : "cuda:0";
        int rc = open_backend(&be, dev, 0, 4, 1, 1);
        if (rc == 0) {
            assert_string_equal(be->device_kind, "cuda");
            stage_backend_free(be);
            be = NULL;
            continue;
        }
        expect_error(rc, STRATA_EDEVICE, "not available: ");
        if (!strstr(strata_last_error(), "CUDA"))
            fail_msg("error '%s' does not say why CUDA is unavailable", strata_last_error());
        assert_null(be);
    }
    expect_error(open_backend(&be, "cuda:99", 0, 4, 1, 1), STRATA_EDEVICE, "not available");
    expect_error(open_backend(&be, "tpu", 0, 4, 1, 1), STRATA_EINVAL, "unknown device 'tpu'");
    expect_error(open_backend(&be, "cuda:x", 0, 4, 1, 1), STRATA_EINVAL, "unknown device");
    expect_error(open_backend(&be, "cpu", 2, 9, 0, 1), STRATA_ERANGE, "[2, 9)");
    expect_error(open_backend(&be, "cpu", 2, 2, 0, 0), STRATA_ERANGE, "empty");
    assert_null(be);
}

/* A middle backend holds neither embedding nor head: the calls refuse instead of reading
 * weights it never loaded. */
static void test_calls_are_checked_against_the_role(void **state) {
    struct stage_backend *be = NULL;
    float hidden[64], logits[512];
    int32_t token = 1;
    int slot;
    (void)state;
    assert_int_equal(open_backend(&be, "cpu", 1, 3, 0, 0), 0);
    expect_error(stage_backend_embed(be, hidden, &token, 1), STRATA_EINVAL, "embedding");
    expect_error(stage_backend_logits(be, logits, hidden, 1), STRATA_EINVAL, "lm_head");
    assert_int_equal(stage_backend_kv_acquire(be, &slot), 0);
    assert_int_equal(stage_backend_kv_acquire(be, &slot), 0);
    assert_int_equal(stage_backend_kv_acquire(be, &slot), STRATA_EBUSY);
    /* 2 layers x 2 kv heads x 32 head_dim x 32 positions x 2 slots x (k + v) x 4 bytes */
    assert_int_equal(stage_backend_kv_bytes(be), (size_t)2 * 2 * 32 * 32 * 2 * 2 * 4);
    stage_backend_free(be);
}

static int core_on(struct stage_core **core, struct stage_backend *be, int r, int S) {
    struct stage_core_options o = {.backend = be, .stage_index = r, .num_stages = S};
    return stage_core_init(core, &o);
}

/* The core's range and roles are the backend's; one that contradicts the stage's place in
 * the ring is refused with both sides named. */
static void test_core_takes_its_range_from_the_backend(void **state) {
    struct stage_backend *be = NULL;
    struct stage_core *core = NULL;
    struct stage_core_info info;
    (void)state;
    assert_int_equal(open_backend(&be, "cpu", 1, 4, 0, 1), 0);
    assert_int_equal(core_on(&core, be, 1, 2), 0);
    stage_core_get_info(core, &info);
    assert_int_equal(info.role.layer_start, 1);
    assert_int_equal(info.role.layer_end, 4);
    assert_int_equal(info.role.with_embed, 0);
    assert_int_equal(info.role.with_head, 1);
    assert_int_equal(info.stage_index, 1);
    assert_int_equal(info.num_stages, 2);
    assert_int_equal(info.num_layers, 4);
    assert_int_equal(info.max_seq, 32);
    assert_int_equal(info.max_batch, 2);
    assert_int_equal(stage_core_kv_bytes(core), stage_backend_kv_bytes(be));
    stage_core_free(core);
    /* Layers [1, 4) cannot be stage 0 (which starts at 0) ... */
    expect_error(core_on(&core, be, 0, 2), STRATA_ERANGE, "stage 0 must start at 0");
    /* ... nor stage 1 of 3, a middle stage, which must not hold the head. */
    expect_error(core_on(&core, be, 1, 3), STRATA_EINVAL,
                 "without the head, but it has no "
                 "embedding and the head");
    expect_error(core_on(&core, be, 2, 2), STRATA_ERANGE, "outside [0, 2)");
    assert_null(core);
    stage_backend_free(be);
    /* The right range with the wrong roles: a full-range backend without the embedding. */
    assert_int_equal(open_backend(&be, "cpu", 0, 4, 0, 1), 0);
    expect_error(core_on(&core, be, 0, 1), STRATA_EINVAL, "with the embedding");
    stage_backend_free(be);
}

/* stage_open resolves the even split and fails on a shard with a gap. */
static void test_stage_open_resolves_the_role(void **state) {
    struct stage stage;
    struct stage_core_info info;
    struct stage_open_options o = {.cfg = &golden.cfg,
                                   .weights = golden.st,
                                   .stage_index = 1,
                                   .num_stages = 3,
                                   .layer_start = -1,
                                   .layer_end = -1,
                                   .num_threads = 1,
                                   .max_seq = 16,
                                   .max_batch = 1};
    (void)state;
    assert_int_equal(stage_open(&stage, &o, NULL), 0);
    stage_core_get_info(stage.core, &info);
    assert_int_equal(info.role.layer_start, 2); /* even split of 4 over 3: [0,2) [2,3) [3,4) */
    assert_int_equal(info.role.layer_end, 3);
    assert_int_equal(stage.backend->role.layer_start, info.role.layer_start);
    stage_close(&stage);
    o.stage_index = 2;
    o.layer_start = 2;
    o.layer_end = 3;
    expect_error(stage_open(&stage, &o, NULL), STRATA_ERANGE, "the last must end at 4");
    assert_null(stage.core);
    o.device = "cuda:99"; /* no machine has it: refused whether or not CUDA is built in */
    o.layer_end = 4;
    expect_error(stage_open(&stage, &o, NULL), STRATA_EDEVICE, "not available");
}

/* --weights-dtype through stage_open: q8 loads on the cpu and says so in its summary; an
 * unknown dtype and q8 on another device are refused by name. */
static void test_weights_dtype(void **state) {
    struct stage stage;
    char desc[512];
    struct stage_open_options o = {.cfg = &golden.cfg,
                                   .weights = golden.st,
                                   .stage_index = 0,
                                   .num_stages = 1,
                                   .layer_start = -1,
                                   .layer_end = -1,
                                   .num_threads = 1,
                                   .weights_dtype = "q8",
                                   .max_seq = 16,
                                   .max_batch = 1};
    (void)state;
    assert_int_equal(stage_open(&stage, &o, NULL), 0);
    stage_backend_describe(stage.backend, desc, sizeof desc);
    assert_non_null(strstr(desc, "q8: "));
    stage_close(&stage);
    o.weights_dtype = "bf16";
    assert_int_equal(stage_open(&stage, &o, NULL), 0);
    stage_backend_describe(stage.backend, desc, sizeof desc);
    assert_null(strstr(desc, "q8"));
    /* The summary names the kernels cpuid picked. */
    char kernels[64];
    snprintf(kernels, sizeof kernels, "\nkernels: %s ", ops_path_name(ops_matmul_path()));
    assert_non_null(strstr(desc, kernels));
    stage_close(&stage);
    o.weights_dtype = "q4";
    expect_error(stage_open(&stage, &o, NULL), STRATA_EINVAL, "bf16 or q8");
    o.weights_dtype = "q8";
    o.device = "cuda:0";
    expect_error(stage_open(&stage, &o, NULL), STRATA_EINVAL, "cpu device only");
}

struct progress_seen {
    int calls, backwards, phases_copy;
    uint64_t total, last;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total, const char *phase) {
    struct progress_seen *s = ctx;
    assert_true(s->calls == 0 || total == s->total);
    assert_true(done <= total);
    if (s->calls > 0 && done < s->last) s->backwards++;
    if (strcmp(phase, "copying to huge pages") == 0) s->phases_copy++;
    s->total = total;
    s->last = done;
    s->calls++;
}

/* stage_open hands its progress callback to the CPU backend's loader: every stage of a
 * three-stage ring reports done bytes that never go back and end at its total, the bytes of
 * its own tensors (stage 0's embedding is not stage 2's head: the totals differ), the views
 * read while they are copied to huge pages. */
static void test_stage_open_reports_progress(void **state) {
    struct stage stage;
    uint64_t totals[3] = {0};
    (void)state;
    for (int r = 0; r < 3; ++r) {
        struct progress_seen seen = {0};
        struct stage_open_options o = {.cfg = &golden.cfg,
                                       .weights = golden.st,
                                       .stage_index = r,
                                       .num_stages = 3,
                                       .layer_start = -1,
                                       .layer_end = -1,
                                       .num_threads = 1,
                                       .max_seq = 16,
                                       .max_batch = 1,
                                       .progress = {on_progress, &seen}};
        assert_int_equal(stage_open(&stage, &o, NULL), 0);
        assert_true(seen.calls >= 2);
        assert_int_equal(seen.backwards, 0);
        assert_true(seen.total > 0);
        assert_int_equal(seen.last, seen.total);
        assert_true(seen.phases_copy > 0);
        totals[r] = seen.total;
        stage_close(&stage);
    }
    assert_true(totals[0] != totals[1] && totals[1] != totals[2]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_calls_are_checked_against_the_role),
        cmocka_unit_test(test_core_takes_its_range_from_the_backend),
        cmocka_unit_test(test_stage_open_resolves_the_role),
        cmocka_unit_test(test_weights_dtype),
        cmocka_unit_test(test_stage_open_reports_progress),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
