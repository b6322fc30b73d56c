/* Format detection, options, the size check and alpha compositing shared by the decoders
 * (spec qwen3-vl-preprocessing.md §3). */
#include "runtime/vision/image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/vision/image_internal.h"

struct image_decode_options image_decode_defaults(void) {
    struct image_decode_options o = {IMAGE_ALPHA_COMPOSITE_WHITE, IMAGE_DEFAULT_MAX_PIXELS};
    return o;
}

enum image_format image_detect_format(const void *data, size_t len) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const uint8_t *p = data;
    if (p && len >= sizeof png_sig && memcmp(p, png_sig, sizeof png_sig) == 0)
        return IMAGE_FORMAT_PNG;
    /* SOI then the first marker's 0xFF, as Pillow's JpegImagePlugin._accept. */
    if (p && len >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return IMAGE_FORMAT_JPEG;
    return IMAGE_FORMAT_UNKNOWN;
}

int image_check_size(const char *format, int64_t width, int64_t height, int64_t max_pixels) {
    if (width <= 0 || height <= 0)
        return strata_set_error(STRATA_ERANGE, "%s image has a zero size (%lldx%lld)", format,
                                (long long)width, (long long)height);
    /* Sides first: a PNG side may be up to 2^32 - 1, whose square overflows int64; below
     * 2^29 per side the product fits. (Found by image_decode_fuzz.) */
    if (width > INT32_MAX / 4 || height > INT32_MAX / 4)
        return strata_set_error(STRATA_ERANGE, "%s image side too large (%lldx%lld)", format,
                                (long long)width, (long long)height);
    if (width * height > max_pixels)
        return strata_set_error(STRATA_ERANGE,
                                "%s image of %lldx%lld pixels exceeds the limit of %lld pixels "
                                "(decompression bomb?)",
                                format, (long long)width, (long long)height, (long long)max_pixels);
    return STRATA_OK;
}

int image_alloc(struct image_rgb8 *out, int width, int height) {
    out->data = malloc((size_t)width * (size_t)height * 3);
    if (!out->data)
        return strata_set_error(STRATA_ENOMEM, "out of memory for a %dx%d image", width, height);
    out->width = width;
    out->height = height;
    return STRATA_OK;
}

uint8_t image_composite_on_white(uint8_t c, uint8_t a) {
    /* Pillow ImagingAlphaComposite with an opaque white destination: blend in 7 extra bits
     * of precision, divide by 255 with SHIFTFORDIV255 (ImagingUtils.h), spec §3. */
    if (a == 0) return 255;
    uint32_t x = (uint32_t)c * a * 128u + 255u * (255u - a) * 128u + (128u << 7);
    return (uint8_t)((((x >> 8) + x) >> 8) >> 7);
}

int image_decode_memory(struct image_rgb8 *out, const void *data, size_t len,
                        const struct image_decode_options *opts) {
    if (!out) return strata_set_error(STRATA_EINVAL, "image_decode_memory: no output");
    memset(out, 0, sizeof *out);
    struct image_decode_options o = opts ? *opts : image_decode_defaults();
    if (o.max_pixels <= 0) o.max_pixels = IMAGE_DEFAULT_MAX_PIXELS;
    if (!data || len == 0) return strata_set_error(STRATA_EFORMAT, "empty image data");
    int rc;
    switch (image_detect_format(data, len)) {
    case IMAGE_FORMAT_PNG: rc = image_decode_png(out, data, len, &o); break;
    case IMAGE_FORMAT_JPEG: rc = image_decode_jpeg(out, data, len, &o); break;
    default:
        return strata_set_error(STRATA_EFORMAT,
                                "unsupported image format (not PNG or JPEG by its first bytes)");
    }
    if (rc != STRATA_OK) image_rgb8_free(out);
    return rc;
}

int image_decode_file(struct image_rgb8 *out, const char *path,
                      const struct image_decode_options *opts) {
    if (!out) return strata_set_error(STRATA_EINVAL, "image_decode_file: no output");
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t len = 0;
    int rc = cli_read_file(&buf, &len, path);
    if (rc != STRATA_OK) return rc;
    rc = image_decode_memory(out, buf, len, opts);
    free(buf);
    if (rc != STRATA_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", strata_last_error());
        return strata_set_error(rc, "%s: %s", path, msg);
    }
    return STRATA_OK;
}

void image_rgb8_free(struct image_rgb8 *img) {
    if (!img) return;
    free(img->data);
    memset(img, 0, sizeof *img);
}
