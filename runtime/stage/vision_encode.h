/* The vision stage's compute: a Request's image files -> the inputs stage 0 takes (grids,
 * merged embeddings, DeepStack), as transformers' Qwen3VLProcessor + the vision tower do for
 * one prompt: each file is decoded (PNG/JPEG, alpha onto white, a pixel limit before
 * decoding; runtime/vision/image.h) and preprocessed on its own exactly as HF's default
 * processor (runtime/vision/preprocess.h), then every image is encoded in one call, patches
 * concatenated in prompt order (reference/vision_encoder.h, on the encoder's thread pool, or
 * runtime/stage/vision_cuda.h on a GPU). */
#ifndef STRATA_RUNTIME_STAGE_VISION_ENCODE_H
#define STRATA_RUNTIME_STAGE_VISION_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "reference/vision_encoder.h"
#include "runtime/stage/vision_cuda.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/vision/image.h"
#include "runtime/vision/preprocess.h"
#include "wire/message.h"

#define VISION_DEFAULT_MAX_IMAGE_BYTES ((size_t)32 << 20)

struct vision_frontend {
    struct vision_encoder *enc; /* borrowed */
    struct vision_cuda *gpu;    /* borrowed; when set the tower runs there (vision_cuda.h) */
    struct vision_preproc_config pp;
    struct image_decode_options decode;
    size_t max_image_bytes; /* a larger file is refused before decoding; 0 = the default */
};

/* One request's encoder output. */
struct vision_output {
    int num_images;
    struct vl_grid grids[VL_MAX_IMAGES];
    int n_tokens, hidden, num_deepstack; /* T, H, K */
    float *embeds;                       /* [T, H] */
    float *deepstack;                    /* [K, T, H] or NULL */
    size_t pixel_bytes;                  /* pixel_values encoded (for logs / benches) */
    double seconds_decode, seconds_encode;
};

/* Decodes, preprocesses and encodes the request's image files. Every failure names the
 * image (1-based) and keeps the status: STRATA_EFORMAT (unknown format, malformed or
 * truncated data, a format hint the bytes contradict), STRATA_ERANGE (zero size, over the
 * pixel limit, file over max_image_bytes), STRATA_EINVAL (aspect ratio over 200, too many
 * images, a grid the tower refuses), STRATA_ENOMEM. */
int vision_frontend_encode(struct vision_frontend *fe, struct vision_output *out,
                           const struct wire_request *req);
void vision_output_free(struct vision_output *out); /* accepts a zeroed one */

#endif
