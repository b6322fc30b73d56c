/* The teacher-forced golden run (golden_run.h), moved out of golden_test.c and
 * q8_golden_test.c, which each had a copy of it. */
#include "tests/reference/golden_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "runtime/base/status.h"

float *golden_run(const struct golden_case *gc, const int *bounds, int n_stages, int threads,
                  enum reference_weights_dtype dtype) {
    return golden_run_kv(gc, bounds, n_stages, threads, dtype, OPS_F32);
}

float *golden_run_kv(const struct golden_case *gc, const int *bounds, int n_stages, int threads,
                     enum reference_weights_dtype dtype, enum ops_dtype kv_dtype) {
    const struct model_config *c = &gc->cfg;
    int V = c->vocab_size, H = c->hidden_size, S = gc->n_prompt;
    struct reference_model *stage[GOLDEN_RUN_MAX_STAGES] = {0};
    struct kv_cache kv[GOLDEN_RUN_MAX_STAGES];
    assert_in_range(n_stages, 1, GOLDEN_RUN_MAX_STAGES);
    memset(kv, 0, sizeof kv);
    for (int s = 0; s < n_stages; ++s) {
        if (golden_model_dtype(&stage[s], gc, bounds[s], bounds[s + 1], s == 0, s == n_stages - 1,
                               threads, dtype))
            fail_msg("%s [%d,%d): %s", gc->name, bounds[s], bounds[s + 1], strata_last_error());
        assert_int_equal(kv_cache_init(&kv[s], bounds[s], bounds[s + 1], c->num_kv_heads,
                                       c->head_dim, S + gc->n_steps, 1, 0, kv_dtype),
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
