/* The measured error of `--weights-dtype q8` (reference/ops_q8.h) on every golden case
 * (tests/golden): the golden token stream is teacher-forced (prompt, then each recorded id),
 * so one early divergence does not cascade, and per case the test prints the max |Δlogit|
 * against transformers' logits and how many greedy ids (argmax per step) agree.
 *
 * q8 rounds weights and activations to 8 bits, so ids may differ from transformers; the
 * bounds below are loose (2x the worst max |Δlogit| measured when this test was written)
 * and exist to catch a broken kernel, scale or layout, which gives logits off by O(10) and
 * near-random ids (the kernel's exact arithmetic is ops_q8_test's job). q8 keeps the determinism
 * contract: 1 thread equals 2, and a two-stage split equals the whole model, bit for bit. */
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
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

/* Measured on the eight cases when written (2 threads, AVX2 = portable bits): max |Δlogit|
 * 0.51 .. 1.01 (logits up to |22|), mean |Δlogit| 0.076 .. 0.146, greedy agreement 88% .. 100%.
 * Weight rounding alone (q8 weights dequantised to f32, f32 activations) measured max
 * 0.40 .. 0.94 and 92% .. 100%: most of the error is the 8-bit weights of these small random
 * models, not the activations. The MoE cases are chaotic: quantising with x * (1 / d) instead
 * of x / d (one f32 rounding apart) took qwen3_vl_moe from 100% to 71% agreement and max
 * |Δlogit| 0.87 -> 4.4, since a router near a tie flips an expert. Hence loose bounds on the
 * max and on MoE agreement, and a tighter one on the mean, which one flipped step barely
 * moves. A broken kernel, scale or layout gives near-random ids and O(10) deltas. */
#define Q8_MAX_DLOGIT 6.0
#define Q8_MAX_MEAN_DLOGIT 0.5
#define Q8_MIN_AGREEMENT 0.80     /* dense cases */
#define Q8_MIN_AGREEMENT_MOE 0.60 /* MoE cases */
#define MAX_STAGES 2

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Teacher-forced logits [n_steps, V] of the golden stream through stages [bounds[i],
 * bounds[i+1]) with q8 weights (the same replay of HF's vision inputs as golden_test). */
static float *run_q8(const struct golden_case *gc, const int *bounds, int n_stages, int threads) {
    const struct model_config *c = &gc->cfg;
    int V = c->vocab_size, H = c->hidden_size, S = gc->n_prompt;
    struct reference_model *stage[MAX_STAGES] = {0};
    struct kv_cache kv[MAX_STAGES];
    memset(kv, 0, sizeof kv);
    for (int s = 0; s < n_stages; ++s) {
        int slot;
        if (golden_model_dtype(&stage[s], gc, bounds[s], bounds[s + 1], s == 0, s == n_stages - 1,
                               threads, REFERENCE_WEIGHTS_Q8))
            fail_msg("%s: %s", gc->name, strata_last_error());
        assert_int_equal(kv_cache_init(&kv[s], bounds[s], bounds[s + 1], c->num_kv_heads,
                                       c->head_dim, S + gc->n_steps, 1),
                         0);
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
            int32_t token = gc->generated[step - 1]; /* teacher forcing */
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

static void test_every_golden(void **state) {
    (void)state;
    double worst_delta = 0.0, worst_mean = 0.0, worst_agree = 1.0, worst_agree_moe = 1.0;
    for (int i = 0; golden_case_names[i]; ++i) {
        struct golden_case gc;
        const char *name = golden_case_names[i];
        if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
        int V = gc.cfg.vocab_size, whole[2] = {0, gc.cfg.num_layers};
        float *logits = run_q8(&gc, whole, 1, 2);
        double max_delta = 0.0, max_ref = 0.0, sum_delta = 0.0;
        int agree = 0, moe = gc.cfg.num_experts > 0;
        for (int step = 0; step < gc.n_steps; ++step) {
            const float *got = logits + (size_t)step * V, *want = gc.logits + (size_t)step * V;
            for (int v = 0; v < V; ++v) {
                double d = fabs((double)got[v] - (double)want[v]);
                max_delta = fmax(max_delta, d);
                sum_delta += d;
                max_ref = fmax(max_ref, fabs((double)want[v]));
            }
            agree += argmax(got, V) == gc.generated[step];
        }
        double rate = (double)agree / gc.n_steps;
        double mean = sum_delta / ((double)gc.n_steps * V);
        printf("%-18s q8: max |dlogit| = %.4f, mean %.4f (max |logit| %.2f), greedy ids agree "
               "%d/%d (%.0f%%)\n",
               name, max_delta, mean, max_ref, agree, gc.n_steps, 100.0 * rate);
        worst_delta = fmax(worst_delta, max_delta);
        worst_mean = fmax(worst_mean, mean);
        if (moe)
            worst_agree_moe = fmin(worst_agree_moe, rate);
        else
            worst_agree = fmin(worst_agree, rate);
        free(logits);
        golden_case_close(&gc);
    }
    printf("q8 over all cases: worst max |dlogit| %.4f (bound %.1f), worst mean %.4f (bound %.2f), "
           "worst agreement %.0f%% dense (bound %.0f%%), %.0f%% MoE (bound %.0f%%)\n",
           worst_delta, Q8_MAX_DLOGIT, worst_mean, Q8_MAX_MEAN_DLOGIT, 100.0 * worst_agree,
           100.0 * Q8_MIN_AGREEMENT, 100.0 * worst_agree_moe, 100.0 * Q8_MIN_AGREEMENT_MOE);
    assert_true(worst_delta <= Q8_MAX_DLOGIT);
    assert_true(worst_mean <= Q8_MAX_MEAN_DLOGIT);
    assert_true(worst_agree >= Q8_MIN_AGREEMENT);
    assert_true(worst_agree_moe >= Q8_MIN_AGREEMENT_MOE);
}

/* q8 logits do not depend on the thread count or the stage split. */
static void test_q8_deterministic(void **state) {
    (void)state;
    static const char *const cases[] = {"qwen3_gqa_tied", "qwen3_moe", "qwen3_vl_moe"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        struct golden_case gc;
        if (golden_case_open(&gc, cases[i])) fail_msg("%s: %s", cases[i], strata_last_error());
        int L = gc.cfg.num_layers, whole[2] = {0, L}, split[3] = {0, L / 2, L};
        size_t bytes = (size_t)gc.n_steps * (size_t)gc.cfg.vocab_size * sizeof(float);
        float *two = run_q8(&gc, whole, 1, 2), *one = run_q8(&gc, whole, 1, 1);
        float *parts = run_q8(&gc, split, 2, 2);
        if (memcmp(one, two, bytes)) fail_msg("%s: q8 1 thread differs from 2", cases[i]);
        if (memcmp(parts, two, bytes)) fail_msg("%s: q8 split at %d differs", cases[i], L / 2);
        printf("%-18s q8: 1 = 2 threads and split [0,%d)+[%d,%d) = whole, bit for bit\n", cases[i],
               L / 2, L / 2, L);
        free(one);
        free(two);
        free(parts);
        golden_case_close(&gc);
    }
}

/* The q8 model reports its bytes; a bad dtype name is refused by name. */
static void test_q8_bytes_and_names(void **state) {
    (void)state;
    struct golden_case gc;
    struct reference_model *m;
    enum reference_weights_dtype dt;
    size_t replaced = 1;
    assert_int_equal(golden_case_open(&gc, "qwen3_gqa_tied"), 0);
    assert_int_equal(golden_model(&m, &gc, 0, gc.cfg.num_layers, 1, 1, 1), 0);
    assert_int_equal(reference_model_q8_bytes(m, &replaced), 0);
    assert_int_equal(replaced, 0);
    reference_model_free(m);
    assert_int_equal(
        golden_model_dtype(&m, &gc, 0, gc.cfg.num_layers, 1, 1, 1, REFERENCE_WEIGHTS_Q8), 0);
    size_t q8 = reference_model_q8_bytes(m, &replaced);
    printf("qwen3_gqa_tied q8: %zu bytes of q8 copies replace %zu bytes of bf16 matrices "
           "(%.3f)\n",
           q8, replaced, (double)q8 / (double)replaced);
    /* bf16 -> 1.125 bytes per weight: 9/16 of the bytes (every dimension is a multiple of 32). */
    assert_int_equal(q8 * 16, replaced * 9);
    reference_model_free(m);
    golden_case_close(&gc);
    assert_int_equal(reference_weights_dtype_parse(&dt, "q8"), 0);
    assert_int_equal(dt, REFERENCE_WEIGHTS_Q8);
    assert_int_equal(reference_weights_dtype_parse(&dt, "bf16"), 0);
    assert_int_equal(dt, REFERENCE_WEIGHTS_STORED);
    assert_int_equal(reference_weights_dtype_parse(&dt, "q4"), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "bf16 or q8"));
    assert_string_equal(reference_weights_dtype_name(REFERENCE_WEIGHTS_Q8), "q8");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_golden),
        cmocka_unit_test(test_q8_deterministic),
        cmocka_unit_test(test_q8_bytes_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
