/* Loads one tests/golden/<case> fixture (README there) and runs the reference decoder on it:
 * shared by the golden, invariant and bad-input tests. */
#ifndef STRATA_TESTS_REFERENCE_GOLDEN_CASE_H
#define STRATA_TESTS_REFERENCE_GOLDEN_CASE_H

#include <stdint.h>

#include "reference/model.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

struct golden_case {
    char name[64];
    struct model_config cfg;
    struct safetensors *st;
    int32_t *prompt; /* [n_prompt] */
    int n_prompt;
    int32_t *generated; /* [n_steps] */
    int n_steps;
    float *logits; /* [n_steps, V] */

    /* Qwen3-VL cases only (golden.json "vision"; has_vision == 0 otherwise). */
    int has_vision;
    int image_token_id;
    int32_t *position_ids; /* [3, n_prompt] M-RoPE rows t, h, w of the prompt */
    int rope_delta;        /* decode position = cache index + rope_delta */
    int n_visual;          /* image pad tokens in the prompt */
    float *vision_embeds;  /* [n_visual, H] merger outputs (replace the pad embeddings) */
    int num_deepstack;
    float *deepstack;    /* [num_deepstack, n_visual, H] */
    float *pixel_values; /* [n_patches, patch_dim] the vision tower's input */
    int n_patches, patch_dim;
    int64_t *image_grid_thw; /* [n_images, 3] rows t, h, w in patches */
    int n_images;
};

/* The committed case names, NULL-terminated. */
extern const char *const golden_case_names[];

/* Reads tests/golden/<name> through test_path(); returns a status (message in
 * strata_last_error()). */
int golden_case_open(struct golden_case *gc, const char *name);
void golden_case_close(struct golden_case *gc);

/* Loads layers [start, end) with the given parts and thread count. */
int golden_model(struct reference_model **out, const struct golden_case *gc, int start, int end,
                 int with_embed, int with_head, int threads);

/* golden_model with the weights as `dtype` (reference/model.h: as stored or q8). */
int golden_model_dtype(struct reference_model **out, const struct golden_case *gc, int start,
                       int end, int with_embed, int with_head, int threads,
                       enum reference_weights_dtype dtype);

/* A sequence of `n` token ids: the prompt followed by the generated ids. */
int golden_sequence(const struct golden_case *gc, int32_t *out, int n);

#endif
