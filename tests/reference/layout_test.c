/* Other storage layouts and dtypes of the same weights load to the same numbers.
 *
 * The qwen3_moe golden checkpoint is rewritten at test time with: the experts fused in
 * transformers v5's runtime layout (experts.gate_up_proj [E, 2I, H], gate rows first, and
 * experts.down_proj [E, H, I]); every attention matrix as F32; every norm vector as F16.
 * bf16 values are exact in F32, and these (|x| ~ 1) are exact in F16, so the rewritten model
 * must give bit-identical logits to the original (the F32 matmul path performs the same
 * arithmetic as the bf16 one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

#define MAX_OUT 512

struct out_tensor {
    char name[200];
    const char *dtype;
    int ndim;
    long long shape[3];
    void *data;
    size_t bytes;
};

/* The norms rewritten as F16 must stay exact, or the logits could not be bit-identical. */
static uint16_t f32_to_f16_exact(float f) {
    uint16_t h = f32_to_f16(f);
    assert_true(f16_to_f32(h) == f);
    return h;
}

static void add(struct out_tensor *out, int *n, const char *name, const char *dtype, int ndim,
                const long long *shape, void *data, size_t bytes) {
    assert_true(*n < MAX_OUT);
    struct out_tensor *t = &out[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; ++i)
        t->shape[i] = shape[i];
    t->data = data;
    t->bytes = bytes;
}

static void write_safetensors(const char *path, const struct out_tensor *t, int n) {
    size_t cap = 256 + (size_t)n * 256, len = 0, offset = 0;
    char *header = malloc(cap);
    assert_non_null(header);
    len += (size_t)snprintf(header, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; ++i) {
        len += (size_t)snprintf(header + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; ++d)
            len += (size_t)snprintf(header + len, cap - len, "%s%lld", d ? "," : "", t[i].shape[d]);
        len += (size_t)snprintf(header + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", offset,
                                offset + t[i].bytes);
        offset += t[i].bytes;
    }
    len += (size_t)snprintf(header + len, cap - len, "}");
    while (len % 8)
        header[len++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hlen = len;
    assert_int_equal(fwrite(&hlen, 8, 1, f), 1);
    assert_int_equal(fwrite(header, 1, len, f), len);
    for (int i = 0; i < n; ++i)
        assert_int_equal(fwrite(t[i].data, 1, t[i].bytes, f), t[i].bytes);
    assert_int_equal(fclose(f), 0);
    free(header);
}

/* Logits [n_steps, V] of the teacher-forced golden request on a whole model. */
static float *run(const struct golden_case *gc, const struct safetensors *st) {
    const struct model_config *c = &gc->cfg;
    struct reference_load_options opt = {.layer_start = 0,
                                         .layer_end = c->num_layers,
                                         .with_embed = 1,
                                         .with_head = 1,
                                         .num_threads = 2};
    struct reference_model *m = NULL;
    if (reference_model_load(&m, c, st, &opt)) fail_msg("%s", strata_last_error());
    struct kv_cache kv;
    assert_int_equal(kv_cache_init(&kv, 0, c->num_layers, c->num_kv_heads, c->head_dim,
                                   gc->n_prompt + gc->n_steps, 1, 0, OPS_F32),
                     0);
    int slot;
    assert_int_equal(kv_cache_acquire(&kv, &slot), 0);
    int H = c->hidden_size, V = c->vocab_size;
    float *hidden = malloc((size_t)gc->n_prompt * H * sizeof(float));
    float *logits = malloc((size_t)gc->n_steps * V * sizeof(float));
    int pos = 0;
    for (int step = 0; step < gc->n_steps; ++step) {
        int n = step ? 1 : gc->n_prompt;
        const int32_t *tokens = step ? &gc->generated[step - 1] : gc->prompt;
        struct forward_item item = {.slot = slot, .pos = pos, .n_tokens = n};
        if (reference_embed(m, hidden, tokens, n) || reference_forward(m, &kv, hidden, &item, 1) ||
            reference_logits(m, logits + (size_t)step * V, hidden + (size_t)(n - 1) * H, 1))
            fail_msg("%s", strata_last_error());
        pos += n;
    }
    free(hidden);
    kv_cache_free(&kv);
    reference_model_free(m);
    return logits;
}

/* Copies expert matrix `src` [rows, cols] (bf16) into a fused expert block: out-major
 * (rows stacked from row `first`) or input-major ([cols, width], output `first + r`). */
static void put_expert(char *block, const uint16_t *src, int rows, int cols, int width, int first,
                       int in_major) {
    uint16_t *dst = (uint16_t *)block;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            size_t at = in_major ? (size_t)c * (size_t)width + (size_t)(first + r)
                                 : (size_t)(first + r) * (size_t)cols + (size_t)c;
            dst[at] = src[(size_t)r * (size_t)cols + (size_t)c];
        }
}

/* The experts fused out-major (transformers v5: gate_up [E, 2I, H], down [E, H, I]) or
 * input-major (gate_up [E, H, 2I], down [E, I, H]; a qwen3_moe checkpoint may be stored
 * either way). */
static void check_fused_experts(int in_major) {
    struct golden_case gc;
    if (golden_case_open(&gc, "qwen3_moe")) fail_msg("%s", strata_last_error());
    const struct model_config *c = &gc.cfg;
    int E = c->num_experts, I = c->moe_intermediate_size, H = c->hidden_size;
    static struct out_tensor out[MAX_OUT];
    void *owned[MAX_OUT];
    int n = 0, n_owned = 0, fused_layers = 0;
    for (int i = 0; i < safetensors_count(gc.st); ++i) {
        const struct st_tensor *t = safetensors_at(gc.st, i);
        long long shape[3] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0, 0};
        if (strstr(t->name, ".mlp.experts.")) continue; /* fused below */
        if (strstr(t->name, "norm.weight")) {
            uint16_t *h = malloc((size_t)t->numel * 2);
            for (int64_t k = 0; k < t->numel; ++k)
                h[k] = f32_to_f16_exact(bf16_to_f32(((const uint16_t *)t->data)[k]));
            owned[n_owned++] = h;
            add(out, &n, t->name, "F16", t->ndim, shape, h, (size_t)t->numel * 2);
        } else if (strstr(t->name, "self_attn.") && t->ndim == 2) {
            float *f = malloc((size_t)t->numel * 4);
            st_tensor_to_f32(f, t);
            owned[n_owned++] = f;
            add(out, &n, t->name, "F32", 2, shape, f, (size_t)t->numel * 4);
        } else {
            add(out, &n, t->name, "BF16", t->ndim, shape, (void *)t->data, t->nbytes);
        }
    }
    for (int l = 0; l < c->num_layers; ++l) {
        if (!model_config_layer_is_moe(c, l)) continue;
        size_t mat = (size_t)I * H * 2;
        char *gate_up = malloc((size_t)E * 2 * mat), *down = malloc((size_t)E * mat), name[160];
        for (int e = 0; e < E; ++e) {
            const char *parts[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; ++p) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e,
                         parts[p]);
                const struct st_tensor *t = safetensors_find(gc.st, name);
                assert_non_null(t);
                if (p == 2)
                    put_expert(down + (size_t)e * mat, t->data, H, I, H, 0, in_major);
                else
                    put_expert(gate_up + (size_t)e * 2 * mat, t->data, I, H, 2 * I, p * I,
                               in_major);
            }
        }
        owned[n_owned++] = gate_up;
        owned[n_owned++] = down;
        long long gu_shape[3] = {E, 2 * I, H}, down_shape[3] = {E, H, I};
        if (in_major) {
            gu_shape[1] = H, gu_shape[2] = 2 * I;
            down_shape[1] = I, down_shape[2] = H;
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        add(out, &n, name, "BF16", 3, gu_shape, gate_up, (size_t)E * 2 * mat);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
        add(out, &n, name, "BF16", 3, down_shape, down, (size_t)E * mat);
        fused_layers++;
    }
    assert_true(fused_layers > 0);
    const char *tmp = getenv("TEST_TMPDIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/qwen3_moe_%s", tmp ? tmp : "/tmp", in_major ? "in" : "out");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, out, n);

    struct safetensors *rewritten = NULL;
    if (safetensors_open(&rewritten, dir)) fail_msg("%s", strata_last_error());
    float *want = run(&gc, gc.st), *got = run(&gc, rewritten);
    assert_memory_equal(got, want, (size_t)gc.n_steps * c->vocab_size * sizeof(float));
    printf("qwen3_moe rewritten (%s fused experts in %d layers, F32 attention, F16 norms): "
           "logits bit-identical over %d steps\n",
           in_major ? "input-major" : "v5 out-major", fused_layers, gc.n_steps);
    free(want);
    free(got);
    safetensors_close(rewritten);
    for (int i = 0; i < n_owned; ++i)
        free(owned[i]);
    golden_case_close(&gc);
}

static void test_v5_fused_experts_f32_f16(void **state) {
    (void)state;
    check_fused_experts(0);
}

static void test_input_major_fused_experts(void **state) {
    (void)state;
    check_fused_experts(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v5_fused_experts_f32_f16),
        cmocka_unit_test(test_input_major_fused_experts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
