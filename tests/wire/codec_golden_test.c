/* Wire codecs on real hidden states: each golden model (tests/golden) is split into two
 * stages at L/2, and the hidden states crossing the boundary at every prefill and decode
 * step travel through a real Activation frame (encode -> build -> verify/read -> decode)
 * with each codec. Prints the max and RMS error of the boundary states and whether the
 * greedy tokens change against the golden's. The lossless default (f32, codec none) must
 * reproduce the golden tokens exactly with zero error; the lossy codecs must stay inside
 * their rounding bounds, and their token changes are reported. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "tests/test_util.h"
#include "wire/wire.h"

static const char *const cases[] = {"qwen3_deep8", "qwen3_moe", "qwen3_long_prompt",
                                    "qwen3_mha_untied"};
static const enum wire_codec codecs[] = {WIRE_CODEC_NONE, WIRE_CODEC_BF16, WIRE_CODEC_FP16,
                                         WIRE_CODEC_INT8_ROW};

struct golden {
    struct model_config cfg;
    struct safetensors *st;
    int32_t prompt[256];
    int n_prompt;
    int32_t generated[256];
    int n_steps;
};

static int read_ids(int32_t *out, int *n, const cJSON *root, const char *key) {
    const cJSON *array = cJSON_GetObjectItemCaseSensitive(root, key);
    int count = cJSON_GetArraySize(array);
    if (!cJSON_IsArray(array) || count <= 0 || count > 256) return -1;
    for (int i = 0; i < count; ++i)
        out[i] = (int32_t)cJSON_GetArrayItem(array, i)->valuedouble;
    *n = count;
    return 0;
}

static void golden_open(struct golden *g, const char *name) {
    char dir[2048], path[4096];
    memset(g, 0, sizeof *g);
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/golden"), name);
    if (model_config_load(&g->cfg, dir) || safetensors_open(&g->st, dir))
        fail_msg("%s: %s", name, strata_last_error());
    snprintf(path, sizeof path, "%s/golden.json", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    assert_int_equal(read_ids(g->prompt, &g->n_prompt, root, "prompt_ids"), 0);
    assert_int_equal(read_ids(g->generated, &g->n_steps, root, "generated_ids"), 0);
    cJSON_Delete(root);
}

struct error_stats {
    double max_abs, sum_sq, max_value;
    size_t count;
    int bound_violations;
};

/* Sends rows [n, H] through an Activation frame with `codec` and decodes them into `out`. */
static void through_wire(float *out, const float *hidden, int n, int hidden_size,
                         enum wire_codec codec, struct wire_arena *arena,
                         struct error_stats *stats) {
    size_t count = (size_t)n * hidden_size;
    uint8_t *encoded = malloc(count * 4);
    float *scales = malloc((size_t)n * sizeof(float));
    struct wire_activation msg, got;
    memset(&msg, 0, sizeof msg);
    assert_int_equal(wire_tensor_encode_f32(&msg.hidden, encoded, scales, hidden, (size_t)n,
                                            (size_t)hidden_size, codec),
                     0);
    assert_int_equal(wire_build_activation(arena, &msg), 0);
    assert_int_equal(
        wire_read_activation(&got, wire_arena_frame(arena), wire_arena_frame_len(arena)), 0);
    assert_int_equal(got.hidden.codec, codec);
    assert_int_equal(wire_tensor_decode_f32(out, &got.hidden), 0);
    for (size_t i = 0; i < count; ++i) {
        double d = fabs((double)out[i] - hidden[i]), a = fabs((double)hidden[i]);
        double bound = codec == WIRE_CODEC_NONE   ? 0.0
                       : codec == WIRE_CODEC_BF16 ? a * 0x1p-8
                       : codec == WIRE_CODEC_FP16 ? (a < 65504 ? a * 0x1p-11 + 0x1p-25 : INFINITY)
                                                  : scales[i / hidden_size] * 0.5 * (1 + 1e-6);
        if (d > bound) stats->bound_violations++;
        if (d > stats->max_abs) stats->max_abs = d;
        if (a > stats->max_value) stats->max_value = a;
        stats->sum_sq += d * d;
    }
    stats->count += count;
    free(encoded);
    free(scales);
}

static int argmax(const float *row, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (row[i] > row[best]) best = i;
    return best;
}

/* Greedy decode of the golden's steps through a 2-stage split with `codec` on the boundary;
 * returns how many generated tokens differ from the golden's. */
static int run_split(const struct golden *g, enum wire_codec codec, struct error_stats *stats,
                     int32_t *tokens_out) {
    const struct model_config *c = &g->cfg;
    int split = c->num_layers / 2, H = c->hidden_size, max_seq = g->n_prompt + g->n_steps;
    struct reference_model *first = NULL, *last = NULL;
    struct reference_load_options first_opt = {.layer_start = 0,
                                               .layer_end = split,
                                               .with_embed = 1,
                                               .with_head = 0,
                                               .num_threads = 2},
                                  last_opt = {.layer_start = split,
                                              .layer_end = c->num_layers,
                                              .with_embed = 0,
                                              .with_head = 1,
                                              .num_threads = 2};
    if (reference_model_load(&first, c, g->st, &first_opt) ||
        reference_model_load(&last, c, g->st, &last_opt))
        fail_msg("load: %s", strata_last_error());
    struct kv_cache kv_first, kv_last;
    int slot_first, slot_last;
    assert_int_equal(
        kv_cache_init(&kv_first, 0, split, c->num_kv_heads, c->head_dim, max_seq, 1, 0, OPS_F32), 0);
    assert_int_equal(
        kv_cache_init(&kv_last, split, c->num_layers, c->num_kv_heads, c->head_dim, max_seq, 1, 0, OPS_F32),
        0);
    assert_int_equal(kv_cache_acquire(&kv_first, &slot_first), 0);
    assert_int_equal(kv_cache_acquire(&kv_last, &slot_last), 0);
    float *hidden = malloc((size_t)g->n_prompt * H * sizeof(float));
    float *received = malloc((size_t)g->n_prompt * H * sizeof(float));
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    int changed = 0, pos = 0;
    int32_t token = 0;
    for (int step = 0; step < g->n_steps; ++step) {
        const int32_t *input = step == 0 ? g->prompt : &token;
        int n = step == 0 ? g->n_prompt : 1;
        struct forward_item item_first = {slot_first, pos, n, NULL, NULL, NULL, 0};
        struct forward_item item_last = {slot_last, pos, n, NULL, NULL, NULL, 0};
        if (reference_embed(first, hidden, input, n) ||
            reference_forward(first, &kv_first, hidden, &item_first, 1))
            fail_msg("first stage: %s", strata_last_error());
        through_wire(received, hidden, n, H, codec, &arena, stats);
        if (reference_forward(last, &kv_last, received, &item_last, 1) ||
            reference_logits(last, logits, received + (size_t)(n - 1) * H, 1))
            fail_msg("last stage: %s", strata_last_error());
        token = argmax(logits, c->vocab_size);
        tokens_out[step] = token;
        changed += token != g->generated[step];
        pos += n;
    }
    wire_arena_free(&arena);
    free(hidden);
    free(received);
    free(logits);
    kv_cache_free(&kv_first);
    kv_cache_free(&kv_last);
    reference_model_free(first);
    reference_model_free(last);
    return changed;
}

static void codecs_on_golden_hidden_states(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        struct golden g;
        golden_open(&g, cases[k]);
        for (size_t j = 0; j < sizeof codecs / sizeof codecs[0]; ++j) {
            struct error_stats stats = {0};
            int32_t tokens[256];
            int changed = run_split(&g, codecs[j], &stats, tokens);
            int first_change = -1;
            for (int s = 0; s < g.n_steps && first_change < 0; ++s)
                if (tokens[s] != g.generated[s]) first_change = s;
            printf("%-18s split L/2  codec %-8s  max abs err %.3e  RMS %.3e  (max |h| %.3g)  "
                   "greedy tokens changed: %d of %d%s\n",
                   cases[k], wire_codec_name(codecs[j]), stats.max_abs,
                   sqrt(stats.sum_sq / (double)stats.count), stats.max_value, changed, g.n_steps,
                   changed ? " (first at step " : "");
            if (changed) printf("%d)\n", first_change);
            assert_int_equal(stats.bound_violations, 0);
            if (codecs[j] == WIRE_CODEC_NONE) {
                /* The default is lossless: bit-identical states, the golden's tokens. */
                assert_true(stats.max_abs == 0.0);
                assert_int_equal(changed, 0);
            }
        }
        safetensors_close(g.st);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(codecs_on_golden_hidden_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
