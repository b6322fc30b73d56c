/* Image decoding: PNG (libpng) and JPEG (libjpeg-turbo) to RGB u8, as Pillow hands an image
 * to transformers' Qwen3-VL image processor (spec qwen3-vl-preprocessing.md §3).
 *
 * What the pixels are, per source (Pillow 13 `convert("RGB")` semantics, spec §3):
 *   - PNG gray 1/2/4/8-bit: replicated to R=G=B (low bit depths scaled to 0..255);
 *     16-bit gray is CLIPPED (v > 255 -> 255), as Pillow's I;16 -> RGB conversion does;
 *   - PNG 16-bit RGB / RGBA / gray+alpha: the HIGH byte of each sample;
 *   - PNG palette: palette lookup; tRNS (palette, gray or RGB) counts as alpha;
 *   - alpha: by default composited onto opaque white exactly as transformers 5.x
 *     `convert_to_rgb` does (Pillow `alpha_composite` integer formula, spec §3);
 *     `IMAGE_ALPHA_DROP` instead drops it as transformers 4.57 (`img.convert("RGB")`);
 *   - JPEG: libjpeg-turbo with its defaults (JDCT_ISLOW, fancy upsampling), as Pillow
 *     decodes; gray JPEGs replicate; CMYK/YCCK JPEGs are read as Adobe-inverted CMYK (Pillow's
 *     "CMYK;I") and converted with Pillow's cmyk2rgb.
 * EXIF orientation is NOT applied: transformers does not transpose a PIL.Image it is given
 * (spec §3); only its string/URL loaders do.
 *
 * Failures never crash and never print: unreadable or truncated data, zero-sized images,
 * unknown formats (by magic bytes) and images over the pixel limit (checked from the header,
 * before any pixel buffer is allocated) return a negative STRATA_E* status with a message in
 * strata_last_error(). The aspect-ratio limit (200) is checked by preprocessing, as HF. */
#ifndef STRATA_RUNTIME_VISION_IMAGE_H
#define STRATA_RUNTIME_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Pillow's decompression-bomb error threshold: 2 * Image.MAX_IMAGE_PIXELS (89478485). */
#define IMAGE_DEFAULT_MAX_PIXELS 178956970LL

/* A decoded image: `data` is [height][width][3] RGB u8, row-major, malloc'ed. */
struct image_rgb8 {
    int width;
    int height;
    uint8_t *data;
};

enum image_alpha_mode {
    IMAGE_ALPHA_COMPOSITE_WHITE = 0, /* transformers 5.x (default) */
    IMAGE_ALPHA_DROP = 1             /* transformers 4.57 */
};

enum image_format { IMAGE_FORMAT_UNKNOWN = 0, IMAGE_FORMAT_PNG = 1, IMAGE_FORMAT_JPEG = 2 };

struct image_decode_options {
    enum image_alpha_mode alpha;
    int64_t max_pixels; /* width * height above this is refused; <= 0 means the default */
};

/* Default options: composite onto white, IMAGE_DEFAULT_MAX_PIXELS. */
struct image_decode_options image_decode_defaults(void);

/* The format named by the first bytes (PNG signature, JPEG SOI marker). */
enum image_format image_detect_format(const void *data, size_t len);

/* Decodes a PNG or JPEG held in memory into *out (zeroed on failure). `opts` may be NULL
 * for the defaults. STRATA_EFORMAT: unknown format, malformed or truncated data (a JPEG
 * with a zero size too: libjpeg refuses it as malformed); STRATA_ERANGE: a zero-sized PNG or
 * an image over the pixel limit (from the header, before decoding); STRATA_ENOMEM. */
int image_decode_memory(struct image_rgb8 *out, const void *data, size_t len,
                        const struct image_decode_options *opts);

/* image_decode_memory on the whole file at `path` (STRATA_ENOTFOUND / STRATA_EIO too). */
int image_decode_file(struct image_rgb8 *out, const char *path,
                      const struct image_decode_options *opts);

/* Frees the pixels and zeroes *img; NULL and zeroed images are fine. */
void image_rgb8_free(struct image_rgb8 *img);

/* Pillow's `alpha_composite(white, RGBA)` for one channel value `c` with alpha `a`
 * (src/libImaging/AlphaComposite.c; closed form of spec §3). */
uint8_t image_composite_on_white(uint8_t c, uint8_t a);

#endif
