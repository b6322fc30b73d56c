/* Bad inputs to the reference decoder get clear errors, never a crash: token ids outside the
 * vocabulary, empty requests, sequences beyond the KV capacity, broken position continuity,
 * unacquired slots, bad layer ranges, and checkpoints with missing or mis-shaped tensors
 * (all listed in one message). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

struct fixture {
    struct golden_case gc;
    struct reference_model *m;
    struct kv_cache kv;
    int slot;
    float *hidden;
};

static int setup(void **state) {
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || golden_case_open(&f->gc, "qwen3_gqa_tied")) return -1;
    const struct model_config *c = &f->gc.cfg;
    if (golden_model(&f->m, &f->gc, 0, c->num_layers, 1, 1, 2)) return -1;
    if (kv_cache_init(&f->kv, 0, c->num_layers, c->num_kv_heads, c->head_dim, 4, 2, 0, OPS_F32))
        return -1;
    if (kv_cache_acquire(&f->kv, &f->slot)) return -1;
    f->hidden = calloc(8 * (size_t)c->hidden_size, sizeof(float));
    *state = f;
    return f->hidden ? 0 : -1;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    free(f->hidden);
    kv_cache_free(&f->kv);
    reference_model_free(f->m);
    golden_case_close(&f->gc);
    free(f);
    return 0;
}

static void expect_error(int rc, int code, const char *needle) {
    assert_int_equal(rc, code);
    printf("  error as expected: %s\n", strata_last_error());
    if (!strstr(strata_last_error(), needle))
        fail_msg("message lacks \"%s\": %s", needle, strata_last_error());
}

static void test_token_out_of_vocab(void **state) {
    struct fixture *f = *state;
    int32_t too_big[2] = {3, f->gc.cfg.vocab_size}, negative[1] = {-1};
    expect_error(reference_embed(f->m, f->hidden, too_big, 2), STRATA_ERANGE, "outside [0, 512)");
    expect_error(reference_embed(f->m, f->hidden, negative, 1), STRATA_ERANGE, "token id -1");
}

static void test_empty_request(void **state) {
    struct fixture *f = *state;
    struct forward_item item = {.slot = f->slot, .pos = 0, .n_tokens = 0};
    expect_error(reference_forward(f->m, &f->kv, f->hidden, &item, 1), STRATA_EINVAL, "0 tokens");
}

static void test_beyond_kv_capacity(void **state) {
    struct fixture *f = *state;
    int32_t tokens[5] = {1, 2, 3, 4, 5};
    struct forward_item item = {.slot = f->slot, .pos = 0, .n_tokens = 5};
    assert_int_equal(reference_embed(f->m, f->hidden, tokens, 5), 0);
    expect_error(reference_forward(f->m, &f->kv, f->hidden, &item, 1), STRATA_ERANGE,
                 "KV capacity of 4");
    assert_int_equal(f->kv.blocks.len[f->slot], 0); /* a refused call changes nothing */
    item.n_tokens = 3;
    assert_int_equal(reference_forward(f->m, &f->kv, f->hidden, &item, 1), 0);
    item = (struct forward_item){.slot = f->slot, .pos = 3, .n_tokens = 2};
    expect_error(reference_forward(f->m, &f->kv, f->hidden, &item, 1), STRATA_ERANGE,
                 "KV capacity");
    item.n_tokens = 1;
    assert_int_equal(reference_forward(f->m, &f->kv, f->hidden, &item, 1), 0);
    assert_int_equal(f->kv.blocks.len[f->slot], 4);
}

static void test_bad_positions_and_slots(void **state) {
    struct fixture *f = *state;
    struct forward_item gap = {.slot = f->slot, .pos = 2, .n_tokens = 1};
    expect_error(reference_forward(f->m, &f->kv, f->hidden, &gap, 1), STRATA_ERANGE,
                 "holds 0 positions");
    struct forward_item free_slot = {.slot = 1 - f->slot, .pos = 0, .n_tokens = 1};
    expect_error(reference_forward(f->m, &f->kv, f->hidden, &free_slot, 1), STRATA_EINVAL,
                 "not an acquired");
    struct forward_item twice[2] = {{.slot = f->slot, .n_tokens = 1},
                                    {.slot = f->slot, .n_tokens = 1}};
    expect_error(reference_forward(f->m, &f->kv, f->hidden, twice, 2), STRATA_EINVAL,
                 "share KV slot");
    struct kv_cache narrow;
    assert_int_equal(
        kv_cache_init(&narrow, 1, 2, f->gc.cfg.num_kv_heads, f->gc.cfg.head_dim, 4, 1, 0, OPS_F32),
        0);
    expect_error(reference_forward(f->m, &narrow, f->hidden, &gap, 1), STRATA_EINVAL,
                 "does not fit");
    kv_cache_free(&narrow);
}

static void test_wrong_parts(void **state) {
    struct fixture *f = *state;
    struct reference_model *mid = NULL;
    int32_t tok = 1;
    assert_int_equal(golden_model(&mid, &f->gc, 1, 3, 0, 0, 1), 0);
    expect_error(reference_embed(mid, f->hidden, &tok, 1), STRATA_EINVAL, "embed_tokens");
    expect_error(reference_logits(mid, f->hidden, f->hidden, 1), STRATA_EINVAL, "head");
    reference_model_free(mid);
    expect_error(golden_model(&mid, &f->gc, 2, 9, 0, 0, 1), STRATA_ERANGE, "[2,9)");
    assert_null(mid);
    expect_error(golden_model(&mid, &f->gc, 0, 1, 0, 0, 0), STRATA_EINVAL, "num_threads");
}

static void test_bad_checkpoints_list_every_tensor(void **state) {
    struct fixture *f = *state;
    struct reference_load_options opt = {
        .layer_start = 0, .layer_end = 2, .with_embed = 1, .with_head = 1, .num_threads = 1};
    struct model_config cfg = f->gc.cfg;
    struct reference_model *m = NULL;
    cfg.intermediate_size += 1; /* every MLP matrix is now mis-shaped */
    expect_error(reference_model_load(&m, &cfg, f->gc.st, &opt), STRATA_EFORMAT,
                 "6 tensor(s) with the wrong shape");
    assert_non_null(strstr(strata_last_error(),
                           "model.layers.0.mlp.gate_proj.weight is [128,64], expected [129,64]"));
    assert_non_null(strstr(strata_last_error(), "model.layers.1.mlp.down_proj.weight"));
    assert_null(m);
    cfg = f->gc.cfg;
    snprintf(cfg.tensor_prefix, sizeof cfg.tensor_prefix, "model.language_model.");
    expect_error(reference_model_load(&m, &cfg, f->gc.st, &opt), STRATA_ENOTFOUND,
                 "missing: model.language_model.embed_tokens.weight");
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_out_of_vocab, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_beyond_kv_capacity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_positions_and_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_parts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_checkpoints_list_every_tensor, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
