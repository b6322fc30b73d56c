/* Qwen3-VL video preprocessing: a video file -> sampled frames -> pixel_values_videos +
 * video_grid_thw + the timestamps of each temporal patch, bit-identical to transformers 4.57.1's
 * Qwen3VLVideoProcessor fed by torchcodec (docs/qwen3-vl-video.md):
 *   decode and scan (video.h) -> sample_frames: n = int(total / video_fps * fps) clamped to
 *   [min_frames, max_frames] and to total, indices = numpy linspace(0, total - 1, n).round()
 *   -> smart_resize for video (the frame count enters the pixel budget) -> torchvision's
 *   antialiased bicubic u8 resize per frame (resample.c) -> the fused rescale / normalise
 *   (preprocess.c's table) -> an odd frame count repeats the last frame -> patchify with
 *   temporal_patch_size frames per patch: rows (t, h/M, w/M, M, M), columns (C, Tp, P, P). */
#ifndef STRATA_RUNTIME_VISION_VIDEO_PREPROCESS_H
#define STRATA_RUNTIME_VISION_VIDEO_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/vision/preprocess.h"
#include "runtime/vision/video.h"

/* video_preprocessor_config.json, the fields the video path reads. */
struct vision_video_config {
    struct vision_preproc_config pp; /* size (shortest_edge / longest_edge only), patch, merge,
                                        temporal, mean / std, rescale, do_* */
    double fps;                      /* frames sampled per second of video */
    int min_frames, max_frames;
    int do_sample_frames; /* off: every frame of the stream */
};

/* Qwen3VLVideoProcessor's class defaults (131072..786432 pixels, patch 16, merge 2, temporal
 * 2, mean = std = 0.5, fps 2, 4..768 frames). Released checkpoints ship other sizes in
 * video_preprocessor_config.json (e.g. 4096..25165824): read the file when there is one. */
struct vision_video_config vision_video_config_defaults(void);

/* Parses video_preprocessor_config.json: `size` must hold both keys (HF's ValueError); the
 * image file's top-level min_pixels / max_pixels are not read (the video processor ignores
 * them); `num_frames` (fixed-count sampling) is refused as not implemented. */
int vision_video_config_parse(struct vision_video_config *cfg, const char *json, size_t len);
int vision_video_config_load(struct vision_video_config *cfg, const char *path);

/* The video processor's configuration of a model directory, found as transformers finds it:
 * video_preprocessor_config.json, else preprocessor_config.json (read with the video rules),
 * else the class defaults. */
int vision_video_config_load_dir(struct vision_video_config *cfg, const char *model_dir);

/* sample_frames: how many frames (capped by `total`), then their indices [count]. */
int vision_video_sample_count(const struct vision_video_config *cfg, int64_t total, double fps);
void vision_video_sample_indices(int64_t *indices, int count, int64_t total);

/* smart_resize for video (num_frames sampled frames of h x w, factor = patch * merge).
 * STRATA_EINVAL: fewer frames than temporal_factor, a side below factor, aspect ratio over 200
 * (transformers' three ValueErrors). */
int vision_video_smart_resize(int64_t *out_h, int64_t *out_w, int64_t num_frames, int64_t h,
                              int64_t w, int64_t temporal_factor, int64_t factor,
                              int64_t min_pixels, int64_t max_pixels);

/* One video, preprocessed. */
struct vision_video {
    float *pixel_values; /* [num_patches][row_len] */
    int64_t num_patches, row_len;
    int64_t grid_thw[3]; /* video_grid_thw's row: [sampled frames / temporal, h / P, w / P] */
    int resized_w, resized_h;
    int n_frames;       /* sampled frames (before the odd-count padding) */
    int64_t *indices;   /* [n_frames] */
    double *timestamps; /* [grid_thw[0]] seconds, the processor's _calculate_timestamps */
    struct video_info info;
};

/* The frames' pixel values: rgb [n][h][w][3] (the sampled frames). */
int vision_preprocess_video(struct vision_video *out, const struct vision_video_config *cfg,
                            const uint8_t *rgb, int n, int w, int h);

/* The whole chain for one file held in memory: scan, sample, decode, preprocess, timestamps.
 * `lim` may be NULL. Errors as video_open / vision_preprocess_video. */
int vision_video_load(struct vision_video *out, const struct vision_video_config *cfg,
                      const void *data, size_t len, const struct video_limits *lim);

void vision_video_free(struct vision_video *v);

/* Qwen3VLProcessor._calculate_timestamps: `indices` [n] padded by repeating the last to a
 * multiple of `merge` (the processor passes the video processor's merge_size, not its
 * temporal_patch_size; both are 2 for Qwen3-VL), each index / fps, then the mean of each
 * group's first and last. out [ceil(n / merge)]. */
void vision_video_timestamps(double *out, const int64_t *indices, int n, double fps, int merge);

/* "<%.1f seconds>" as Python's f"<{t:.1f} seconds>" writes it (exact ties to even: glibc's
 * printf rounds the exact binary value as CPython does). */
void vision_video_timestamp_text(char *out, size_t n, double seconds);

#endif
