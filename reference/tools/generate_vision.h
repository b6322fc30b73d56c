/* strata-generate's image and video path, in one process: image and video files -> pixel
 * values (HF's default processors, runtime/vision) -> the vision encoder
 * (reference/vision_encoder) -> the expanded prompt (a video's timestamps tokenized with the
 * model's tokenizer, runtime/vision/video_prompt.h), its M-RoPE positions, the rows whose
 * embeddings the merger output replaces and the DeepStack features on those rows
 * (runtime/model/vl_prompt; spec qwen3-architecture.md §5.2-5.4, qwen3-vl-preprocessing.md §8,
 * docs/qwen3-vl-video.md). */
#ifndef STRATA_REFERENCE_TOOLS_GENERATE_VISION_H
#define STRATA_REFERENCE_TOOLS_GENERATE_VISION_H

#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

struct gen_vision {
    int32_t *ids;       /* [n] expanded prompt */
    int n;              /* prompt rows */
    int32_t *positions; /* [3][n] M-RoPE rows t, h, w */
    int rope_delta;     /* decode position = cache index + rope_delta */
    uint8_t *mask;      /* [n] 1 on image and video rows */
    float *embeds;      /* [n_image_tokens][H] in prompt order */
    int n_image_tokens; /* visual rows: image and video tokens */
    int n_video_tokens; /* of which video */
    float *deepstack; /* [num_deepstack][n][H], zero on text rows */
    int num_deepstack;
    double t_encode; /* seconds spent decoding, preprocessing and encoding */
};

/* The files for a prompt's images and videos, each list in its order in the prompt. */
struct gen_vision_files {
    const char *const *images;
    int n_images;
    const char *const *videos;
    int n_videos;
    const char *tokenizer_dir; /* for the videos' timestamp text; NULL: the model directory */
};

/* Prepares the inputs of `prompt` [n_prompt] (one image_token_id per image and one
 * video_token_id per video) from the files, with MODEL_DIR/preprocessor_config.json and
 * video_preprocessor_config.json (Qwen3-VL's defaults when absent). Status +
 * strata_set_error: STRATA_EINVAL for a text-only model or a prompt whose image / video tokens
 * do not match the files, decoding's codes for a bad file. */
int gen_vision_prepare(struct gen_vision *v, const char *model_dir, const struct model_config *cfg,
                       const struct safetensors *st, const int32_t *prompt, int n_prompt,
                       const struct gen_vision_files *files, int threads);
void gen_vision_free(struct gen_vision *v);

#endif
