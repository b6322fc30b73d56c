/* libFuzzer over the PNG and JPEG decoders and, for what decodes, the whole preprocessing
 * chain. Seeds (fuzz_corpus/image_decode): one tiny file per PNG color type / bit depth,
 * tRNS, Adam7, and baseline / progressive / gray / CMYK JPEG, written with image_writer.c.
 * The pixel limit is lowered so a forged header cannot make a run allocate gigabytes. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/vision/image.h"
#include "runtime/vision/preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct image_decode_options o = image_decode_defaults();
    o.max_pixels = (int64_t)1 << 22;
    o.alpha = (size > 0 && (data[size - 1] & 1)) ? IMAGE_ALPHA_DROP : IMAGE_ALPHA_COMPOSITE_WHITE;
    struct image_rgb8 img;
    if (image_decode_memory(&img, data, size, &o) != 0) return 0;
    if ((int64_t)img.width * img.height <= 4096) {
        struct vision_preproc_config cfg = vision_preproc_defaults();
        struct vision_pixels px;
        if (vision_preprocess(&px, &cfg, &img) == 0) vision_pixels_free(&px);
    }
    image_rgb8_free(&img);
    return 0;
}
