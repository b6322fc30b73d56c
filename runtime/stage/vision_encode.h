/* The vision stage's compute: a Request's image and video files -> the inputs stage 0 takes
 * (grids, merged embeddings, DeepStack, and for videos the prompt with their timestamps), as
 * transformers' Qwen3VLProcessor + the vision tower do for one prompt: each file is decoded
 * (PNG/JPEG, alpha onto white, a pixel limit before decoding, runtime/vision/image.h; MP4 /
 * WebM with FFmpeg as torchcodec, runtime/vision/video.h) and preprocessed on its own exactly
 * as HF's default processors (runtime/vision/preprocess.h, video_preprocess.h), then
 * everything is encoded in one call, patches concatenated in prompt order
 * (reference/vision_encoder.h, on the encoder's thread pool, or runtime/stage/vision_cuda.h on
 * a GPU). The files are in the prompt's order of its image and video pad tokens. */
#ifndef STRATA_RUNTIME_STAGE_VISION_ENCODE_H
#define STRATA_RUNTIME_STAGE_VISION_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "reference/vision_encoder.h"
#include "runtime/stage/vision_cuda.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/vision/image.h"
#include "runtime/text/tokenizer.h"
#include "runtime/vision/preprocess.h"
#include "runtime/vision/video_preprocess.h"
#include "wire/message.h"

#define VISION_DEFAULT_MAX_IMAGE_BYTES ((size_t)32 << 20)
#define VISION_DEFAULT_MAX_VIDEO_BYTES ((size_t)256 << 20)

struct vision_frontend {
    struct vision_encoder *enc; /* borrowed */
    struct vision_cuda *gpu;    /* borrowed; when set the tower runs there (vision_cuda.h) */
    struct vision_preproc_config pp;
    struct image_decode_options decode;
    size_t max_image_bytes; /* a larger file is refused before decoding; 0 = the default */
    /* videos */
    struct vision_video_config vpp;
    struct video_limits video;
    size_t max_video_bytes;      /* 0 = the default */
    const struct tokenizer *tok; /* borrowed; the timestamps' text (NULL: videos refused) */
    int32_t image_token_id, video_token_id, vision_start_token_id, vision_end_token_id;
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
    int num_videos;  /* of the files; each gives grids[] one (1, h, w) per temporal block */
    int32_t *prompt; /* with videos: the prompt, their timestamps and blocks written in */
    size_t prompt_len;
};

/* Decodes, preprocesses and encodes the request's image and video files. Every failure names
 * the file (1-based) and keeps the status: STRATA_EFORMAT (unknown format, malformed or
 * truncated data, a format hint the bytes contradict), STRATA_ERANGE (zero size, over the
 * pixel or frame limit, file over max_image_bytes / max_video_bytes), STRATA_EINVAL (aspect
 * ratio over 200, too many images, files that do not match the prompt's image and video
 * tokens, a video without a tokenizer, a grid the tower refuses), STRATA_ENOMEM. */
int vision_frontend_encode(struct vision_frontend *fe, struct vision_output *out,
                           const struct wire_request *req);
void vision_output_free(struct vision_output *out); /* accepts a zeroed one */

#endif
