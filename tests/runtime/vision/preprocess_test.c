/* Every test vector of spec qwen3-vl-preprocessing.md §10 (smart_resize table, resampling
 * weights, pixel tests, the full 300x200 pipeline with its f64 sum and SHA-256 prefix), plus
 * §6 normalisation values and preprocessor_config.json parsing (§2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "runtime/base/status.h"
#include "runtime/vision/preprocess.h"

/* §10.3 pattern p(x,y,c) = (37x + 91y + 53c + 11((x*y) mod 7)) mod 256. */
static struct image_rgb8 pattern(int w, int h) {
    struct image_rgb8 img = {w, h, malloc((size_t)w * h * 3)};
    assert_non_null(img.data);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                img.data[((size_t)y * w + x) * 3 + c] =
                    (uint8_t)((37 * x + 91 * y + 53 * c + 11 * ((x * y) % 7)) % 256);
    return img;
}

static uint8_t px(const struct image_rgb8 *img, int x, int y, int c) {
    return img->data[((size_t)y * img->width + x) * 3 + c];
}

/* §10.1: input W x H -> resized W x H (factor 32, 65536..16777216). */
static void test_smart_resize_table(void **state) {
    (void)state;
    static const int64_t t[][4] = {
        {640, 480, 640, 480},     {1, 1, 256, 256},         {4000, 3000, 4000, 3008},
        {224, 224, 256, 256},     {32, 32, 256, 256},       {16, 16, 256, 256},
        {1920, 1080, 1920, 1088}, {1280, 720, 1280, 704},   {3840, 2160, 3840, 2176},
        {4097, 4097, 4096, 4096}, {5000, 5000, 4096, 4096}, {6000, 8000, 3520, 4704},
        {800, 600, 800, 608},     {1001, 333, 992, 320},    {300, 200, 320, 224},
        {400, 208, 384, 192},     {80, 48, 352, 224},       {200, 1, 3648, 32},
        {20000, 100, 20000, 96},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t h = -1, w = -1;
        assert_int_equal(vision_smart_resize(&h, &w, t[i][1], t[i][0], 32, 65536, 16777216), 0);
        if (w != t[i][2] || h != t[i][3])
            fail_msg("%lldx%lld -> %lldx%lld, want %lldx%lld", (long long)t[i][0],
                     (long long)t[i][1], (long long)w, (long long)h, (long long)t[i][2],
                     (long long)t[i][3]);
    }
    int64_t h, w;
    assert_int_equal(vision_smart_resize(&h, &w, 1, 201, 32, 65536, 16777216), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "aspect ratio"));
    assert_int_equal(vision_smart_resize(&h, &w, 201, 1, 32, 65536, 16777216), STRATA_EINVAL);
    /* Qwen2-VL budget (factor 28, 3136..1003520). */
    assert_int_equal(vision_smart_resize(&h, &w, 480, 640, 28, 3136, 1003520), 0);
    assert_true(w == 644 && h == 476);
    assert_int_equal(vision_smart_resize(&h, &w, 1, 1, 28, 3136, 1003520), 0);
    assert_true(w == 56 && h == 56);
    assert_int_equal(vision_smart_resize(&h, &w, 3000, 4000, 28, 3136, 1003520), 0);
    assert_true(w == 1148 && h == 840);
}

static void expect_taps(const struct vision_resample_axis *ax, int o, int xmin, const int *w,
                        int n) {
    assert_int_equal(ax->xmin[o], xmin);
    assert_int_equal(ax->xsize[o], n);
    for (int j = 0; j < n; j++)
        if (ax->weights[(size_t)o * ax->ksize + j] != w[j])
            fail_msg("out %d tap %d: %d, want %d", o, j, ax->weights[(size_t)o * ax->ksize + j],
                     w[j]);
}

/* §10.2, torch (int16) weights. */
static void test_resample_weights(void **state) {
    (void)state;
    struct vision_resample_axis ax;
    assert_int_equal(vision_resample_axis_init(&ax, 10, 4), 0);
    assert_int_equal(ax.precision, 16);
    expect_taps(&ax, 0, 0, (const int[]){23056, 27608, 15903, 1937, -2078, -891}, 6);
    static const int o1[] = {-1903, 1773, 14562, 25280, 21112, 7495, -1048, -1618, -116};
    expect_taps(&ax, 1, 0, o1, 9);
    int mirror[9];
    for (int j = 0; j < 9; j++)
        mirror[j] = o1[8 - j];
    expect_taps(&ax, 2, 1, mirror, 9);
    vision_resample_axis_free(&ax);

    assert_int_equal(vision_resample_axis_init(&ax, 4, 10), 0);
    assert_int_equal(ax.precision, 14);
    expect_taps(&ax, 0, 0, (const int[]){18007, -1623}, 2);
    expect_taps(&ax, 1, 0, (const int[]){15376, 1079, -71}, 3);
    expect_taps(&ax, 2, 0, (const int[]){8674, 8674, -964}, 3);
    vision_resample_axis_free(&ax);

    assert_int_equal(vision_resample_axis_init(&ax, 640, 448), 0);
    assert_int_equal(ax.precision, 15);
    expect_taps(&ax, 0, 0, (const int[]){22684, 11794, -1681, -28}, 4);
    vision_resample_axis_free(&ax);

    /* §5.2 precision examples: 3000->3008 14, 4000->1000 16, 2000->32 20. */
    static const int p[][3] = {{3000, 3008, 14}, {4000, 1000, 16}, {2000, 32, 20}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(vision_resample_axis_init(&ax, p[i][0], p[i][1]), 0);
        assert_int_equal(ax.precision, p[i][2]);
        vision_resample_axis_free(&ax);
    }
}

/* §10.3: 9x7 -> 4x3 R and G planes. */
static void test_pixels_9x7_to_4x3(void **state) {
    (void)state;
    static const int R[3][4] = {{101, 130, 133, 115}, {131, 120, 127, 125}, {110, 121, 151, 108}};
    static const int G[3][4] = {{131, 136, 139, 116}, {156, 140, 95, 141}, {169, 149, 139, 170}};
    struct image_rgb8 in = pattern(9, 7), out;
    assert_int_equal(vision_resize_bicubic_aa(&out, &in, 4, 3), 0);
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 4; x++) {
            assert_int_equal(px(&out, x, y, 0), R[y][x]);
            assert_int_equal(px(&out, x, y, 1), G[y][x]);
        }
    image_rgb8_free(&in);
    image_rgb8_free(&out);
}

/* §10.3: 9x7 -> 12x10 R rows 0 and 9; 5x5 -> 4x8 torch's G at (y=1, x=0). */
static void test_pixels_upscale(void **state) {
    (void)state;
    static const int row0[12] = {0, 15, 45, 72, 98, 136, 170, 198, 237, 76, 0, 36};
    static const int row9[12] = {18, 97, 160, 173, 194, 210, 240, 226, 20, 0, 73, 152};
    struct image_rgb8 in = pattern(9, 7), out;
    assert_int_equal(vision_resize_bicubic_aa(&out, &in, 12, 10), 0);
    for (int x = 0; x < 12; x++) {
        assert_int_equal(px(&out, x, 0, 0), row0[x]);
        assert_int_equal(px(&out, x, 9, 0), row9[x]);
    }
    image_rgb8_free(&in);
    image_rgb8_free(&out);
    in = pattern(5, 5);
    assert_int_equal(vision_resize_bicubic_aa(&out, &in, 4, 8), 0);
    assert_int_equal(px(&out, 0, 1, 1), 92); /* PIL gives 93 */
    image_rgb8_free(&in);
    image_rgb8_free(&out);
}

/* Same size is a copy. */
static void test_resize_identity(void **state) {
    (void)state;
    struct image_rgb8 in = pattern(33, 17), out;
    assert_int_equal(vision_resize_bicubic_aa(&out, &in, 33, 17), 0);
    assert_memory_equal(out.data, in.data, (size_t)33 * 17 * 3);
    image_rgb8_free(&out);
    image_rgb8_free(&in);
}

static void expect_f32(const float *got, const double *want, int n) {
    for (int i = 0; i < n; i++)
        if (got[i] != (float)want[i])
            fail_msg("value %d: %.17g, want %.17g", i, (double)got[i], want[i]);
}

/* §10.3 full pipeline: pattern 300x200 -> 320x224, grid [1,14,20], pixel_values 280x1536. */
static void test_full_pipeline_300x200(void **state) {
    (void)state;
    struct image_rgb8 img = pattern(300, 200), rs;
    assert_int_equal(vision_resize_bicubic_aa(&rs, &img, 320, 224), 0);
    static const int r0[8] = {0, 30, 65, 100, 140, 175, 228, 104};
    static const int b223[8] = {136, 173, 196, 197, 30, 44, 111, 107};
    for (int x = 0; x < 8; x++) {
        assert_int_equal(px(&rs, x, 0, 0), r0[x]);
        assert_int_equal(px(&rs, 312 + x, 223, 2), b223[x]);
    }
    image_rgb8_free(&rs);

    struct vision_preproc_config cfg = vision_preproc_defaults();
    struct vision_pixels pv;
    assert_int_equal(vision_preprocess(&pv, &cfg, &img), 0);
    assert_int_equal(pv.grid_thw[0], 1);
    assert_int_equal(pv.grid_thw[1], 14);
    assert_int_equal(pv.grid_thw[2], 20);
    assert_int_equal(pv.num_patches, 280);
    assert_int_equal(pv.row_len, 1536);
    assert_int_equal(vision_image_tokens(pv.grid_thw, cfg.merge_size), 70);
    const float *v = pv.pixel_values;
    expect_f32(v,
               (const double[]){-1.0, -0.7647058963775635, -0.4901960790157318,
                                -0.21568627655506134, 0.09803921729326248, 0.37254902720451355},
               6);
    assert_memory_equal(v + 256, v, 3 * sizeof(float)); /* temporal copy */
    expect_f32(v + 1536,
               (const double[]){-0.6941176652908325, -0.41960784792900085, -0.15294118225574493},
               3);
    expect_f32(v + 2 * 1536,
               (const double[]){0.772549033164978, -0.545098066329956, -0.32549020648002625}, 3);
    size_t n = (size_t)pv.num_patches * pv.row_len;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    assert_true(sum > 86.1803964078 - 1e-6 && sum < 86.1803964078 + 1e-6);
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)v, n * sizeof(float), md); /* x86: f32 little endian */
    static const unsigned char want[8] = {0xde, 0x7b, 0x26, 0xe6, 0xc5, 0xb8, 0x69, 0x39};
    assert_memory_equal(md, want, 8);
    vision_pixels_free(&pv);
    image_rgb8_free(&img);
}

/* §6 examples: x=0 -> -1, 1 -> 0xBF7DFDFE, 127/128 -> -/+0.003921568859, 255 -> 1. */
static void test_normalise_values(void **state) {
    (void)state;
    struct image_rgb8 img = {32, 32, calloc(32 * 32 * 3, 1)};
    static const uint8_t xs[5] = {0, 1, 127, 128, 255};
    for (int i = 0; i < 5; i++)
        img.data[i * 3] = xs[i];
    struct vision_preproc_config cfg = vision_preproc_defaults();
    cfg.do_resize = 0;
    struct vision_pixels pv;
    assert_int_equal(vision_preprocess(&pv, &cfg, &img), 0);
    assert_int_equal(pv.num_patches, 4);
    const float *v = pv.pixel_values;
    assert_true(v[0] == -1.0f && v[4] == 1.0f);
    uint32_t bits;
    memcpy(&bits, &v[1], 4);
    assert_int_equal(bits, 0xBF7DFDFEu);
    assert_true(v[2] == (float)-0.003921568859 && v[3] == (float)0.003921568859);
    vision_pixels_free(&pv);
    img.width = 48; /* not a multiple of 32 without resizing */
    assert_int_equal(vision_preprocess(&pv, &cfg, &img), STRATA_EINVAL);
    image_rgb8_free(&img);
}

/* Aspect ratio over 200 is refused at preprocessing, as HF. */
static void test_preprocess_aspect_error(void **state) {
    (void)state;
    struct image_rgb8 img = pattern(201, 1);
    struct vision_preproc_config cfg = vision_preproc_defaults();
    struct vision_pixels pv;
    assert_int_equal(vision_preprocess(&pv, &cfg, &img), STRATA_EINVAL);
    assert_null(pv.pixel_values);
    image_rgb8_free(&img);
}

static int parse(struct vision_preproc_config *c, const char *json) {
    return vision_preproc_config_parse(c, json, strlen(json));
}

/* §2: both generations of the file, defaults, and refusals naming the field. */
static void test_config_parse(void **state) {
    (void)state;
    struct vision_preproc_config c;
    assert_int_equal(parse(&c, "{\"size\":{\"shortest_edge\":65536,\"longest_edge\":16777216},"
                               "\"patch_size\":16,\"temporal_patch_size\":2,\"merge_size\":2,"
                               "\"image_mean\":[0.5,0.5,0.5],\"image_std\":[0.5,0.5,0.5],"
                               "\"image_processor_type\":\"Qwen2VLImageProcessorFast\"}"),
                     0);
    assert_int_equal(c.min_pixels, 65536);
    assert_int_equal(c.max_pixels, 16777216);
    assert_int_equal(c.patch_size, 16);
    assert_true(c.image_mean[2] == 0.5f && c.image_std[0] == 0.5f);
    /* 4.5x-era: top-level min/max_pixels overwrite size. */
    assert_int_equal(parse(&c, "{\"min_pixels\":3136,\"max_pixels\":12845056,\"patch_size\":14,"
                               "\"size\":{\"shortest_edge\":1,\"longest_edge\":2},"
                               "\"image_mean\":[0.48145466,0.4578275,0.40821073]}"),
                     0);
    assert_int_equal(c.min_pixels, 3136);
    assert_int_equal(c.max_pixels, 12845056);
    assert_int_equal(c.patch_size, 14);
    assert_true(c.image_mean[0] == 0.48145466f);
    assert_int_equal(parse(&c, "{}"), 0);
    assert_int_equal(c.min_pixels, 65536);
    assert_int_equal(c.merge_size, 2);
    assert_true(c.rescale_factor == 1.0 / 255.0 && c.do_normalize == 1);
    assert_int_equal(parse(&c, "{\"size\":{\"longest_edge\":100}}"), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "shortest_edge"));
    assert_int_equal(parse(&c, "{\"patch_size\":0}"), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "patch_size"));
    assert_int_equal(parse(&c, "{\"resample\":2}"), STRATA_EFORMAT);
    assert_int_equal(parse(&c, "{\"image_std\":[0.5,0,0.5]}"), STRATA_EFORMAT);
    assert_int_equal(parse(&c, "{\"do_resize\":1}"), STRATA_EFORMAT);
    assert_int_equal(parse(&c, "[1]"), STRATA_EFORMAT);
    assert_int_equal(parse(&c, "{\"size\":"), STRATA_EFORMAT);
    assert_int_equal(parse(&c, "{\"min_pixels\":10,\"max_pixels\":5}"), STRATA_EFORMAT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smart_resize_table), cmocka_unit_test(test_resample_weights),
        cmocka_unit_test(test_pixels_9x7_to_4x3),  cmocka_unit_test(test_pixels_upscale),
        cmocka_unit_test(test_resize_identity),    cmocka_unit_test(test_full_pipeline_300x200),
        cmocka_unit_test(test_normalise_values),   cmocka_unit_test(test_preprocess_aspect_error),
        cmocka_unit_test(test_config_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
