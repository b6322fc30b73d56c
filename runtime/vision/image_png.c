/* PNG -> RGB u8 with libpng 1.6, matching Pillow's PngImagePlugin + convert("RGB") (spec
 * qwen3-vl-preprocessing.md §3). libpng reports errors through png_error -> our handler ->
 * png_longjmp back into png_decode_body, which turns them into a status; nothing prints. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/vision/image_internal.h"

struct png_ctx {
    png_structp png;
    png_infop info;
    const uint8_t *data;
    size_t len, pos;
    uint8_t *raw;    /* decoded rows after libpng's transforms */
    png_bytep *rows; /* row pointers into raw */
    char msg[256];
};

static void png_on_error(png_structp png, png_const_charp msg) {
    struct png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "libpng error");
    png_longjmp(png, 1);
}

/* Warnings (bad ancillary CRCs, odd iCCP) do not stop Pillow either: ignored, never printed. */
static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void png_on_read(png_structp png, png_bytep out, size_t n) {
    struct png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos) png_error(png, "truncated PNG data");
    memcpy(out, c->data + c->pos, n);
    c->pos += n;
}

/* Transforms to 8-bit gray / gray+alpha / RGB / RGBA, except 16-bit gray which stays 16-bit
 * so it can be clipped as Pillow's I;16 -> RGB conversion does (spec §3). Returns 1 when the
 * rows stay 16-bit. */
static int png_set_transforms(struct png_ctx *c, const struct image_decode_options *opts) {
    int ct = png_get_color_type(c->png, c->info);
    int bd = png_get_bit_depth(c->png, c->info);
    int gray16 = (ct == PNG_COLOR_TYPE_GRAY && bd == 16);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(c->png);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(c->png);
    /* tRNS is alpha for Pillow (info["transparency"] -> convert("RGBA"), spec §3). */
    if (png_get_valid(c->png, c->info, PNG_INFO_tRNS) && opts->alpha == IMAGE_ALPHA_COMPOSITE_WHITE)
        png_set_tRNS_to_alpha(c->png);
    /* Pillow unpacks 16-bit RGB(A)/LA with the high byte ("RGB;16B"): libpng's strip_16 chops
     * the low byte (png_set_scale_16 would round instead). */
    if (bd == 16 && !gray16) png_set_strip_16(c->png);
    png_set_interlace_handling(c->png);
    png_read_update_info(c->png, c->info);
    return gray16;
}

static uint8_t png_sample(const uint8_t *p, int wide) {
    if (!wide) return p[0];
    unsigned v = ((unsigned)p[0] << 8) | p[1];
    return v > 255 ? 255 : (uint8_t)v; /* I;16 -> L clips, spec §3 */
}

static void png_rows_to_rgb(struct image_rgb8 *out, const struct png_ctx *c, int channels, int wide,
                            enum image_alpha_mode alpha) {
    size_t rowbytes = png_get_rowbytes(c->png, c->info);
    int bps = wide ? 2 : 1;
    int composite = (alpha == IMAGE_ALPHA_COMPOSITE_WHITE) && (channels == 2 || channels == 4);
    for (int y = 0; y < out->height; y++) {
        const uint8_t *r = c->raw + (size_t)y * rowbytes;
        uint8_t *o = out->data + (size_t)y * out->width * 3;
        for (int x = 0; x < out->width; x++, r += channels * bps, o += 3) {
            uint8_t rgb[3];
            if (channels <= 2) {
                rgb[0] = rgb[1] = rgb[2] = png_sample(r, wide);
            } else {
                rgb[0] = r[0], rgb[1] = r[1], rgb[2] = r[2];
            }
            if (composite) {
                uint8_t a = r[(channels - 1) * bps]; /* high byte of a 16-bit alpha */
                for (int k = 0; k < 3; k++)
                    rgb[k] = image_composite_on_white(rgb[k], a);
            }
            memcpy(o, rgb, 3);
        }
    }
}

/* Refuses a header whose raw size cannot come out of this many bytes (deflate expands at
 * most 1032:1), so a small truncated file never allocates a huge row buffer. */
static int png_check_data_size(const struct png_ctx *c, uint32_t w, uint32_t h, int ch, int bd) {
    double raw = (double)h * (1.0 + ((double)w * ch * bd + 7.0) / 8.0);
    if (raw > 1040.0 * (double)c->len + 65536.0)
        return strata_set_error(STRATA_EFORMAT,
                                "PNG: %ux%u image needs more data than the %zu "
                                "bytes given (truncated?)",
                                w, h, c->len);
    return STRATA_OK;
}

static int png_decode_body(struct png_ctx *c, struct image_rgb8 *out,
                           const struct image_decode_options *opts) {
    if (setjmp(png_jmpbuf(c->png)))
        return strata_set_error(STRATA_EFORMAT, "PNG: %s", c->msg[0] ? c->msg : "decode failed");
    png_set_read_fn(c->png, c, png_on_read);
    /* libpng's default 1e6 limit per side is stricter than Pillow; the pixel limit rules. */
    png_set_user_limits(c->png, 0x7fffffff, 0x7fffffff);
    png_read_info(c->png, c->info);
    uint32_t w = png_get_image_width(c->png, c->info);
    uint32_t h = png_get_image_height(c->png, c->info);
    int rc = image_check_size("PNG", w, h, opts->max_pixels);
    if (rc == STRATA_OK)
        rc = png_check_data_size(c, w, h, png_get_channels(c->png, c->info),
                                 png_get_bit_depth(c->png, c->info));
    if (rc != STRATA_OK) return rc;
    int wide = png_set_transforms(c, opts);
    int channels = png_get_channels(c->png, c->info);
    size_t rowbytes = png_get_rowbytes(c->png, c->info);
    c->raw = malloc(rowbytes * h);
    c->rows = malloc(sizeof(png_bytep) * h);
    if (!c->raw || !c->rows)
        return strata_set_error(STRATA_ENOMEM, "PNG: out of memory for %ux%u", w, h);
    for (uint32_t y = 0; y < h; y++)
        c->rows[y] = c->raw + (size_t)y * rowbytes;
    png_read_image(c->png, c->rows);
    /* Chunks after the image data (IEND included) are not read: Pillow's load_end tolerates
     * their absence too, and every pixel is already decoded. */
    rc = image_alloc(out, (int)w, (int)h);
    if (rc != STRATA_OK) return rc;
    png_rows_to_rgb(out, c, channels, wide, opts->alpha);
    return STRATA_OK;
}

/* The size check straight from IHDR's bytes (signature, length, "IHDR", width, height, all
 * big-endian), before libpng allocates anything or wants data beyond the header. */
static int png_precheck_ihdr(const uint8_t *d, size_t len, int64_t max_pixels) {
    if (len < 24 || memcmp(d + 12, "IHDR", 4) != 0) return STRATA_OK; /* libpng will refuse */
    int64_t w = ((int64_t)d[16] << 24) | (d[17] << 16) | (d[18] << 8) | d[19];
    int64_t h = ((int64_t)d[20] << 24) | (d[21] << 16) | (d[22] << 8) | d[23];
    return image_check_size("PNG", w, h, max_pixels);
}

int image_decode_png(struct image_rgb8 *out, const uint8_t *data, size_t len,
                     const struct image_decode_options *opts) {
    int pre = png_precheck_ihdr(data, len, opts->max_pixels);
    if (pre != STRATA_OK) return pre;
    /* On the heap: members written after setjmp must not live in a (possibly) register-held
     * automatic object when png_longjmp returns (C11 7.13.2.1). */
    struct png_ctx *c = calloc(1, sizeof *c);
    if (!c) return strata_set_error(STRATA_ENOMEM, "PNG: out of memory");
    c->data = data;
    c->len = len;
    int rc = STRATA_ENOMEM;
    c->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
    if (c->png) c->info = png_create_info_struct(c->png);
    if (c->png && c->info)
        rc = png_decode_body(c, out, opts);
    else
        strata_set_error(STRATA_ENOMEM, "PNG: cannot create the libpng decoder");
    png_destroy_read_struct(c->png ? &c->png : NULL, c->info ? &c->info : NULL, NULL);
    free(c->raw);
    free(c->rows);
    free(c);
    return rc;
}
