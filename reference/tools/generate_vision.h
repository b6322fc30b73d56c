/* strata-generate's image path, in one process: image files -> pixel values (HF's default
 * processor, runtime/vision) -> the vision encoder (reference/vision_encoder) -> the
 * expanded prompt, its M-RoPE positions, the rows whose embeddings the merger output
 * replaces and the DeepStack features on those rows (runtime/model/vl_prompt; spec
 * qwen3-architecture.md §5.2-5.4, qwen3-vl-preprocessing.md §8). */
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
    uint8_t *mask;      /* [n] 1 on image rows */
    float *embeds;      /* [n_image_tokens][H] in prompt order */
    int n_image_tokens;
    float *deepstack; /* [num_deepstack][n][H], zero on text rows */
    int num_deepstack;
    double t_encode; /* seconds spent decoding, preprocessing and encoding */
};

/* Prepares the inputs of `prompt` [n_prompt] (one image_token_id per image, in the order of
 * `images`) from the image files, with MODEL_DIR/preprocessor_config.json (Qwen3-VL's values
 * when absent). Status + strata_set_error: STRATA_EINVAL for a text-only model or a prompt
 * whose image tokens do not match the files, image decoding's codes for a bad file. */
int gen_vision_prepare(struct gen_vision *v, const char *model_dir, const struct model_config *cfg,
                       const struct safetensors *st, const int32_t *prompt, int n_prompt,
                       const char *const *images, int n_images, int threads);
void gen_vision_free(struct gen_vision *v);

#endif
