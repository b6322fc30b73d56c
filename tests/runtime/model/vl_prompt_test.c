/* Qwen3-VL prompt assembly (runtime/model/vl_prompt) against transformers: the goldens'
 * get_rope_index output (tests/golden/qwen3_vl*, golden.json vision.position_ids and
 * rope_delta), the spec's worked example (qwen3-vl-preprocessing.md §8.4), and multi-image,
 * tall-image and image-at-the-end prompts computed by hand from the spec's algorithm (§8.3).
 * Bad inputs (count mismatches, touching images, videos, odd grids) get clear errors. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/vl_prompt.h"
#include "tests/test_util.h"

#define IMG 151655
#define VID 151656
#define VS 151652
#define VE 151653

static const struct vl_tokens qwen_tok = {IMG, VID, 2};

static int ints(int32_t *out, int cap, const cJSON *array) {
    int n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, array) {
        assert_true(n < cap);
        out[n++] = (int32_t)item->valuedouble;
    }
    return n;
}

/* Collapses each image run of the golden prompt to one pad, expands it back with the
 * recorded grid, and recomputes HF's positions and rope_delta. */
static void check_golden(const char *name) {
    char dir[4096], path[4200];
    struct model_config cfg;
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/golden"), name);
    if (model_config_load(&cfg, dir)) fail_msg("%s", strata_last_error());
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (cli_read_file(&text, &len, path)) fail_msg("%s", strata_last_error());
    cJSON *json = cJSON_ParseWithLength(text, len);
    assert_non_null(json);
    const cJSON *vision = cJSON_GetObjectItem(json, "vision");
    int32_t prompt[64], collapsed[64], expanded[64], want[3][64], got[3 * 64], grid[8];
    int n = ints(prompt, 64, cJSON_GetObjectItem(json, "prompt_ids")), nc = 0, ne = 0, delta = 0;
    const cJSON *thw = cJSON_GetObjectItem(vision, "image_grid_thw");
    assert_int_equal(cJSON_GetArraySize(thw), 1);
    assert_int_equal(ints(grid, 8, cJSON_GetArrayItem(thw, 0)), 3);
    struct vl_grid g = {grid[0], grid[1], grid[2]};
    struct vl_tokens tok = {cfg.image_token_id, cfg.video_token_id, cfg.vision.spatial_merge_size};
    for (int r = 0; r < 3; r++)
        assert_int_equal(
            ints(want[r], 64, cJSON_GetArrayItem(cJSON_GetObjectItem(vision, "position_ids"), r)),
            n);
    for (int i = 0; i < n; i++)
        if (prompt[i] != tok.image_token_id || i == 0 || prompt[i - 1] != tok.image_token_id)
            collapsed[nc++] = prompt[i];
    assert_true(nc < n);
    if (vl_expand_prompt(expanded, 64, &ne, collapsed, nc, &tok, &g, 1))
        fail_msg("%s", strata_last_error());
    assert_int_equal(ne, n);
    assert_memory_equal(expanded, prompt, sizeof(int32_t) * (size_t)n);
    if (vl_rope_index(got, &delta, prompt, n, &tok, &g, 1)) fail_msg("%s", strata_last_error());
    for (int r = 0; r < 3; r++)
        assert_memory_equal(got + r * n, want[r], sizeof(int32_t) * (size_t)n);
    assert_int_equal(delta, cJSON_GetObjectItem(vision, "rope_delta")->valueint);
    printf("%s: expanded %d -> %d tokens, positions and rope_delta %d equal HF's\n", name, nc, n,
           delta);
    cJSON_Delete(json);
    free(text);
}

/* tests/golden/<case>/e2e/e2e.json (two images, when in the checkout): prompt_ids with one
 * pad per image expand to expanded_ids; positions and rope_delta equal HF's. */
static void check_e2e(const char *name) {
    char dir[4096], path[4200], *text = NULL;
    size_t len = 0;
    struct model_config cfg;
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/golden"), name);
    if (model_config_load(&cfg, dir)) fail_msg("%s", strata_last_error());
    snprintf(path, sizeof path, "%s/e2e/e2e.json", dir);
    if (cli_read_file(&text, &len, path) < 0) {
        printf("note: %s/e2e not in this checkout: the two-image check did not run\n", name);
        return;
    }
    cJSON *json = cJSON_ParseWithLength(text, len);
    assert_non_null(json);
    int32_t prompt[64], want_ids[128], ids[128], want[3][128], got[3 * 128];
    struct vl_grid grids[8];
    int n_images = 0, delta = 0, n = 0;
    const cJSON *img;
    cJSON_ArrayForEach(img, cJSON_GetObjectItem(json, "images")) {
        int32_t thw[3];
        assert_int_equal(ints(thw, 3, cJSON_GetObjectItem(img, "grid_thw")), 3);
        grids[n_images++] = (struct vl_grid){thw[0], thw[1], thw[2]};
    }
    int np = ints(prompt, 64, cJSON_GetObjectItem(json, "prompt_ids"));
    int ne = ints(want_ids, 128, cJSON_GetObjectItem(json, "expanded_ids"));
    for (int r = 0; r < 3; r++)
        assert_int_equal(
            ints(want[r], 128, cJSON_GetArrayItem(cJSON_GetObjectItem(json, "position_ids"), r)),
            ne);
    struct vl_tokens tok = {cfg.image_token_id, cfg.video_token_id, cfg.vision.spatial_merge_size};
    if (vl_expand_prompt(ids, 128, &n, prompt, np, &tok, grids, n_images))
        fail_msg("%s", strata_last_error());
    assert_int_equal(n, ne);
    assert_memory_equal(ids, want_ids, sizeof(int32_t) * (size_t)n);
    if (vl_rope_index(got, &delta, ids, n, &tok, grids, n_images))
        fail_msg("%s", strata_last_error());
    for (int r = 0; r < 3; r++)
        assert_memory_equal(got + r * n, want[r], sizeof(int32_t) * (size_t)n);
    assert_int_equal(delta, cJSON_GetObjectItem(json, "rope_delta")->valueint);
    printf("%s e2e: %d images, expanded %d -> %d tokens, positions and rope_delta %d equal "
           "HF's\n",
           name, n_images, np, n, delta);
    cJSON_Delete(json);
    free(text);
}

static void test_goldens(void **state) {
    (void)state;
    check_golden("qwen3_vl");
    check_golden("qwen3_vl_moe");
    check_e2e("qwen3_vl");
    check_e2e("qwen3_vl_moe");
}

static void check_positions(const int32_t *ids, int n, const struct vl_grid *grids, int n_images,
                            const int32_t *t, const int32_t *h, const int32_t *w, int want_delta) {
    int32_t pos[3 * 64];
    int delta = 99;
    assert_true(n <= 64);
    if (vl_rope_index(pos, &delta, ids, n, &qwen_tok, grids, n_images))
        fail_msg("%s", strata_last_error());
    assert_memory_equal(pos, t, sizeof(int32_t) * (size_t)n);
    assert_memory_equal(pos + n, h, sizeof(int32_t) * (size_t)n);
    assert_memory_equal(pos + 2 * n, w, sizeof(int32_t) * (size_t)n);
    assert_int_equal(delta, want_delta);
}

/* Spec §8.4 (VERIFIED-RUN with transformers 4.57 and 5.23). */
static void test_worked_example(void **state) {
    (void)state;
    int32_t collapsed[] = {1, 2, 3, 4, 5, VS, IMG, VE, 6, 7, 8, 9}, ids[64];
    int n = 0;
    struct vl_grid g = {1, 6, 8};
    if (vl_expand_prompt(ids, 64, &n, collapsed, 12, &qwen_tok, &g, 1))
        fail_msg("%s", strata_last_error());
    assert_int_equal(n, 23);
    for (int i = 0; i < 12; i++)
        assert_int_equal(ids[6 + i], IMG);
    assert_int_equal(ids[18], VE);
    const int32_t t[] = {0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 10, 11, 12, 13, 14};
    const int32_t h[] = {0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 10, 11, 12, 13, 14};
    const int32_t w[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 6, 7, 8, 9, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    check_positions(ids, n, &g, 1, t, h, w, -8);
    int32_t dec[3 * 2];
    vl_decode_positions(dec, 2, 23, -8); /* next tokens: 15, 16 on every row */
    const int32_t want_dec[] = {15, 16, 15, 16, 15, 16};
    assert_memory_equal(dec, want_dec, sizeof want_dec);
}

/* Two images with text between and after (by hand from §8.3): image 1 grid (1,4,4) is 2x2
 * from position 3 (advance 2), image 2 grid (1,2,6) is 1x3 from position 8 (advance 3). */
static void test_two_images(void **state) {
    (void)state;
    int32_t collapsed[] = {10, 11, VS, IMG, VE, 12, VS, IMG, VE, 13, 14}, ids[64];
    struct vl_grid g[2] = {{1, 4, 4}, {1, 2, 6}};
    int n = 0;
    if (vl_expand_prompt(ids, 64, &n, collapsed, 11, &qwen_tok, g, 2))
        fail_msg("%s", strata_last_error());
    const int32_t want_ids[] = {10, 11, VS,  IMG, IMG, IMG, IMG, VE,
                                12, VS, IMG, IMG, IMG, VE,  13,  14};
    assert_int_equal(n, 16);
    assert_memory_equal(ids, want_ids, sizeof want_ids);
    const int32_t t[] = {0, 1, 2, 3, 3, 3, 3, 5, 6, 7, 8, 8, 8, 11, 12, 13};
    const int32_t h[] = {0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8, 8, 8, 11, 12, 13};
    const int32_t w[] = {0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    check_positions(ids, n, g, 2, t, h, w, 14 - 16);
}

/* A tall image (gh 3 > gw 1) ending the prompt, and an image first. */
static void test_tall_image_at_the_end(void **state) {
    (void)state;
    struct vl_grid tall = {1, 6, 2}, wide = {1, 2, 4};
    const int32_t ids[] = {7, VS, IMG, IMG, IMG};
    const int32_t t[] = {0, 1, 2, 2, 2}, h[] = {0, 1, 2, 3, 4}, w[] = {0, 1, 2, 2, 2};
    check_positions(ids, 5, &tall, 1, t, h, w, 5 - 5); /* max 4, + 1 - 5 */
    const int32_t ids2[] = {IMG, IMG, 9};
    const int32_t t2[] = {0, 0, 2}, h2[] = {0, 0, 2}, w2[] = {0, 1, 2};
    check_positions(ids2, 3, &wide, 1, t2, h2, w2, 0);
    const int32_t text[] = {5, 6, 7}, ar[] = {0, 1, 2};
    check_positions(text, 3, NULL, 0, ar, ar, ar, 0);
}

static void expect_error(int rc, const char *needle) {
    assert_true(rc < 0);
    if (!strstr(strata_last_error(), needle))
        fail_msg("error '%s' does not mention '%s'", strata_last_error(), needle);
}

static void test_refusals(void **state) {
    (void)state;
    int32_t out[64], pos[3 * 64];
    int n, delta;
    struct vl_grid g1 = {1, 4, 4}, g2[2] = {{1, 2, 2}, {1, 2, 2}};
    const int32_t two_pads[] = {VS, IMG, VE, VS, IMG, VE};
    expect_error(vl_expand_prompt(out, 64, &n, two_pads, 6, &qwen_tok, &g1, 1),
                 "has 2 image tokens (id 151655) for 1 image");
    expect_error(vl_expand_prompt(out, 4, &n, two_pads, 3, &qwen_tok, &g1, 1), "room for 4");
    assert_int_equal(n, 6);
    const int32_t short_run[] = {VS, IMG, IMG, IMG, VE};
    expect_error(vl_rope_index(pos, &delta, short_run, 5, &qwen_tok, &g1, 1),
                 "image 0 at prompt position 1 has 3 image tokens, its grid (1, 4, 4) needs 4");
    const int32_t touching[] = {IMG, IMG};
    expect_error(vl_rope_index(pos, &delta, touching, 2, &qwen_tok, g2, 2), "has 2 image tokens");
    const int32_t leftover[] = {IMG, 3};
    expect_error(vl_rope_index(pos, &delta, leftover, 2, &qwen_tok, g2, 2),
                 "holds 1 image(s) but the request has 2");
    expect_error(vl_rope_index(pos, &delta, leftover, 2, &qwen_tok, NULL, 0), "has 0 image grid");
    const int32_t video[] = {3, VID};
    expect_error(vl_rope_index(pos, &delta, video, 2, &qwen_tok, NULL, 0), "video");
    struct vl_grid t2 = {2, 2, 2}, odd = {1, 3, 2};
    int64_t count;
    expect_error(vl_image_tokens(&count, &t2, 2, 0), "t = 2");
    expect_error(vl_image_tokens(&count, &odd, 2, 0), "multiples of the merge size 2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),    cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_two_images), cmocka_unit_test(test_tall_image_at_the_end),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
