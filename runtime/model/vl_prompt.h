/* Qwen3-VL prompt assembly on token ids: image-token expansion (Qwen3VLProcessor) and the
 * 3-D M-RoPE position ids of a prompt (get_rope_index), batch 1, no padding.
 *
 * Spec: qwen3-vl-preprocessing.md §8.2-8.4 and qwen3-architecture.md §5.2-5.3. The chat
 * template renders one <|image_pad|> per image between <|vision_start|> and <|vision_end|>;
 * the processor repeats the i-th one t*h*w / merge^2 times (grid in patch units). Positions:
 * text tokens take (p, p, p) and advance p by one; an image of llm grid (gh, gw) = (h, w) /
 * merge takes (p, p + r, p + c) in row-major order and advances p by max(gh, gw). A token
 * decoded after the prompt at cache index n has position n + rope_delta on all three rows.
 *
 * Videos: get_rope_index splits a video's grid (t, h, w) into t grids (1, h, w), one per
 * temporal block, each its own run of <|video_pad|> between <|vision_start|> and
 * <|vision_end|>, with the block's timestamp text before it. Here a video is that list of t
 * grids, in prompt order with the images' (every grid has t == 1), and its runs arrive
 * already expanded (the timestamps need the tokenizer: runtime/vision/video_prompt.h).
 * An image must be one run of exactly its token count: two images whose runs touch are
 * refused, since transformers v4 and v5 place them differently (spec §8.3) and the chat
 * template never emits them. */
#ifndef STRATA_RUNTIME_MODEL_VL_PROMPT_H
#define STRATA_RUNTIME_MODEL_VL_PROMPT_H

#include <stdint.h>

/* Images and video frame blocks per request (a video of t temporal patches counts t: 360 for
 * six minutes at Qwen3-VL's 2 frames per second). */
#define VL_MAX_IMAGES 1024

/* One image's grid in vision patches (image_grid_thw row). */
struct vl_grid {
    int32_t t, h, w;
};

/* The special ids and the merge size a prompt is assembled with (config.json). */
struct vl_tokens {
    int32_t image_token_id; /* <|image_pad|> */
    int32_t video_token_id; /* <|video_pad|>: runs already expanded, one per frame block */
    int merge;              /* vision_config.spatial_merge_size */
};

/* A row whose embedding a vision output replaces: an image or a video pad. */
static inline int vl_is_visual(const struct vl_tokens *tok, int32_t id) {
    return id == tok->image_token_id || id == tok->video_token_id;
}

/* Tokens image `g` occupies in the prompt: t*h*w / merge^2. Refuses t != 1, a side that
 * is not a positive multiple of merge, or more than INT32_MAX tokens (STRATA_EINVAL,
 * naming image `index`). */
int vl_image_tokens(int64_t *out, const struct vl_grid *g, int merge, int index);

/* Sum of vl_image_tokens over `n_images` grids. */
int vl_total_image_tokens(int64_t *out, const struct vl_grid *grids, int n_images, int merge);

/* Expands a prompt with one image_token_id per image into the processor's prompt: out
 * [*out_len] (capacity out_cap) holds `ids` with each image token repeated its grid's
 * vl_image_tokens times; each run of video tokens (already expanded) consumes the next grid
 * and must be exactly its count. Refuses (STRATA_EINVAL) a prompt whose image tokens plus
 * video runs are not n_images, and STRATA_ERANGE when the result exceeds out_cap (*out_len
 * still says how long it would be). */
int vl_expand_prompt(int32_t *out, int out_cap, int *out_len, const int32_t *ids, int n,
                     const struct vl_tokens *tok, const struct vl_grid *grids, int n_images);

/* get_rope_index of an expanded prompt ids [n]: positions [3][n] (rows t, h, w) and
 * rope_delta = max position + 1 - n. Every run of image or video tokens must be exactly the
 * next grid's token count, and all n_images grids must be used (STRATA_EINVAL otherwise,
 * naming the image and the position). n_images may be 0 (text: positions 0..n-1, delta 0). */
int vl_rope_index(int32_t *positions, int *rope_delta, const int32_t *ids, int n,
                  const struct vl_tokens *tok, const struct vl_grid *grids, int n_images);

/* Positions of `n` decode (or continuation) tokens from cache index `cache_index`:
 * positions [3][n], cache_index + i + rope_delta on every row (spec §5.3). */
void vl_decode_positions(int32_t *positions, int n, int cache_index, int rope_delta);

#endif
