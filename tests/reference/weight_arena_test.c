/* reference/weight_arena.c and reference/model_memory.c: the arena's alignment and bounds,
 * and that moving the streamed matrices out of the checkpoint's mapping changes no bit of
 * the logits (every golden, whole model, prefill of prompt + generated ids), copies exactly
 * the bf16 / f32 views, and is skipped with weights_in_file and with q8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/weight_arena.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

static void test_arena_bounds_and_alignment(void **state) {
    (void)state;
    struct weight_arena a;
    assert_int_equal(weight_arena_init(&a, 0), STRATA_OK);
    assert_null(weight_arena_alloc(&a, 1)); /* an empty arena hands out nothing */
    weight_arena_free(&a);
    const size_t want = weight_arena_round(100) + weight_arena_round(3 << 20);
    assert_int_equal(weight_arena_round(100), 128);
    assert_int_equal(weight_arena_init(&a, want), STRATA_OK);
    assert_int_equal((uintptr_t)a.base % ((uintptr_t)2 << 20), 0);
    char *p = weight_arena_alloc(&a, 100), *q = weight_arena_alloc(&a, 3 << 20);
    assert_non_null(p);
    assert_non_null(q);
    assert_ptr_equal(q, p + 128);
    memset(q, 0x5a, 3 << 20); /* writable to its end */
    /* The size is rounded up to whole 2 MiB pages: what is left is usable, no more. */
    size_t left = a.size - a.used;
    assert_non_null(weight_arena_alloc(&a, left));
    assert_null(weight_arena_alloc(&a, 1));
    weight_arena_free(&a);
    assert_null(a.map);
}

/* Logits of the whole model over prompt + generated ids in one prefill. */
static float *prefill_logits(const struct golden_case *gc, int in_file,
                             enum reference_weights_dtype dtype, size_t *copied) {
    const int n = gc->n_prompt + gc->n_steps, L = gc->cfg.num_layers;
    const size_t H = (size_t)gc->cfg.hidden_size, V = (size_t)gc->cfg.vocab_size;
    struct reference_load_options opt = {.layer_start = 0,
                                         .layer_end = L,
                                         .with_embed = 1,
                                         .with_head = 1,
                                         .num_threads = 2,
                                         .weights_dtype = dtype,
                                         .weights_in_file = in_file};
    struct reference_model *m = NULL;
    struct kv_cache kv = {0};
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *hidden = malloc((size_t)n * H * sizeof(float));
    float *logits = malloc((size_t)n * V * sizeof(float));
    assert_non_null(ids);
    assert_non_null(hidden);
    assert_non_null(logits);
    int slot = -1;
    if (reference_model_load(&m, &gc->cfg, gc->st, &opt) ||
        kv_cache_init(&kv, 0, L, reference_model_kv_heads(m), gc->cfg.head_dim, n, 1, 0, OPS_F32) ||
        kv_cache_acquire(&kv, &slot) || golden_sequence(gc, ids, n) ||
        reference_embed(m, hidden, ids, n))
        fail_msg("%s: %s", gc->name, strata_last_error());
    struct forward_item item = {.slot = slot, .pos = 0, .n_tokens = n};
    if (reference_forward(m, &kv, hidden, &item, 1) || reference_logits(m, logits, hidden, n))
        fail_msg("%s: %s", gc->name, strata_last_error());
    size_t huge = 0;
    *copied = reference_model_copied_bytes(m, &huge);
    assert_true(huge <= reference_model_weight_bytes(m) + ((size_t)4 << 20));
    kv_cache_free(&kv);
    reference_model_free(m);
    free(ids);
    free(hidden);
    return logits;
}

static void test_copied_weights_change_no_bit(void **state) {
    (void)state;
    for (int ci = 0; golden_case_names[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, golden_case_names[ci])) fail_msg("%s", strata_last_error());
        const size_t bytes =
            (size_t)(gc.n_prompt + gc.n_steps) * (size_t)gc.cfg.vocab_size * sizeof(float);
        size_t copied_file, copied, copied_q8;
        float *in_file = prefill_logits(&gc, 1, REFERENCE_WEIGHTS_STORED, &copied_file);
        float *moved = prefill_logits(&gc, 0, REFERENCE_WEIGHTS_STORED, &copied);
        float *q8 = prefill_logits(&gc, 0, REFERENCE_WEIGHTS_Q8, &copied_q8);
        if (memcmp(in_file, moved, bytes))
            fail_msg("%s: logits differ after copying the weights", gc.name);
        assert_int_equal(copied_file, 0);
        assert_int_equal(copied_q8, 0); /* q8 copies replace the stored matrices instead */
        assert_true(copied > 0);
        printf("%-18s %zu bytes of matrices copied out of the mapping: logits bit-identical\n",
               gc.name, copied);
        free(in_file);
        free(moved);
        free(q8);
        golden_case_close(&gc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_bounds_and_alignment),
        cmocka_unit_test(test_copied_weights_change_no_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
