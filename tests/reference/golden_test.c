/* The reference decoder against Hugging Face transformers (tests/golden): for every case,
 * prefill the prompt, decode greedily with the KV cache, and require the same generated ids
 * and max |Δlogit| <= 1e-3 over all steps (the value is printed per case).
 *
 * Qwen3-VL cases replay HF's prefill without a vision tower: the image pad embeddings are
 * replaced by the recorded merger outputs, the prompt uses HF's M-RoPE position ids, and
 * the recorded DeepStack features are added after the first layers; decode positions are
 * cache index + rope_delta. Those cases also check split and thread-count bit-identity,
 * because M-RoPE and DeepStack travel with the forward items across stages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/ops.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

#define LOGIT_TOLERANCE 1e-3
#define MAX_STAGES 8

/* Runs the golden token stream through stages [bounds[i], bounds[i+1]) (embed on the first,
 * head on the last) and returns logits [n_steps, V]; ids are teacher-forced from the golden. */
static float *run_golden(const struct golden_case *gc, const int *bounds, int n_stages,
                         int threads) {
    const struct model_config *c = &gc->cfg;
    int V = c->vocab_size, H = c->hidden_size, S = gc->n_prompt;
    struct reference_model *stage[MAX_STAGES] = {0};
    struct kv_cache kv[MAX_STAGES];
    memset(kv, 0, sizeof kv);
    for (int s = 0; s < n_stages; ++s) {
        if (golden_model(&stage[s], gc, bounds[s], bounds[s + 1], s == 0, s == n_stages - 1,
                         threads))
            fail_msg("%s [%d,%d): %s", gc->name, bounds[s], bounds[s + 1], strata_last_error());
        assert_int_equal(kv_cache_init(&kv[s], bounds[s], bounds[s + 1], c->num_kv_heads,
                                       c->head_dim, S + gc->n_steps, 1),
                         0);
        int slot;
        assert_int_equal(kv_cache_acquire(&kv[s], &slot), 0);
    }
    float *hidden = calloc((size_t)S * (size_t)H, sizeof(float));
    float *logits = calloc((size_t)gc->n_steps * (size_t)V, sizeof(float));
    float *deepstack = NULL;
    uint8_t *visual = NULL;
    assert_non_null(hidden);
    assert_non_null(logits);
    if (reference_embed(stage[0], hidden, gc->prompt, S)) fail_msg("%s", strata_last_error());
    struct forward_item item = {.slot = 0, .pos = 0, .n_tokens = S};
    if (gc->has_vision) {
        /* Merge: pad rows take the merger outputs in order; DeepStack rows are expanded to
         * [K][S][H] with zeros on text rows. */
        deepstack = calloc((size_t)gc->num_deepstack * (size_t)S * (size_t)H, sizeof(float));
        visual = calloc((size_t)S, 1);
        assert_non_null(deepstack);
        assert_non_null(visual);
        for (int i = 0, v = 0; i < S; ++i) {
            if (gc->prompt[i] != gc->image_token_id) continue;
            visual[i] = 1;
            memcpy(hidden + (size_t)i * H, gc->vision_embeds + (size_t)v * H,
                   (size_t)H * sizeof(float));
            for (int k = 0; k < gc->num_deepstack; ++k)
                memcpy(deepstack + ((size_t)k * S + i) * H,
                       gc->deepstack + ((size_t)k * gc->n_visual + v) * H,
                       (size_t)H * sizeof(float));
            v++;
        }
        item.mrope_positions = gc->position_ids;
        item.deepstack = deepstack;
        item.visual_mask = visual;
        item.num_deepstack = gc->num_deepstack;
    }
    int32_t mrope[3];
    for (int step = 0; step < gc->n_steps; ++step) {
        if (step) {
            int32_t token = gc->generated[step - 1];
            if (reference_embed(stage[0], hidden, &token, 1)) fail_msg("%s", strata_last_error());
            item = (struct forward_item){.slot = 0, .pos = S + step - 1, .n_tokens = 1};
            if (gc->has_vision) {
                mrope[0] = mrope[1] = mrope[2] = item.pos + gc->rope_delta;
                item.mrope_positions = mrope;
            }
        }
        for (int s = 0; s < n_stages; ++s)
            if (reference_forward(stage[s], &kv[s], hidden, &item, 1))
                fail_msg("%s step %d: %s", gc->name, step, strata_last_error());
        if (reference_logits(stage[n_stages - 1], logits + (size_t)step * V,
                             hidden + (size_t)(item.n_tokens - 1) * H, 1))
            fail_msg("%s", strata_last_error());
    }
    for (int s = 0; s < n_stages; ++s) {
        reference_model_free(stage[s]);
        kv_cache_free(&kv[s]);
    }
    free(hidden);
    free(deepstack);
    free(visual);
    return logits;
}

static void check_case(const char *name, int threads) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
    int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, whole[2] = {0, L};
    float *logits = run_golden(&gc, whole, 1, threads);
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
            float *parts = run_golden(&gc, split, 2, threads);
            if (memcmp(parts, logits, bytes)) fail_msg("%s: split at %d differs", name, k);
            free(parts);
        }
        float *other = run_golden(&gc, whole, 1, threads == 1 ? 3 : 1);
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
        float *want = run_golden(&gc, whole, 1, 2);
        for (int p = 0; p < 3; ++p) {
            if (!ops_force_path(paths[p])) {
                if (i == 0)
                    printf("this CPU has no %s path; not compared\n", ops_path_name(paths[p]));
                continue;
            }
            float *got = run_golden(&gc, whole, 1, 2);
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
