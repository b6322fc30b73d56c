/* The reference vision encoder (reference/vision_encoder.h) against transformers: on the
 * qwen3_vl and qwen3_vl_moe goldens, the merged embeddings and DeepStack features HF computed
 * from pixel_values.f32 must be matched within a relative error of 1e-4, measured per tensor
 * as max |ours - hf| / max |hf|; likewise for the e2e cases, two real images of different
 * grids encoded in one call. Then the determinism contract (1 thread == 2 threads, images
 * in one call == each alone, a video's frames == the frames as images, bit for bit) and the
 * refusals (bad grids, missing or mis-shaped tensors, a text-only model). */
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

#include "reference/vision_encoder.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"
#include "tests/runtime/model/tiny_checkpoint.h"
#include "tests/test_util.h"

#define TOLERANCE 1e-4

/* Everything one forward call produces. */
struct vision_out {
    float *embeds;    /* [tokens, O] */
    float *deepstack; /* [K, tokens, O] */
    int64_t tokens;
};

static void out_free(struct vision_out *o) {
    free(o->embeds);
    free(o->deepstack);
    memset(o, 0, sizeof *o);
}

static struct vision_encoder *load(const struct golden_case *gc, int threads) {
    struct vision_encoder *enc = NULL;
    if (vision_encoder_load(&enc, &gc->cfg, gc->st, threads) != 0)
        fail_msg("%s: vision_encoder_load: %s", gc->name, strata_last_error());
    return enc;
}

static void run(struct vision_encoder *enc, struct vision_out *o, const float *pixels,
                int64_t n_patches, const int64_t *grid, int n_grids) {
    assert_int_equal(vision_encoder_count(enc, grid, n_grids, NULL, &o->tokens), 0);
    size_t per = (size_t)o->tokens * (size_t)vision_encoder_out_hidden(enc);
    size_t k = (size_t)vision_encoder_num_deepstack(enc);
    o->embeds = malloc(per * sizeof(float));
    o->deepstack = malloc((k ? k : 1) * per * sizeof(float));
    assert_non_null(o->embeds);
    assert_non_null(o->deepstack);
    if (vision_encoder_forward(enc, o->embeds, o->deepstack, pixels, n_patches, grid, n_grids))
        fail_msg("vision_encoder_forward: %s", strata_last_error());
}

/* max |a - b| / max |b| over n values. */
static double rel_error(const float *a, const float *b, size_t n) {
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= diff)) diff = d; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > mag) mag = fabs((double)b[i]);
    }
    return mag > 0.0 ? diff / mag : diff;
}

static void check_golden(const char *name) {
    struct golden_case gc;
    if (golden_case_open(&gc, name) != 0) fail_msg("%s: %s", name, strata_last_error());
    assert_true(gc.has_vision);
    struct vision_encoder *enc = load(&gc, 1);
    assert_int_equal(vision_encoder_patch_dim(enc), gc.patch_dim);
    assert_int_equal(vision_encoder_num_deepstack(enc), gc.num_deepstack);
    struct vision_out o = {0};
    run(enc, &o, gc.pixel_values, gc.n_patches, gc.image_grid_thw, gc.n_images);
    assert_int_equal(o.tokens, gc.n_visual);
    size_t per = (size_t)gc.n_visual * (size_t)gc.cfg.hidden_size;
    double err = rel_error(o.embeds, gc.vision_embeds, per);
    printf("%s: vision_embeds [%d, %d] max|a-b|/max|b| = %.3g\n", name, gc.n_visual,
           gc.cfg.hidden_size, err);
    assert_true(err <= TOLERANCE);
    for (int k = 0; k < gc.num_deepstack; ++k) {
        err = rel_error(o.deepstack + (size_t)k * per, gc.deepstack + (size_t)k * per, per);
        printf("%s: deepstack[%d] max|a-b|/max|b| = %.3g\n", name, k, err);
        assert_true(err <= TOLERANCE);
    }
    out_free(&o);
    vision_encoder_free(enc);
    golden_case_close(&gc);
}

static void test_golden_qwen3_vl(void **state) {
    (void)state;
    check_golden("qwen3_vl");
}

static void test_golden_qwen3_vl_moe(void **state) {
    (void)state;
    check_golden("qwen3_vl_moe");
}

/* Reads a float32 file of exactly `count` values (fails the test otherwise). */
static float *read_f32(const char *dir, const char *file, size_t count) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    float *x = malloc(count * sizeof(float) + 1);
    assert_non_null(x);
    size_t got = fread(x, sizeof(float), count + 1, f);
    fclose(f);
    if (got != count) fail_msg("%s: %zu floats, want %zu", path, got, count);
    return x;
}

static int json_dim(const cJSON *root, const char *key, int index) {
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsArray(shape) || index >= cJSON_GetArraySize(shape)) fail_msg("e2e.json: %s", key);
    return cJSON_GetArrayItem(shape, index)->valueint;
}

/* tests/golden/<case>/e2e: two real images (PNG / JPEG, different grids) preprocessed by HF's
 * default processor and encoded in ONE call by HF's vision tower; ours must match each tensor. */
static void check_e2e(const char *name) {
    struct golden_case gc;
    if (golden_case_open(&gc, name) != 0) fail_msg("%s: %s", name, strata_last_error());
    char dir[4096], *text = NULL;
    size_t len = 0;
    snprintf(dir, sizeof dir, "%s/%s/e2e", test_path("tests/golden"), name);
    char json_path[4200];
    snprintf(json_path, sizeof json_path, "%s/e2e.json", dir);
    FILE *f = fopen(json_path, "rb");
    if (!f) fail_msg("cannot open %s", json_path);
    text = calloc(1, 1 << 16);
    assert_non_null(text);
    len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(text, len);
    assert_non_null(root);
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(root, "images");
    int n_images = cJSON_GetArraySize(images);
    assert_true(n_images >= 2);
    int64_t grids[3 * 8];
    assert_true(n_images <= 8);
    for (int i = 0; i < n_images; ++i) {
        const cJSON *g =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(images, i), "grid_thw");
        for (int k = 0; k < 3; ++k)
            grids[3 * i + k] = cJSON_GetArrayItem(g, k)->valueint;
    }
    const int n_patches = json_dim(root, "pixel_values_shape", 0);
    const int patch_dim = json_dim(root, "pixel_values_shape", 1);
    const int tokens = json_dim(root, "vision_embeds_shape", 0), H = gc.cfg.hidden_size;
    const int K = json_dim(root, "deepstack_shape", 0);
    float *pixels = read_f32(dir, "pixel_values_fast.f32", (size_t)n_patches * patch_dim);
    float *embeds = read_f32(dir, "vision_embeds.f32", (size_t)tokens * H);
    float *deepstack = read_f32(dir, "deepstack.f32", (size_t)K * tokens * H);
    struct vision_encoder *enc = load(&gc, 2);
    assert_int_equal(K, vision_encoder_num_deepstack(enc));
    struct vision_out o = {0};
    run(enc, &o, pixels, n_patches, grids, n_images);
    assert_int_equal(o.tokens, tokens);
    const size_t per = (size_t)tokens * (size_t)H;
    double err = rel_error(o.embeds, embeds, per);
    printf("%s/e2e (%d images in one call): vision_embeds [%d, %d] max|a-b|/max|b| = %.3g\n", name,
           n_images, tokens, H, err);
    assert_true(err <= TOLERANCE);
    for (int k = 0; k < K; ++k) {
        err = rel_error(o.deepstack + (size_t)k * per, deepstack + (size_t)k * per, per);
        printf("%s/e2e: deepstack[%d] max|a-b|/max|b| = %.3g\n", name, k, err);
        assert_true(err <= TOLERANCE);
    }
    out_free(&o);
    vision_encoder_free(enc);
    free(pixels);
    free(embeds);
    free(deepstack);
    cJSON_Delete(root);
    free(text);
    golden_case_close(&gc);
}

static void test_e2e_qwen3_vl(void **state) {
    (void)state;
    check_e2e("qwen3_vl");
}

static void test_e2e_qwen3_vl_moe(void **state) {
    (void)state;
    check_e2e("qwen3_vl_moe");
}

static void assert_same(const struct vision_out *a, const struct vision_out *b, size_t a_off,
                        size_t b_off, size_t count, size_t a_stride, size_t b_stride, int k) {
    assert_memory_equal(a->embeds + a_off, b->embeds + b_off, count * sizeof(float));
    for (int j = 0; j < k; ++j)
        assert_memory_equal(a->deepstack + (size_t)j * a_stride + a_off,
                            b->deepstack + (size_t)j * b_stride + b_off, count * sizeof(float));
}

static void test_threads_bit_identical(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, "qwen3_vl_moe"), 0);
    struct vision_encoder *one = load(&gc, 1), *two = load(&gc, 2), *three = load(&gc, 3);
    struct vision_out a = {0}, b = {0}, c = {0};
    run(one, &a, gc.pixel_values, gc.n_patches, gc.image_grid_thw, 1);
    run(two, &b, gc.pixel_values, gc.n_patches, gc.image_grid_thw, 1);
    run(three, &c, gc.pixel_values, gc.n_patches, gc.image_grid_thw, 1);
    size_t per = (size_t)a.tokens * (size_t)gc.cfg.hidden_size;
    assert_same(&a, &b, 0, 0, per, per, per, gc.num_deepstack);
    assert_same(&a, &c, 0, 0, per, per, per, gc.num_deepstack);
    out_free(&a);
    out_free(&b);
    out_free(&c);
    vision_encoder_free(one);
    vision_encoder_free(two);
    vision_encoder_free(three);
    golden_case_close(&gc);
}

/* Image A = the golden (grid 1x4x6); image B = the same patch rows reversed and scaled, as a
 * 1x6x4 grid. [A, B] in one call must equal A alone followed by B alone, and a second call on
 * the same encoder (scratch already grown) must repeat the first. */
static void test_images_in_one_call_equal_alone(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, "qwen3_vl"), 0);
    struct vision_encoder *enc = load(&gc, 2);
    const size_t P = (size_t)gc.patch_dim, n = (size_t)gc.n_patches;
    float *both = malloc(2 * n * P * sizeof(float));
    assert_non_null(both);
    memcpy(both, gc.pixel_values, n * P * sizeof(float));
    for (size_t r = 0; r < n; ++r)
        for (size_t c = 0; c < P; ++c)
            both[(n + r) * P + c] = 0.75f * gc.pixel_values[(n - 1 - r) * P + c];
    const int64_t grid_a[3] = {1, 4, 6}, grid_b[3] = {1, 6, 4}, grids[6] = {1, 4, 6, 1, 6, 4};
    struct vision_out a = {0}, b = {0}, ab = {0}, again = {0};
    run(enc, &ab, both, 2 * (int64_t)n, grids, 2);
    run(enc, &a, both, (int64_t)n, grid_a, 1);
    run(enc, &b, both + n * P, (int64_t)n, grid_b, 1);
    run(enc, &again, both, 2 * (int64_t)n, grids, 2);
    const size_t O = (size_t)gc.cfg.hidden_size, per = (size_t)a.tokens * O;
    assert_int_equal(ab.tokens, a.tokens + b.tokens);
    assert_same(&ab, &a, 0, 0, per, 2 * per, per, gc.num_deepstack);
    assert_same(&ab, &b, per, 0, per, 2 * per, per, gc.num_deepstack);
    assert_same(&ab, &again, 0, 0, 2 * per, 2 * per, 2 * per, gc.num_deepstack);
    /* The reversed image is a different input: its features differ from A's. */
    assert_true(memcmp(a.embeds, b.embeds, per * sizeof(float)) != 0);
    out_free(&a);
    out_free(&b);
    out_free(&ab);
    out_free(&again);
    free(both);
    vision_encoder_free(enc);
    golden_case_close(&gc);
}

/* A video grid (t=2) attends within each frame (cu_seqlens per frame, spec §6.4) and repeats
 * the position table per frame, so it equals its two frames encoded as two images. */
static void test_video_frames_equal_images(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, "qwen3_vl"), 0);
    struct vision_encoder *enc = load(&gc, 1);
    const size_t P = (size_t)gc.patch_dim, n = (size_t)gc.n_patches;
    float *frames = malloc(2 * n * P * sizeof(float));
    assert_non_null(frames);
    for (size_t i = 0; i < n * P; ++i) {
        frames[i] = gc.pixel_values[i];
        frames[n * P + i] = -0.5f * gc.pixel_values[i];
    }
    const int64_t video[3] = {2, 4, 6}, images[6] = {1, 4, 6, 1, 4, 6};
    struct vision_out v = {0}, im = {0};
    run(enc, &v, frames, 2 * (int64_t)n, video, 1);
    run(enc, &im, frames, 2 * (int64_t)n, images, 2);
    const size_t per = (size_t)v.tokens * (size_t)gc.cfg.hidden_size;
    assert_same(&v, &im, 0, 0, per, per, per, gc.num_deepstack);
    out_free(&v);
    out_free(&im);
    free(frames);
    vision_encoder_free(enc);
    golden_case_close(&gc);
}

static void expect_refusal(struct vision_encoder *enc, const float *pixels, int64_t n_patches,
                           const int64_t *grid, int n_grids, const char *words) {
    float out[4096], ds[4 * 4096];
    int rc = vision_encoder_forward(enc, out, ds, pixels, n_patches, grid, n_grids);
    assert_int_equal(rc, STRATA_EINVAL);
    printf("refused as expected: %s\n", strata_last_error());
    if (!strstr(strata_last_error(), words))
        fail_msg("'%s' lacks '%s'", strata_last_error(), words);
}

static void test_bad_grids(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, "qwen3_vl"), 0);
    struct vision_encoder *enc = load(&gc, 1);
    const float *px = gc.pixel_values;
    const int64_t odd_h[3] = {1, 3, 8}, odd_w[3] = {1, 8, 3}, small[3] = {1, 4, 4};
    const int64_t zero_t[3] = {0, 4, 6}, negative[3] = {1, -4, -6}, huge[3] = {1, 1 << 30, 2};
    expect_refusal(enc, px, 24, odd_h, 1, "multiples of spatial_merge_size 2");
    expect_refusal(enc, px, 24, odd_w, 1, "multiples of spatial_merge_size 2");
    expect_refusal(enc, px, 24, small, 1, "24 pixel_values rows, but the 1 grid(s) describe 16");
    expect_refusal(enc, px, 24, zero_t, 1, "outside");
    expect_refusal(enc, px, 24, negative, 1, "outside");
    expect_refusal(enc, px, 24, huge, 1, "outside");
    expect_refusal(enc, px, 24, small, 0, "no image grid");
    const int64_t two[6] = {1, 4, 6, 1, 4, 6};
    expect_refusal(enc, px, 24, two, 2, "describe 48 patches");
    vision_encoder_free(enc);
    golden_case_close(&gc);
}

static char tmp_root[1024];

static const char *vl_config =
    "{\"model_type\":\"qwen3_vl\",\"text_config\":{\"vocab_size\":64,\"hidden_size\":16,"
    "\"intermediate_size\":24,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":8,\"rope_parameters\":{\"mrope_section\":[2,1,1]}},"
    "\"vision_config\":{\"depth\":3,\"hidden_size\":8,\"intermediate_size\":12,\"num_heads\":2,"
    "\"out_hidden_size\":16,\"patch_size\":2,\"num_position_embeddings\":16,"
    "\"deepstack_visual_indexes\":[0,2]}}";

/* A checkpoint without any block's attn.proj.bias: one error names all three. */
static void test_missing_tensors_listed(void **state) {
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/vl_no_proj_bias", tmp_root);
    struct tiny_checkpoint_options opt = {ST_BF16, 11, 1, 0, "attn.proj.bias"};
    if (tiny_checkpoint_write(dir, vl_config, &opt)) fail_msg("%s", strata_last_error());
    struct model_config cfg;
    assert_int_equal(model_config_load(&cfg, dir), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, dir), 0);
    struct vision_encoder *enc = (struct vision_encoder *)&cfg; /* must be reset to NULL */
    assert_int_equal(vision_encoder_load(&enc, &cfg, st, 1), STRATA_ENOTFOUND);
    assert_null(enc);
    const char *msg = strata_last_error();
    printf("refused as expected: %s\n", msg);
    assert_non_null(strstr(msg, "3 tensor(s) missing"));
    for (int i = 0; i < 3; ++i) {
        char name[96];
        snprintf(name, sizeof name, "model.visual.blocks.%d.attn.proj.bias", i);
        assert_non_null(strstr(msg, name));
    }
    safetensors_close(st);

    /* The complete checkpoint loads, and a text-only config is refused by name. */
    snprintf(dir, sizeof dir, "%s/vl_full", tmp_root);
    opt.omit_suffix = NULL;
    assert_int_equal(tiny_checkpoint_write(dir, vl_config, &opt), 0);
    assert_int_equal(safetensors_open(&st, dir), 0);
    assert_int_equal(vision_encoder_load(&enc, &cfg, st, 1), 0);
    assert_int_equal(vision_encoder_patch_dim(enc), 3 * 2 * 2 * 2);
    vision_encoder_free(enc);
    cfg.has_vision = 0;
    snprintf(cfg.model_type_name, sizeof cfg.model_type_name, "qwen3");
    assert_int_equal(vision_encoder_load(&enc, &cfg, st, 1), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "qwen3 has no vision tower"));
    safetensors_close(st);
}

/* A config whose vision MLP width disagrees with the checkpoint: every mis-shaped tensor is
 * named in one error. */
static void test_wrong_shapes_listed(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, "qwen3_vl"), 0);
    struct model_config cfg = gc.cfg;
    cfg.vision.intermediate_size = 48;
    struct vision_encoder *enc = NULL;
    assert_int_equal(vision_encoder_load(&enc, &cfg, gc.st, 1), STRATA_EFORMAT);
    const char *msg = strata_last_error();
    printf("refused as expected: %s\n", msg);
    assert_non_null(strstr(msg, "9 tensor(s) with the wrong shape"));
    assert_non_null(strstr(msg, "model.visual.blocks.0.mlp.linear_fc1.weight is [64,32], "
                                "expected [48,32]"));
    golden_case_close(&gc);
}

int main(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s", tmp ? tmp : "/tmp");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_qwen3_vl),
        cmocka_unit_test(test_golden_qwen3_vl_moe),
        cmocka_unit_test(test_e2e_qwen3_vl),
        cmocka_unit_test(test_e2e_qwen3_vl_moe),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_images_in_one_call_equal_alone),
        cmocka_unit_test(test_video_frames_equal_images),
        cmocka_unit_test(test_bad_grids),
        cmocka_unit_test(test_missing_tensors_listed),
        cmocka_unit_test(test_wrong_shapes_listed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
