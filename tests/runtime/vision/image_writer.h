/* Test-only PNG and JPEG encoders (libpng, libjpeg-turbo) writing to memory, so decoder tests
 * build every color type and bit depth at test time instead of committing binaries. */
#ifndef STRATA_TESTS_RUNTIME_VISION_IMAGE_WRITER_H
#define STRATA_TESTS_RUNTIME_VISION_IMAGE_WRITER_H

#include <stddef.h>
#include <stdint.h>

struct png_spec {
    int width, height;
    int color_type; /* PNG_COLOR_TYPE_* */
    int bit_depth;
    int interlace;       /* 1: Adam7 */
    const uint8_t *rows; /* packed rows as libpng wants them, `stride` bytes apart */
    size_t stride;
    const uint8_t *palette_rgb; /* palette entries * 3 */
    int palette_len;
    const uint8_t *trns_alpha; /* palette alphas (trns_len of them) */
    int trns_len;
    int trns_gray;            /* >= 0: tRNS gray value (gray images) */
    const uint16_t *trns_rgb; /* tRNS RGB value (RGB images) or NULL */
    int header_only;          /* write the signature and IHDR only */
};

/* Encodes into a malloc'ed buffer; returns 0 on success. */
int write_png(uint8_t **out, size_t *len, const struct png_spec *spec);

/* Encodes `pixels` ([h][w][components] samples in `in_space`, a J_COLOR_SPACE value) as a
 * JPEG at `quality`, progressive when asked. */
int write_jpeg(uint8_t **out, size_t *len, const uint8_t *pixels, int w, int h, int components,
               int in_space, int quality, int progressive);

#endif
