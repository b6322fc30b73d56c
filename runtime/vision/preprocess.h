/* Qwen3-VL image preprocessing: RGB u8 image -> pixel_values + image_grid_thw, bit-identical
 * to transformers' default ("fast", torchvision on CPU) Qwen2VL image processor in 5.23 and
 * 4.57.1 (shared spec qwen3-vl-preprocessing.md §2, §4–§7):
 *   smart_resize (§4) -> torchvision antialiased bicubic u8 resize (§5.2) -> fused
 *   rescale/normalise to f32 (§6) -> temporal duplication + patchify (§7).
 * The PIL ("slow") backend is not implemented: its resize and rescale differ (§5.3, §5.4). */
#ifndef STRATA_RUNTIME_VISION_PREPROCESS_H
#define STRATA_RUNTIME_VISION_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/vision/image.h"

/* preprocessor_config.json, the fields the image path reads (spec §2). */
struct vision_preproc_config {
    int64_t min_pixels; /* size.shortest_edge (or top-level min_pixels) */
    int64_t max_pixels; /* size.longest_edge (or top-level max_pixels) */
    int patch_size;
    int merge_size;
    int temporal_patch_size;
    float image_mean[3];
    float image_std[3];
    double rescale_factor;
    int do_resize, do_rescale, do_normalize, do_convert_rgb;
};

/* Qwen3-VL's shipped values (spec §2): 65536..16777216 pixels, patch 16, merge 2, temporal 2,
 * mean = std = 0.5, rescale 1/255, every do_* on. These are also the defaults for a field a
 * file leaves out; note that transformers' class defaults differ (3136..1003520, patch 14,
 * CLIP mean/std), which only matters for a file that omits them (no Qwen3-VL file does). */
struct vision_preproc_config vision_preproc_defaults(void);

/* Parses preprocessor_config.json text. Both generations are read (spec §2 reading rule):
 * `size.shortest_edge/longest_edge` (transformers 5 and 4.5x fast), overwritten by top-level
 * `min_pixels`/`max_pixels` when present (4.5x-era files). `resample` other than 3 (bicubic)
 * is refused, as is any invalid value; the message names the field. */
int vision_preproc_config_parse(struct vision_preproc_config *cfg, const char *json, size_t len);

/* Reads and parses `path` (usually MODEL_DIR/preprocessor_config.json). */
int vision_preproc_config_load(struct vision_preproc_config *cfg, const char *path);

/* smart_resize (spec §4): the resize target for an h x w image with `factor` =
 * patch_size * merge_size and the pixel budget. STRATA_EINVAL when the aspect ratio is over
 * 200 (HF's ValueError) or a size is not positive. */
int vision_smart_resize(int64_t *out_h, int64_t *out_w, int64_t h, int64_t w, int64_t factor,
                        int64_t min_pixels, int64_t max_pixels);

/* One axis of torchvision's antialiased bicubic resize (ATen _upsample_bicubic2d_aa u8 path,
 * spec §5.2): for output o, taps [xmin[o], xmin[o] + xsize[o]) with int16 weights
 * weights[o * ksize + j] in fixed point with `precision` fractional bits. */
struct vision_resample_axis {
    int in_size, out_size;
    int ksize;     /* max taps per output: ceil(support) * 2 + 1 */
    int precision; /* P */
    int *xmin;     /* [out_size] */
    int *xsize;    /* [out_size] */
    int16_t *weights;
};

int vision_resample_axis_init(struct vision_resample_axis *ax, int in_size, int out_size);
void vision_resample_axis_free(struct vision_resample_axis *ax);

/* Resizes RGB u8 `in` to out_w x out_h (width pass first, u8 intermediate, spec §5.1–§5.2).
 * Same size: a copy. */
int vision_resize_bicubic_aa(struct image_rgb8 *out, const struct image_rgb8 *in, int out_w,
                             int out_h);

/* The result for one image. pixel_values is [num_patches][row_len] f32, row-major, with
 * num_patches = grid_t * grid_h * grid_w and row_len = 3 * temporal_patch_size * patch^2
 * (1536 for Qwen3-VL); grid_thw = image_grid_thw's row [1, grid_h, grid_w]. */
struct vision_pixels {
    float *pixel_values;
    int64_t num_patches;
    int64_t row_len;
    int64_t grid_thw[3];
    int resized_w, resized_h;
};

/* The whole chain for one decoded image. STRATA_EINVAL for an aspect ratio over 200 or a
 * size that does not divide into patches (do_resize off); STRATA_ENOMEM. */
int vision_preprocess(struct vision_pixels *out, const struct vision_preproc_config *cfg,
                      const struct image_rgb8 *img);

void vision_pixels_free(struct vision_pixels *px);

/* Patchify (spec §7) of n resized frames into pv: rows (t, h/M, w/M, M, M), columns (C, T, P,
 * P) over gt temporal patches, temporal slot s of patch t being frame t * T + s, the last frame
 * standing in for missing ones — a still image (n = 1, gt = 1) fills every slot, an odd frame
 * count repeats the last (the video processor's padding). */
void vision_patchify(float *pv, const struct image_rgb8 *frames, int n, const float lut[3][256],
                     int P, int M, int T, int64_t gt);

/* u8 -> f32 for channel c exactly as torch computes it (spec §6): the table both the image
 * and the video path normalise with. */
void vision_normalize_lut(float lut[256], const struct vision_preproc_config *cfg, int c);

/* Number of LLM <|image_pad|> tokens for a grid: t * h * w / merge^2 (spec §7, §8.2). */
int64_t vision_image_tokens(const int64_t grid_thw[3], int merge_size);

#endif
