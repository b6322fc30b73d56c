/* The reference decoder against Hugging Face transformers (tests/golden): for every case,
 * prefill the prompt, decode greedily with the KV cache, and require the same generated ids
 * and max |Δlogit| <= 1e-3 over all steps (the value is printed per case).
 *
 * The run itself (teacher-forced, and how Qwen3-VL cases replay HF's vision inputs) is
 * golden_run.h, shared with q8_golden_test. Qwen3-VL cases also check split and
 * thread-count bit-identity, because M-RoPE and DeepStack travel with the forward items
 * across stages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/model.h"
#include "reference/ops.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"
#include "tests/reference/golden_run.h"

#define LOGIT_TOLERANCE 1e-3

static void check_case(const char *name, int threads) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
    int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, whole[2] = {0, L};
    float *logits = golden_run(&gc, whole, 1, threads, REFERENCE_WEIGHTS_STORED);
    double max_delta = 0.0;
    int mismatches = 0;
    for (int step = 0; step < gc.n_steps; ++step) {
        const float *got = logits + (size_t)step * V, *want = gc.logits + (size_t)step * V;
        for (int v = 0; v < V; ++v) {
            double d = fabs((double)got[v] - (double)want[v]);
            if (d > max_delta) max_delta = d;
        }
        if (argmax(got, V) != gc.generated[step] && mismatches++ < 3)
            printf("  %s step %d: generated %d, transformers %d\n", name, step, argmax(got, V),
                   gc.generated[step]);
    }
    printf("%-18s threads %d: %d prompt + %d steps, max |dlogit| = %.3g, ids %s\n", name, threads,
           gc.n_prompt, gc.n_steps, max_delta, mismatches ? "DIFFER" : "identical");
    if (gc.has_vision) {
        size_t bytes = (size_t)gc.n_steps * (size_t)V * sizeof(float);
        for (int k = 1; k < L; ++k) {
            int split[3] = {0, k, L};
            float *parts = golden_run(&gc, split, 2, threads, REFERENCE_WEIGHTS_STORED);
            if (memcmp(parts, logits, bytes)) fail_msg("%s: split at %d differs", name, k);
            free(parts);
        }
        float *other = golden_run(&gc, whole, 1, threads == 1 ? 3 : 1, REFERENCE_WEIGHTS_STORED);
        if (memcmp(other, logits, bytes)) fail_msg("%s: thread counts differ", name);
        free(other);
        printf("%-18s M-RoPE + DeepStack: splits k=1..%d and thread counts bit-identical\n", name,
               L - 1);
    }
    free(logits);
    golden_case_close(&gc);
    assert_int_equal(mismatches, 0);
    assert_true(max_delta <= LOGIT_TOLERANCE);
}

static void test_all_cases(void **state) {
    (void)state;
    for (int i = 0; golden_case_names[i]; ++i)
        check_case(golden_case_names[i], 2);
}

/* Whole golden runs on every matmul path this CPU has give the bits of the default (fastest)
 * path, which test_all_cases checked against transformers. */
static void test_every_matmul_path(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_PORTABLE, OPS_PATH_AVX2, OPS_PATH_AVX512};
    printf("default matmul path: %s\n", ops_path_name(ops_matmul_path()));
    for (int i = 0; golden_case_names[i]; ++i) {
        struct golden_case gc;
        const char *name = golden_case_names[i];
        if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
        int whole[2] = {0, gc.cfg.num_layers};
        size_t bytes = (size_t)gc.n_steps * (size_t)gc.cfg.vocab_size * sizeof(float);
        float *want = golden_run(&gc, whole, 1, 2, REFERENCE_WEIGHTS_STORED);
        for (int p = 0; p < 3; ++p) {
            if (!ops_force_path(paths[p])) {
                if (i == 0)
                    printf("this CPU has no %s path; not compared\n", ops_path_name(paths[p]));
                continue;
            }
            float *got = golden_run(&gc, whole, 1, 2, REFERENCE_WEIGHTS_STORED);
            ops_force_path(OPS_PATH_AUTO);
            if (memcmp(got, want, bytes))
                fail_msg("%s: %s path differs", name, ops_path_name(paths[p]));
            free(got);
            if (i == 0)
                printf("%s path: golden logits bit-identical to the default\n",
                       ops_path_name(paths[p]));
        }
        free(want);
        golden_case_close(&gc);
    }
}

static void test_one_thread(void **state) {
    (void)state;
    check_case("qwen3_moe", 1);
    check_case("qwen3_gqa_tied", 1);
    check_case("qwen3_vl_moe", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_cases),
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_every_matmul_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
