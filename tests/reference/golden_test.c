/* The reference decoder against Hugging Face transformers (tests/golden): for every case,
 * prefill the prompt, decode greedily with the KV cache, and require the same generated ids
 * and max |Δlogit| <= 1e-3 over all steps (the value is printed per case). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/sampler.h"
#include "runtime/status.h"
#include "tests/reference/golden_case.h"

#define LOGIT_TOLERANCE 1e-3

static void check_case(const char *name, int threads) {
    struct golden_case gc;
    int rc = golden_case_open(&gc, name);
    if (rc) fail_msg("%s: %s", name, strata_last_error());
    const struct model_config *c = &gc.cfg;
    int V = c->vocab_size, H = c->hidden_size, L = c->num_layers;
    struct reference_model *m = NULL;
    if (golden_model(&m, &gc, 0, L, 1, 1, threads)) fail_msg("%s: %s", name, strata_last_error());
    struct kv_cache kv;
    assert_int_equal(
        kv_cache_init(&kv, 0, L, c->num_kv_heads, c->head_dim, gc.n_prompt + gc.n_steps, 1), 0);
    int slot;
    assert_int_equal(kv_cache_acquire(&kv, &slot), 0);
    float *hidden = calloc((size_t)gc.n_prompt * (size_t)H, sizeof(float));
    float *logits = calloc((size_t)gc.n_prompt * (size_t)V, sizeof(float));
    assert_non_null(hidden);
    assert_non_null(logits);

    double max_delta = 0.0;
    int mismatches = 0;
    int pos = 0, n = gc.n_prompt;
    int32_t token_buf[1];
    const int32_t *tokens = gc.prompt;
    for (int step = 0; step < gc.n_steps; ++step) {
        struct forward_item item = {.slot = slot, .pos = pos, .n_tokens = n};
        if (reference_embed(m, hidden, tokens, n) || reference_forward(m, &kv, hidden, &item, 1) ||
            reference_logits(m, logits, hidden + (size_t)(n - 1) * (size_t)H, 1))
            fail_msg("%s step %d: %s", name, step, strata_last_error());
        const float *want = gc.logits + (size_t)step * (size_t)V;
        for (int v = 0; v < V; ++v) {
            double d = fabs((double)logits[v] - (double)want[v]);
            if (d > max_delta) max_delta = d;
        }
        int got = argmax(logits, V);
        if (got != gc.generated[step]) {
            if (mismatches++ < 3)
                printf("  %s step %d: generated %d, transformers %d\n", name, step, got,
                       gc.generated[step]);
        }
        pos += n;
        n = 1;
        token_buf[0] = gc.generated[step];
        tokens = token_buf;
    }
    printf("%-18s threads %d: %d prompt + %d steps, max |dlogit| = %.3g, ids %s\n", name, threads,
           gc.n_prompt, gc.n_steps, max_delta, mismatches ? "DIFFER" : "identical");
    free(hidden);
    free(logits);
    kv_cache_free(&kv);
    reference_model_free(m);
    golden_case_close(&gc);
    assert_int_equal(mismatches, 0);
    assert_true(max_delta <= LOGIT_TOLERANCE);
}

static void test_all_cases(void **state) {
    (void)state;
    for (int i = 0; golden_case_names[i]; ++i)
        check_case(golden_case_names[i], 2);
}

static void test_one_thread(void **state) {
    (void)state;
    check_case("qwen3_moe", 1);
    check_case("qwen3_gqa_tied", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_cases),
        cmocka_unit_test(test_one_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
