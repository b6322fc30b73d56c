#include "tests/runtime/vision/image_writer.h"

#include <stdio.h>

#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

struct membuf {
    uint8_t *data;
    size_t len, cap;
};

static void on_write(png_structp png, png_bytep data, size_t n) {
    struct membuf *b = png_get_io_ptr(png);
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p) png_error(png, "oom");
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void on_flush(png_structp png) {
    (void)png;
}

static void set_chunks(png_structp png, png_infop info, const struct png_spec *s) {
    png_set_IHDR(png, info, (png_uint_32)s->width, (png_uint_32)s->height, s->bit_depth,
                 s->color_type, s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->palette_rgb) {
        png_color pal[256];
        for (int i = 0; i < s->palette_len; i++) {
            pal[i].red = s->palette_rgb[3 * i];
            pal[i].green = s->palette_rgb[3 * i + 1];
            pal[i].blue = s->palette_rgb[3 * i + 2];
        }
        png_set_PLTE(png, info, pal, s->palette_len);
    }
    if (s->trns_alpha) png_set_tRNS(png, info, s->trns_alpha, s->trns_len, NULL);
    if (s->trns_gray >= 0 || s->trns_rgb) {
        png_color_16 c;
        memset(&c, 0, sizeof c);
        if (s->trns_gray >= 0) c.gray = (png_uint_16)s->trns_gray;
        if (s->trns_rgb) c.red = s->trns_rgb[0], c.green = s->trns_rgb[1], c.blue = s->trns_rgb[2];
        png_set_tRNS(png, info, NULL, 0, &c);
    }
}

int write_png(uint8_t **out, size_t *len, const struct png_spec *s) {
    struct membuf b = {NULL, 0, 0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *rows = calloc((size_t)s->height + 1, sizeof *rows);
    if (!png || !info || !rows || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        free(b.data);
        return -1;
    }
    png_set_write_fn(png, &b, on_write, on_flush);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    set_chunks(png, info, s);
    png_write_info(png, info);
    if (!s->header_only) {
        for (int y = 0; y < s->height; y++)
            rows[y] = (png_bytep)s->rows + (size_t)y * s->stride;
        png_write_image(png, rows);
        png_write_end(png, info);
    }
    png_destroy_write_struct(&png, &info);
    free(rows);
    *out = b.data;
    *len = b.len;
    return 0;
}

int write_jpeg(uint8_t **out, size_t *len, const uint8_t *pixels, int w, int h, int components,
               int in_space, int quality, int progressive) {
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr err;
    ci.err = jpeg_std_error(&err); /* tests only: libjpeg's default exit() on error is fine */
    jpeg_create_compress(&ci);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&ci, &buf, &n);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = components;
    ci.in_color_space = (J_COLOR_SPACE)in_space;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    if (progressive) jpeg_simple_progression(&ci);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)ci.next_scanline * w * components);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    *out = buf;
    *len = n;
    return 0;
}
