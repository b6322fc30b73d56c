/* Qwen3-VL video preprocessing (see video_preprocess.h; docs/qwen3-vl-video.md). */
#include "runtime/vision/video_preprocess.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

int vision_video_sample_count(const struct vision_video_config *cfg, int64_t total, double fps) {
    if (!cfg->do_sample_frames) return total > INT32_MAX ? INT32_MAX : (int)total;
    /* int(total / metadata.fps * fps): Python's int() truncates toward zero */
    double want = (double)total / fps * cfg->fps;
    int64_t n = want >= (double)INT32_MAX ? INT32_MAX : (int64_t)want;
    if (n < cfg->min_frames) n = cfg->min_frames;
    if (n > cfg->max_frames) n = cfg->max_frames;
    if (n > total) n = total;
    return (int)n;
}

/* numpy.linspace(0, total - 1, count).round(): i * step in double (the step computed once),
 * the last set to the stop exactly, rounded half to even (rint in the default mode). */
void vision_video_sample_indices(int64_t *indices, int count, int64_t total) {
    double stop = (double)(total - 1);
    double step = count > 1 ? stop / (double)(count - 1) : 0.0;
    for (int i = 0; i < count; i++) {
        double y;
        if (count > 1 && step == 0.0) /* numpy's denormal path: i / div * delta */
            y = (double)i / (double)(count - 1) * stop;
        else
            y = (double)i * step;
        if (count > 1 && i == count - 1) y = stop;
        indices[i] = (int64_t)rint(y);
    }
}

int vision_video_smart_resize(int64_t *out_h, int64_t *out_w, int64_t num_frames, int64_t h,
                              int64_t w, int64_t temporal_factor, int64_t factor,
                              int64_t min_pixels, int64_t max_pixels) {
    const int64_t side_max = (int64_t)1 << 24;
    if (num_frames < temporal_factor)
        return strata_set_error(STRATA_EINVAL,
                                "%lld frame(s) sampled: at least temporal_patch_size (%lld) are "
                                "needed",
                                (long long)num_frames, (long long)temporal_factor);
    if (h < factor || w < factor)
        return strata_set_error(STRATA_EINVAL,
                                "the frames are %lldx%lld: both sides must be at least %lld "
                                "(patch_size x merge_size)",
                                (long long)w, (long long)h, (long long)factor);
    if (h > side_max || w > side_max || num_frames > side_max)
        return strata_set_error(STRATA_EINVAL, "the video is too large (%lldx%lld, %lld frames)",
                                (long long)w, (long long)h, (long long)num_frames);
    double hi = (double)(h > w ? h : w), lo = (double)(h > w ? w : h);
    if (hi / lo > 200.0)
        return strata_set_error(STRATA_EINVAL,
                                "absolute aspect ratio must be smaller than 200, got %g", hi / lo);
    int64_t hb = (int64_t)rint((double)h / (double)factor) * factor;
    int64_t wb = (int64_t)rint((double)w / (double)factor) * factor;
    int64_t tb = (int64_t)rint((double)num_frames / (double)temporal_factor) * temporal_factor;
    if (tb * hb * wb > max_pixels) {
        double beta = sqrt((double)(num_frames * h * w) / (double)max_pixels);
        hb = (int64_t)floor((double)h / beta / (double)factor) * factor;
        wb = (int64_t)floor((double)w / beta / (double)factor) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (tb * hb * wb < min_pixels) {
        double beta = sqrt((double)min_pixels / (double)(num_frames * h * w));
        hb = (int64_t)ceil((double)h * beta / (double)factor) * factor;
        wb = (int64_t)ceil((double)w * beta / (double)factor) * factor;
    }
    *out_h = hb;
    *out_w = wb;
    return STRATA_OK;
}

void vision_video_timestamps(double *out, const int64_t *indices, int n, double fps, int merge) {
    int padded = (n + merge - 1) / merge * merge;
    for (int g = 0; g * merge < padded; g++) {
        int a = g * merge, b = a + merge - 1;
        double first = (double)indices[a < n ? a : n - 1] / fps;
        double last = (double)indices[b < n ? b : n - 1] / fps;
        out[g] = (first + last) / 2;
    }
}

void vision_video_timestamp_text(char *out, size_t n, double seconds) {
    snprintf(out, n, "<%.1f seconds>", seconds);
}

/* The resize target of n frames of w x h (smart_resize, or the frame itself when do_resize is
 * off and it divides into patches). */
static int resize_target(int64_t *th, int64_t *tw, const struct vision_video_config *cfg, int n,
                         int w, int h) {
    const struct vision_preproc_config *pc = &cfg->pp;
    const int64_t factor = (int64_t)pc->patch_size * pc->merge_size;
    int rc = STRATA_OK;
    *th = h;
    *tw = w;
    if (pc->do_resize)
        rc = vision_video_smart_resize(th, tw, n, h, w, pc->temporal_patch_size, factor,
                                       pc->min_pixels, pc->max_pixels);
    else if (h % factor || w % factor || n < pc->temporal_patch_size)
        rc = strata_set_error(STRATA_EINVAL,
                              "do_resize is off and %dx%d is not a multiple of %lld (or fewer "
                              "than %d frames)",
                              w, h, (long long)factor, pc->temporal_patch_size);
    if (rc == STRATA_OK && (double)*th * (double)*tw * n > (double)((int64_t)1 << 30))
        rc = strata_set_error(STRATA_ERANGE,
                              "%d frames resized to %lldx%lld are too many pixels (lower the "
                              "pixel budget, fps or max_frames)",
                              n, (long long)*tw, (long long)*th);
    return rc;
}

/* The resized frames [n] -> grid, pixel values. */
static int patch_frames(struct vision_video *out, const struct vision_video_config *cfg,
                        const struct image_rgb8 *frames, int n) {
    const struct vision_preproc_config *pc = &cfg->pp;
    const int P = pc->patch_size, M = pc->merge_size, T = pc->temporal_patch_size;
    const int64_t gt = (n + T - 1) / T, th = frames[0].height, tw = frames[0].width;
    out->grid_thw[0] = gt;
    out->grid_thw[1] = th / P;
    out->grid_thw[2] = tw / P;
    out->num_patches = gt * out->grid_thw[1] * out->grid_thw[2];
    out->row_len = (int64_t)3 * T * P * P;
    out->resized_w = (int)tw;
    out->resized_h = (int)th;
    out->pixel_values = malloc((size_t)out->num_patches * (size_t)out->row_len * sizeof(float));
    if (!out->pixel_values)
        return strata_set_error(STRATA_ENOMEM, "out of memory for pixel_values_videos");
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        vision_normalize_lut(lut[c], pc, c);
    vision_patchify(out->pixel_values, frames, n, (const float(*)[256])lut, P, M, T, gt);
    return STRATA_OK;
}

static void free_frames(struct image_rgb8 *frames, int n) {
    for (int i = 0; frames && i < n; i++)
        image_rgb8_free(&frames[i]);
    free(frames);
}

int vision_preprocess_video(struct vision_video *out, const struct vision_video_config *cfg,
                            const uint8_t *rgb, int n, int w, int h) {
    int64_t th, tw;
    memset(out->grid_thw, 0, sizeof out->grid_thw);
    out->pixel_values = NULL;
    if (!rgb || n < 1 || w < 1 || h < 1)
        return strata_set_error(STRATA_EINVAL, "vision_preprocess_video: no frames");
    int rc = resize_target(&th, &tw, cfg, n, w, h);
    if (rc != STRATA_OK) return rc;
    struct image_rgb8 *frames = calloc((size_t)n, sizeof *frames);
    if (!frames) return strata_set_error(STRATA_ENOMEM, "out of memory for video frames");
    for (int i = 0; rc == STRATA_OK && i < n; i++) {
        struct image_rgb8 in = {w, h, (uint8_t *)rgb + (size_t)i * w * h * 3};
        rc = vision_resize_bicubic_aa(&frames[i], &in, (int)tw, (int)th);
    }
    if (rc == STRATA_OK) rc = patch_frames(out, cfg, frames, n);
    free_frames(frames, n);
    return rc;
}

/* Each decoded frame resized at once into its slot: only the resized frames are held. */
struct resize_ctx {
    struct image_rgb8 *frames;
    int w, h, tw, th;
};

static int resize_frame(void *ctx, int i, const uint8_t *rgb) {
    struct resize_ctx *c = ctx;
    struct image_rgb8 in = {c->w, c->h, (uint8_t *)rgb};
    return vision_resize_bicubic_aa(&c->frames[i], &in, c->tw, c->th);
}

int vision_video_load(struct vision_video *out, const struct vision_video_config *cfg,
                      const void *data, size_t len, const struct video_limits *lim) {
    memset(out, 0, sizeof *out);
    struct video *v = NULL;
    struct image_rgb8 *frames = NULL;
    int64_t th = 0, tw = 0;
    int rc = video_open(&v, data, len, lim);
    if (rc) return rc;
    out->info = *video_get_info(v);
    const struct video_info *in = &out->info;
    int n = vision_video_sample_count(cfg, in->num_frames, in->fps);
    const int merge = cfg->pp.merge_size, T = cfg->pp.temporal_patch_size;
    if (n < 1) rc = strata_set_error(STRATA_EINVAL, "no frames to sample");
    if (rc == 0) rc = resize_target(&th, &tw, cfg, n, in->width, in->height);
    if (rc == 0) {
        out->indices = malloc((size_t)n * sizeof *out->indices);
        out->timestamps = malloc(((size_t)n + (size_t)merge + (size_t)T) * sizeof(double));
        frames = calloc((size_t)n, sizeof *frames);
        if (!out->indices || !out->timestamps || !frames)
            rc = strata_set_error(STRATA_ENOMEM, "out of memory for %d video frames", n);
    }
    if (rc == 0) {
        out->n_frames = n;
        vision_video_sample_indices(out->indices, n, in->num_frames);
        struct resize_ctx c = {frames, in->width, in->height, (int)tw, (int)th};
        rc = video_decode_each(v, out->indices, n, resize_frame, &c);
    }
    if (rc == 0) rc = patch_frames(out, cfg, frames, n);
    if (rc == 0 && (n + merge - 1) / merge != out->grid_thw[0])
        rc = strata_set_error(STRATA_EINVAL,
                              "merge_size %d and temporal_patch_size %d disagree: the prompt's "
                              "timestamps would not match the video's %lld temporal patches",
                              merge, T, (long long)out->grid_thw[0]);
    if (rc == 0) vision_video_timestamps(out->timestamps, out->indices, n, in->fps, merge);
    free_frames(frames, n);
    video_close(v);
    if (rc) vision_video_free(out);
    return rc;
}

void vision_video_free(struct vision_video *v) {
    if (!v) return;
    free(v->pixel_values);
    free(v->indices);
    free(v->timestamps);
    memset(v, 0, sizeof *v);
}
