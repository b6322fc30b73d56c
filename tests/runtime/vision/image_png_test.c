/* PNG decoding (spec qwen3-vl-preprocessing.md §3) on files encoded at test time: every PNG
 * color type and bit depth, tRNS, alpha compositing onto white (and the 4.57 drop), Adam7.
 * JPEG and malformed inputs: image_jpeg_test.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <png.h>

#include "runtime/base/status.h"
#include "runtime/vision/image.h"
#include "tests/runtime/vision/image_writer.h"

static struct png_spec spec(int w, int h, int ct, int bd, const uint8_t *rows, size_t stride) {
    struct png_spec s;
    memset(&s, 0, sizeof s);
    s.width = w, s.height = h, s.color_type = ct, s.bit_depth = bd;
    s.rows = rows, s.stride = stride, s.trns_gray = -1;
    return s;
}

/* Encodes, decodes with `alpha`, checks the size and returns the image. */
static struct image_rgb8 roundtrip(const struct png_spec *s, enum image_alpha_mode alpha) {
    uint8_t *buf;
    size_t len;
    assert_int_equal(write_png(&buf, &len, s), 0);
    struct image_decode_options o = image_decode_defaults();
    o.alpha = alpha;
    struct image_rgb8 img;
    int rc = image_decode_memory(&img, buf, len, &o);
    if (rc != 0) fail_msg("decode: %s", strata_last_error());
    free(buf);
    assert_int_equal(img.width, s->width);
    assert_int_equal(img.height, s->height);
    return img;
}

static void expect_rgb(const struct image_rgb8 *img, int x, int y, int r, int g, int b) {
    const uint8_t *p = img->data + ((size_t)y * img->width + x) * 3;
    if (p[0] != r || p[1] != g || p[2] != b)
        fail_msg("(%d,%d) = (%d,%d,%d), want (%d,%d,%d)", x, y, p[0], p[1], p[2], r, g, b);
}

/* Pillow's general alpha_composite (AlphaComposite.c) with an opaque white destination:
 * an independent check of the closed form the decoder uses (spec §3). */
static int pillow_composite(int c, int a) {
    uint32_t blend = 255u * (255u - (uint32_t)a);
    uint32_t outa255 = (uint32_t)a * 255u + blend;
    if (outa255 == 0) return 0;
    uint32_t coef1 = (uint32_t)a * 255u * 255u * 128u / outa255;
    uint32_t coef2 = 255u * 128u - coef1;
    uint32_t t = (uint32_t)c * coef1 + 255u * coef2 + (0x80u << 7);
    return (int)((((t >> 8) + t) >> 8) >> 7);
}

static void test_composite_formula(void **state) {
    (void)state;
    for (int a = 0; a < 256; a++)
        for (int c = 0; c < 256; c++) {
            int want = a == 0 ? 255 : pillow_composite(c, a);
            if (image_composite_on_white((uint8_t)c, (uint8_t)a) != want)
                fail_msg("c=%d a=%d: %d want %d", c, a, image_composite_on_white(c, a), want);
        }
    assert_int_equal(image_composite_on_white(0, 128), 127);
    assert_int_equal(image_composite_on_white(77, 255), 77);
}

/* Gray 1/2/4/8 bits: scaled to 0..255 and replicated; 16 bits: clipped (Pillow I;16). */
static void test_png_gray_depths(void **state) {
    (void)state;
    static const struct {
        int bd;
        uint8_t row[4];
        int want[4];
    } t[] = {
        {1, {0x50}, {0, 255, 0, 255}},        /* 0101 */
        {2, {0x1B}, {0, 85, 170, 255}},       /* 00 01 10 11 */
        {4, {0x0F, 0x73}, {0, 255, 119, 51}}, /* 0 15 7 3 */
        {8, {0, 9, 200, 255}, {0, 9, 200, 255}},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct png_spec s = spec(4, 1, PNG_COLOR_TYPE_GRAY, t[i].bd, t[i].row, 4);
        struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
        for (int x = 0; x < 4; x++)
            expect_rgb(&img, x, 0, t[i].want[x], t[i].want[x], t[i].want[x]);
        image_rgb8_free(&img);
    }
    static const uint8_t g16[8] = {0x00, 0x64, 0x00, 0xFF, 0x01, 0x00, 0x12, 0x34};
    struct png_spec s = spec(4, 1, PNG_COLOR_TYPE_GRAY, 16, g16, 8);
    struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 100, 100, 100);
    expect_rgb(&img, 1, 0, 255, 255, 255);
    expect_rgb(&img, 2, 0, 255, 255, 255);
    expect_rgb(&img, 3, 0, 255, 255, 255);
    image_rgb8_free(&img);
}

/* RGB 8 and 16 bits (16: the high byte, Pillow "RGB;16B"). */
static void test_png_rgb(void **state) {
    (void)state;
    static const uint8_t rgb8[6] = {1, 2, 3, 250, 128, 0};
    struct png_spec s = spec(2, 1, PNG_COLOR_TYPE_RGB, 8, rgb8, 6);
    struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 1, 2, 3);
    expect_rgb(&img, 1, 0, 250, 128, 0);
    image_rgb8_free(&img);
    static const uint8_t rgb16[6] = {0x12, 0xFF, 0xAB, 0x01, 0x00, 0x80};
    s = spec(1, 1, PNG_COLOR_TYPE_RGB, 16, rgb16, 6);
    img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 0x12, 0xAB, 0x00);
    image_rgb8_free(&img);
}

/* Gray+alpha and RGBA, 8 and 16 bits: composited onto white (v5) or dropped (v4.57). */
static void test_png_alpha(void **state) {
    (void)state;
    static const uint8_t ga8[6] = {200, 128, 10, 0, 33, 255};
    struct png_spec s = spec(3, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga8, 6);
    struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    int c = image_composite_on_white(200, 128);
    expect_rgb(&img, 0, 0, c, c, c);
    expect_rgb(&img, 1, 0, 255, 255, 255);
    expect_rgb(&img, 2, 0, 33, 33, 33);
    image_rgb8_free(&img);
    img = roundtrip(&s, IMAGE_ALPHA_DROP);
    expect_rgb(&img, 0, 0, 200, 200, 200);
    expect_rgb(&img, 1, 0, 10, 10, 10);
    image_rgb8_free(&img);

    static const uint8_t ga16[4] = {0xC8, 0x01, 0x80, 0xFF}; /* gray 200.x, alpha 128.x */
    s = spec(1, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16, ga16, 4);
    img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, c, c, c);
    image_rgb8_free(&img);

    static const uint8_t rgba8[8] = {0, 100, 255, 64, 9, 8, 7, 255};
    s = spec(2, 1, PNG_COLOR_TYPE_RGBA, 8, rgba8, 8);
    img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, image_composite_on_white(0, 64), image_composite_on_white(100, 64), 255);
    expect_rgb(&img, 1, 0, 9, 8, 7);
    image_rgb8_free(&img);
    img = roundtrip(&s, IMAGE_ALPHA_DROP);
    expect_rgb(&img, 0, 0, 0, 100, 255);
    image_rgb8_free(&img);

    static const uint8_t rgba16[8] = {0x10, 0, 0x20, 0, 0x30, 0, 0x00, 0x40};
    s = spec(1, 1, PNG_COLOR_TYPE_RGBA, 16, rgba16, 8); /* alpha high byte 0 -> white */
    img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 255, 255, 255);
    image_rgb8_free(&img);
}

/* Palette 1/2/4/8 bits with tRNS: lookup, transparent entries composited. */
static void test_png_palette(void **state) {
    (void)state;
    static const uint8_t pal[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
    static const uint8_t alpha[3] = {255, 0, 128};
    static const struct {
        int bd;
        uint8_t row[4];
        int n;
    } t[] = {{1, {0x40}, 2}, {2, {0x1B}, 4}, {4, {0x01, 0x23}, 4}, {8, {0, 1, 2, 3}, 4}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct png_spec s = spec(t[i].n, 1, PNG_COLOR_TYPE_PALETTE, t[i].bd, t[i].row, 4);
        s.palette_rgb = pal, s.palette_len = t[i].n, s.trns_alpha = alpha;
        s.trns_len = t[i].n < 3 ? t[i].n : 3;
        struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
        expect_rgb(&img, 0, 0, 255, 0, 0);
        expect_rgb(&img, 1, 0, 255, 255, 255); /* alpha 0 */
        if (t[i].n > 2) {
            int h = image_composite_on_white(0, 128);
            expect_rgb(&img, 2, 0, h, h, 255);
            expect_rgb(&img, 3, 0, 10, 20, 30); /* beyond tRNS: opaque */
        }
        image_rgb8_free(&img);
        img = roundtrip(&s, IMAGE_ALPHA_DROP);
        expect_rgb(&img, 1, 0, 0, 255, 0);
        image_rgb8_free(&img);
    }
}

/* tRNS on gray and RGB images: the matching value becomes transparent (white). */
static void test_png_trns_color_key(void **state) {
    (void)state;
    static const uint8_t g[3] = {50, 51, 49};
    struct png_spec s = spec(3, 1, PNG_COLOR_TYPE_GRAY, 8, g, 3);
    s.trns_gray = 50;
    struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 255, 255, 255);
    expect_rgb(&img, 1, 0, 51, 51, 51);
    image_rgb8_free(&img);
    img = roundtrip(&s, IMAGE_ALPHA_DROP);
    expect_rgb(&img, 0, 0, 50, 50, 50);
    image_rgb8_free(&img);
    static const uint8_t rgb[6] = {1, 2, 3, 1, 2, 4};
    static const uint16_t key[3] = {1, 2, 3};
    s = spec(2, 1, PNG_COLOR_TYPE_RGB, 8, rgb, 6);
    s.trns_rgb = key;
    img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    expect_rgb(&img, 0, 0, 255, 255, 255);
    expect_rgb(&img, 1, 0, 1, 2, 4);
    image_rgb8_free(&img);
}

/* Adam7 interlacing decodes to the same pixels as the plain file. */
static void test_png_interlaced(void **state) {
    (void)state;
    enum { W = 37, H = 23 };
    static uint8_t rgb[W * H * 3];
    for (int i = 0; i < W * H * 3; i++)
        rgb[i] = (uint8_t)(i * 131 + (i / 7) * 17);
    struct png_spec s = spec(W, H, PNG_COLOR_TYPE_RGB, 8, rgb, W * 3);
    s.interlace = 1;
    struct image_rgb8 img = roundtrip(&s, IMAGE_ALPHA_COMPOSITE_WHITE);
    assert_memory_equal(img.data, rgb, sizeof rgb);
    image_rgb8_free(&img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_composite_formula), cmocka_unit_test(test_png_gray_depths),
        cmocka_unit_test(test_png_rgb),           cmocka_unit_test(test_png_alpha),
        cmocka_unit_test(test_png_palette),       cmocka_unit_test(test_png_trns_color_key),
        cmocka_unit_test(test_png_interlaced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
