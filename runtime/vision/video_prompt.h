/* The text Qwen3VLProcessor writes for a video, on token ids: each
 * <|vision_start|><|video_pad|><|vision_end|> (or a bare <|video_pad|>) becomes, for every
 * temporal patch k of the video,
 *     "<{t_k:.1f} seconds>" <|vision_start|> <|video_pad|> x (h * w / merge^2) <|vision_end|>
 * (docs/qwen3-vl-video.md). HF replaces the text first and tokenizes the whole string, so a
 * timestamp is tokenized together with the text before it up to the previous added token
 * ("Video 1: <0.3 seconds>" joins " <" into one token, where "<" alone would not): here that
 * trailing text is decoded and encoded again with the timestamp, which gives HF's ids for any
 * prompt the tokenizer itself produced. The timestamps after the first follow a
 * <|vision_end|>, so they are tokenized alone. */
#ifndef STRATA_RUNTIME_VISION_VIDEO_PROMPT_H
#define STRATA_RUNTIME_VISION_VIDEO_PROMPT_H

#include <stdint.h>

#include "runtime/text/tokenizer.h"

/* One video as the prompt sees it. */
struct video_prompt_item {
    int blocks;               /* temporal patches: video_grid_thw's t */
    int64_t tokens_per_block; /* h * w / merge^2 */
    const double *timestamps; /* [blocks] seconds */
};

/* The special ids the expansion writes. */
struct video_prompt_ids {
    int32_t video_pad, vision_start, vision_end;
};

/* Appends to *out the prompt ids [n] with its n_videos video tokens expanded (each must be a
 * single <|video_pad|>: a prompt already expanded is refused). STRATA_EINVAL when the prompt's
 * video-token count is not n_videos; the tokenizer's errors otherwise. */
int video_prompt_expand(struct tokenizer_ids *out, const struct tokenizer *tok,
                        const struct video_prompt_ids *sp, const int32_t *ids, int n,
                        const struct video_prompt_item *videos, int n_videos);

#endif
