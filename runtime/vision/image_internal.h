/* Shared between image.c and the per-format decoders (image_png.c, image_jpeg.c). */
#ifndef STRATA_RUNTIME_VISION_IMAGE_INTERNAL_H
#define STRATA_RUNTIME_VISION_IMAGE_INTERNAL_H

#include "runtime/vision/image.h"

/* Checks a header's dimensions against the limit before anything is allocated:
 * STRATA_ERANGE for a zero size or width * height > max_pixels. */
int image_check_size(const char *format, int64_t width, int64_t height, int64_t max_pixels);

/* Allocates out->data for width x height RGB u8 (sizes already checked). */
int image_alloc(struct image_rgb8 *out, int width, int height);

int image_decode_png(struct image_rgb8 *out, const uint8_t *data, size_t len,
                     const struct image_decode_options *opts);
int image_decode_jpeg(struct image_rgb8 *out, const uint8_t *data, size_t len,
                      const struct image_decode_options *opts);

#endif
