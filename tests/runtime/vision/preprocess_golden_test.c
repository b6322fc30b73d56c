/* Image files -> pixel_values, against what transformers' default (fast) image processor made
 * from the same committed files (tools/golden/vl_image_golden.py, tests/golden/<case>/e2e/):
 * the checkpoint's preprocessor_config.json is read, each PNG / JPEG decoded with the Debian
 * libraries, preprocessed, and the concatenated f32 rows compared BYTE FOR BYTE with
 * pixel_values_fast.f32, and each grid_thw with HF's image_grid_thw (spec
 * qwen3-vl-preprocessing.md §2–§7). The slow (PIL) processor's values are recorded beside them
 * but are not a goal (§5.4); the test reports how far they are from ours. */
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

#include "runtime/base/status.h"
#include "runtime/vision/image.h"
#include "runtime/vision/preprocess.h"
#include "tests/test_util.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void check_case(const char *name) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden"));
    snprintf(path, sizeof path, "%s/%s/preprocessor_config.json", dir, name);
    struct vision_preproc_config cfg;
    assert_int_equal(vision_preproc_config_load(&cfg, path), 0);

    size_t len;
    snprintf(path, sizeof path, "%s/%s/e2e/e2e.json", dir, name);
    char *text = slurp(path, &len);
    cJSON *doc = cJSON_Parse(text);
    assert_non_null(doc);
    snprintf(path, sizeof path, "%s/%s/e2e/pixel_values_fast.f32", dir, name);
    size_t fast_len, slow_len;
    char *fast = slurp(path, &fast_len);
    snprintf(path, sizeof path, "%s/%s/e2e/pixel_values_slow.f32", dir, name);
    char *slow = slurp(path, &slow_len);
    assert_int_equal(fast_len, slow_len);

    size_t offset = 0;
    float max_slow = 0;
    const cJSON *img;
    cJSON_ArrayForEach(img, cJSON_GetObjectItem(doc, "images")) {
        const char *file = cJSON_GetObjectItem(img, "file")->valuestring;
        snprintf(path, sizeof path, "%s/%s/e2e/%s", dir, name, file);
        struct image_rgb8 rgb;
        int rc = image_decode_file(&rgb, path, NULL);
        if (rc) fail_msg("%s: %s", path, strata_last_error());
        struct vision_pixels px;
        assert_int_equal(vision_preprocess(&px, &cfg, &rgb), 0);
        const cJSON *grid = cJSON_GetObjectItem(img, "grid_thw");
        for (int k = 0; k < 3; k++)
            assert_int_equal(px.grid_thw[k], cJSON_GetArrayItem(grid, k)->valueint);
        size_t bytes = (size_t)px.num_patches * (size_t)px.row_len * sizeof(float);
        assert_true(offset + bytes <= fast_len);
        if (memcmp(fast + offset, px.pixel_values, bytes) != 0)
            fail_msg("%s %s: pixel_values differ from HF's fast processor", name, file);
        const float *s = (const float *)(const void *)(slow + offset);
        for (size_t i = 0; i < bytes / sizeof(float); i++)
            max_slow = fmaxf(max_slow, fabsf(s[i] - px.pixel_values[i]));
        printf("%s %s: %dx%d -> grid [%lld, %lld, %lld], %lld patches bit-identical to HF fast\n",
               name, file, rgb.width, rgb.height, (long long)px.grid_thw[0],
               (long long)px.grid_thw[1], (long long)px.grid_thw[2], (long long)px.num_patches);
        offset += bytes;
        vision_pixels_free(&px);
        image_rgb8_free(&rgb);
    }
    assert_int_equal(offset, fast_len); /* every image of the golden was checked */
    printf("%s: max |ours - HF slow (PIL) processor| = %g (not a goal, spec §5.4)\n", name,
           (double)max_slow);
    cJSON_Delete(doc);
    free(text);
    free(fast);
    free(slow);
}

static void test_qwen3_vl_files(void **state) {
    (void)state;
    check_case("qwen3_vl");
}

static void test_qwen3_vl_moe_files(void **state) {
    (void)state;
    check_case("qwen3_vl_moe");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_vl_files),
        cmocka_unit_test(test_qwen3_vl_moe_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
