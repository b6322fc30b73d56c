/* JPEG -> RGB u8 with libjpeg-turbo and its defaults (JDCT_ISLOW, fancy upsampling), as
 * Pillow's JpegDecode.c drives it (spec qwen3-vl-preprocessing.md §3). The error manager
 * longjmps back into jpeg_decode_body instead of exit(); messages are recorded, not printed. */
#include <stdio.h> /* jpeglib.h needs FILE and size_t first */

#include <jpeglib.h>
#include <jerror.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/vision/image_internal.h"

struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
};

struct jpeg_ctx {
    struct jpeg_decompress_struct ci;
    struct jpeg_err err;
    uint8_t *row; /* one CMYK scanline */
};

static void jpeg_on_error(j_common_ptr ci) {
    struct jpeg_err *e = (struct jpeg_err *)ci->err;
    ci->err->format_message(ci, e->msg);
    longjmp(e->jump, 1);
}

/* Warnings are counted, never printed. Running out of data is an error, though: the memory
 * source would otherwise pad with a fake EOI and return grey blocks, where Pillow raises
 * "image file is truncated". */
static void jpeg_on_message(j_common_ptr ci, int level) {
    if (level < 0 && ci->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(ci);
    if (level < 0) ci->err->num_warnings++;
}

static void jpeg_on_output(j_common_ptr ci) {
    (void)ci;
}

/* Pillow's cmyk2rgb (src/libImaging/Convert.c) on Adobe-inverted samples ("CMYK;I"). */
static void jpeg_cmyk_row_to_rgb(uint8_t *o, const uint8_t *in, int width) {
    for (int x = 0; x < width; x++, in += 4, o += 3) {
        int nk = 255 - (255 - in[3]);
        for (int k = 0; k < 3; k++) {
            int t = (255 - in[k]) * nk + 128;
            int v = nk - (((t >> 8) + t) >> 8);
            o[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

static int jpeg_decode_body(struct jpeg_ctx *c, struct image_rgb8 *out, const uint8_t *data,
                            size_t len, const struct image_decode_options *opts) {
    if (setjmp(c->err.jump))
        return strata_set_error(STRATA_EFORMAT, "JPEG: %s", c->err.msg[0] ? c->err.msg : "failed");
    jpeg_create_decompress(&c->ci);
    jpeg_mem_src(&c->ci, data, (unsigned long)len);
    jpeg_read_header(&c->ci, TRUE);
    int rc = image_check_size("JPEG", c->ci.image_width, c->ci.image_height, opts->max_pixels);
    if (rc != STRATA_OK) return rc;
    /* Pillow opens CMYK and YCCK files as CMYK (libjpeg converts YCCK -> CMYK); everything
     * else is asked for as RGB (gray is replicated, as Pillow's L -> RGB). */
    int cmyk = c->ci.jpeg_color_space == JCS_CMYK || c->ci.jpeg_color_space == JCS_YCCK;
    c->ci.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&c->ci);
    int w = (int)c->ci.output_width, h = (int)c->ci.output_height;
    rc = image_alloc(out, w, h);
    if (rc != STRATA_OK) return rc;
    if (cmyk && !(c->row = malloc((size_t)w * 4)))
        return strata_set_error(STRATA_ENOMEM, "JPEG: out of memory");
    while (c->ci.output_scanline < c->ci.output_height) {
        uint8_t *dst = out->data + (size_t)c->ci.output_scanline * w * 3;
        JSAMPROW row = cmyk ? c->row : dst;
        if (jpeg_read_scanlines(&c->ci, &row, 1) != 1)
            return strata_set_error(STRATA_EFORMAT, "JPEG: decoder stopped early");
        if (cmyk) jpeg_cmyk_row_to_rgb(dst, c->row, w);
    }
    /* jpeg_finish_decompress is not called: every scanline is in, and data after the last
     * scan (EOI included) does not change a pixel. */
    return STRATA_OK;
}

int image_decode_jpeg(struct image_rgb8 *out, const uint8_t *data, size_t len,
                      const struct image_decode_options *opts) {
    /* On the heap for the same setjmp reason as image_png.c. */
    struct jpeg_ctx *c = calloc(1, sizeof *c);
    if (!c) return strata_set_error(STRATA_ENOMEM, "JPEG: out of memory");
    c->ci.err = jpeg_std_error(&c->err.pub);
    c->err.pub.error_exit = jpeg_on_error;
    c->err.pub.emit_message = jpeg_on_message;
    c->err.pub.output_message = jpeg_on_output;
    int rc = jpeg_decode_body(c, out, data, len, opts);
    jpeg_destroy_decompress(&c->ci);
    free(c->row);
    free(c);
    return rc;
}
