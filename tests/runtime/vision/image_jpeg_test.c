/* JPEG decoding (spec qwen3-vl-preprocessing.md §3: libjpeg-turbo defaults, gray replicated,
 * Adobe CMYK through Pillow's cmyk2rgb) and malformed inputs for both formats: truncation at
 * every eighth, empty data, wrong magic, zero sizes and decompression-bomb headers. */
#include <stdio.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jpeglib.h>
#include <png.h>

#include "runtime/base/status.h"
#include "runtime/vision/image.h"
#include "tests/runtime/vision/image_writer.h"

enum { W = 64, H = 48 };

/* Four flat quadrants: red, green, blue, grey (flat 8x8 blocks survive JPEG nearly intact). */
static const uint8_t quad[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {128, 128, 128}};

static void fill_quadrants(uint8_t *rgb) {
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            memcpy(rgb + ((size_t)y * W + x) * 3, quad[(y >= H / 2) * 2 + (x >= W / 2)], 3);
}

static void expect_near(const struct image_rgb8 *img, int x, int y, const uint8_t *want, int tol) {
    const uint8_t *p = img->data + ((size_t)y * img->width + x) * 3;
    for (int c = 0; c < 3; c++)
        if (abs(p[c] - want[c]) > tol)
            fail_msg("(%d,%d) = (%d,%d,%d), want (%d,%d,%d) +-%d", x, y, p[0], p[1], p[2], want[0],
                     want[1], want[2], tol);
}

static struct image_rgb8 decode_ok(const uint8_t *buf, size_t len) {
    struct image_rgb8 img;
    if (image_decode_memory(&img, buf, len, NULL) != 0) fail_msg("%s", strata_last_error());
    return img;
}

/* Baseline and progressive YCbCr 4:2:0: right size and quadrant colors. */
static void test_jpeg_color(void **state) {
    (void)state;
    static uint8_t rgb[W * H * 3];
    fill_quadrants(rgb);
    for (int progressive = 0; progressive < 2; progressive++) {
        uint8_t *buf;
        size_t len;
        assert_int_equal(write_jpeg(&buf, &len, rgb, W, H, 3, JCS_RGB, 95, progressive), 0);
        assert_int_equal(image_detect_format(buf, len), IMAGE_FORMAT_JPEG);
        struct image_rgb8 img = decode_ok(buf, len);
        assert_int_equal(img.width, W);
        assert_int_equal(img.height, H);
        for (int q = 0; q < 4; q++)
            expect_near(&img, 8 + (q & 1) * 32, 8 + (q >> 1) * 24, quad[q], 4);
        image_rgb8_free(&img);
        free(buf);
    }
}

/* Gray JPEG replicates; Adobe CMYK is read inverted and converted as Pillow: stored
 * 255-(10,20,30,40) -> CMYK(10,20,30,40) -> RGB (207,198,190) (spec §3). */
static void test_jpeg_gray_and_cmyk(void **state) {
    (void)state;
    static uint8_t gray[W * H], cmyk[W * H * 4];
    for (int i = 0; i < W * H; i++)
        gray[i] = 77;
    for (int i = 0; i < W * H; i++)
        memcpy(cmyk + 4 * i, (const uint8_t[]){245, 235, 225, 215}, 4);
    uint8_t *buf;
    size_t len;
    assert_int_equal(write_jpeg(&buf, &len, gray, W, H, 1, JCS_GRAYSCALE, 95, 0), 0);
    struct image_rgb8 img = decode_ok(buf, len);
    expect_near(&img, 5, 5, (const uint8_t[]){77, 77, 77}, 1);
    image_rgb8_free(&img);
    free(buf);
    assert_int_equal(write_jpeg(&buf, &len, cmyk, W, H, 4, JCS_CMYK, 100, 0), 0);
    img = decode_ok(buf, len);
    expect_near(&img, 5, 5, (const uint8_t[]){207, 198, 190}, 2);
    image_rgb8_free(&img);
    free(buf);
}

/* Noise so that pixel data dominates the file and every cut lands in it. */
static void make_noise_files(uint8_t **png, size_t *png_len, uint8_t **jpg, size_t *jpg_len) {
    static uint8_t rgb[W * H * 3];
    uint32_t s = 12345;
    for (size_t i = 0; i < sizeof rgb; i++)
        rgb[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 24);
    struct png_spec p;
    memset(&p, 0, sizeof p);
    p.width = W, p.height = H, p.color_type = PNG_COLOR_TYPE_RGB, p.bit_depth = 8;
    p.rows = rgb, p.stride = W * 3, p.trns_gray = -1;
    assert_int_equal(write_png(png, png_len, &p), 0);
    assert_int_equal(write_jpeg(jpg, jpg_len, rgb, W, H, 3, JCS_RGB, 90, 0), 0);
}

static void expect_fail(const uint8_t *buf, size_t len, int want, const char *what) {
    struct image_rgb8 img = {1, 1, (uint8_t *)"x"};
    int rc = image_decode_memory(&img, buf, len, NULL);
    if (rc != want) fail_msg("%s: status %d, want %d (%s)", what, rc, want, strata_last_error());
    assert_null(img.data);
    assert_int_equal(img.width, 0);
    assert_true(strata_last_error()[0] != '\0');
}

/* Cut at every eighth of the file (0/8 = empty): an error each time, never a crash. */
static void test_truncated(void **state) {
    (void)state;
    uint8_t *png, *jpg;
    size_t png_len, jpg_len;
    make_noise_files(&png, &png_len, &jpg, &jpg_len);
    for (int k = 0; k < 8; k++) {
        char what[64];
        snprintf(what, sizeof what, "PNG cut at %d/8", k);
        expect_fail(png, png_len * k / 8, STRATA_EFORMAT, what);
        snprintf(what, sizeof what, "JPEG cut at %d/8", k);
        expect_fail(jpg, jpg_len * k / 8, STRATA_EFORMAT, what);
    }
    struct image_rgb8 img = decode_ok(png, png_len); /* the whole files decode */
    image_rgb8_free(&img);
    img = decode_ok(jpg, jpg_len);
    image_rgb8_free(&img);
    free(png);
    free(jpg);
}

/* Empty data, unknown magic, corrupted bytes, zero sizes. */
static void test_bad_inputs(void **state) {
    (void)state;
    expect_fail(NULL, 0, STRATA_EFORMAT, "NULL");
    expect_fail((const uint8_t *)"", 0, STRATA_EFORMAT, "empty");
    expect_fail((const uint8_t *)"GIF89a\1\0\1\0", 10, STRATA_EFORMAT, "GIF");
    assert_non_null(strstr(strata_last_error(), "unsupported image format"));
    expect_fail((const uint8_t *)"BM\0\0\0\0", 6, STRATA_EFORMAT, "BMP");
    expect_fail((const uint8_t *)"\x89PNG\r\n\x1a\n", 8, STRATA_EFORMAT, "PNG signature only");
    expect_fail((const uint8_t *)"\xFF\xD8\xFF", 3, STRATA_EFORMAT, "JPEG SOI only");
    uint8_t *png, *jpg;
    size_t png_len, jpg_len;
    make_noise_files(&png, &png_len, &jpg, &jpg_len);
    png[40] ^= 0xFF; /* IDAT corrupted: CRC mismatch */
    expect_fail(png, png_len, STRATA_EFORMAT, "PNG corrupted");
    png[16] = png[17] = png[18] = png[19] = 0; /* IHDR width 0 */
    expect_fail(png, png_len, STRATA_ERANGE, "PNG width 0");
    assert_non_null(strstr(strata_last_error(), "zero size"));
    size_t sof = 0;
    for (size_t i = 2; i + 9 < jpg_len && !sof; i++)
        if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) sof = i;
    assert_true(sof > 0);
    jpg[sof + 5] = jpg[sof + 6] = 0; /* height 0 */
    expect_fail(jpg, jpg_len, STRATA_EFORMAT, "JPEG height 0");
    free(png);
    free(jpg);
}

/* Headers claiming too many pixels are refused from the header, before any pixel buffer:
 * a PNG of 100000x100000 (signature + IHDR only), a JPEG SOF patched to 65000x65000, and a
 * real 64x48 file under a 100-pixel limit. */
static void test_bomb_headers(void **state) {
    (void)state;
    struct png_spec p;
    memset(&p, 0, sizeof p);
    p.width = p.height = 100000, p.color_type = PNG_COLOR_TYPE_RGB, p.bit_depth = 8;
    p.trns_gray = -1, p.header_only = 1;
    uint8_t *png, *jpg;
    size_t png_len, jpg_len;
    assert_int_equal(write_png(&png, &png_len, &p), 0);
    expect_fail(png, png_len, STRATA_ERANGE, "PNG 100000x100000");
    assert_non_null(strstr(strata_last_error(), "exceeds the limit"));
    free(png);
    make_noise_files(&png, &png_len, &jpg, &jpg_len);
    struct image_decode_options o = image_decode_defaults();
    o.max_pixels = 100;
    struct image_rgb8 img;
    assert_int_equal(image_decode_memory(&img, png, png_len, &o), STRATA_ERANGE);
    assert_int_equal(image_decode_memory(&img, jpg, jpg_len, &o), STRATA_ERANGE);
    for (size_t i = 2; i + 9 < jpg_len; i++)
        if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) {
            jpg[i + 5] = jpg[i + 7] = 0xFD, jpg[i + 6] = jpg[i + 8] = 0xE8; /* 65000 */
            break;
        }
    expect_fail(jpg, jpg_len, STRATA_ERANGE, "JPEG 65000x65000");
    assert_non_null(strstr(strata_last_error(), "exceeds the limit"));
    free(png);
    free(jpg);
}

/* image_decode_file: a real file, and a missing one naming its path. */
static void test_decode_file(void **state) {
    (void)state;
    uint8_t *png, *jpg;
    size_t png_len, jpg_len;
    make_noise_files(&png, &png_len, &jpg, &jpg_len);
    const char *dir = getenv("TEST_TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/noise.jpg", dir ? dir : "/tmp");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(jpg, 1, jpg_len, f), jpg_len);
    fclose(f);
    struct image_rgb8 img;
    assert_int_equal(image_decode_file(&img, path, NULL), 0);
    assert_int_equal(img.width, W);
    image_rgb8_free(&img);
    assert_int_equal(image_decode_file(&img, "/nonexistent/x.png", NULL), STRATA_ENOTFOUND);
    assert_null(img.data);
    free(png);
    free(jpg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jpeg_color),   cmocka_unit_test(test_jpeg_gray_and_cmyk),
        cmocka_unit_test(test_truncated),    cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_bomb_headers), cmocka_unit_test(test_decode_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
