/* smart_resize, normalisation and patchify (spec qwen3-vl-preprocessing.md §4, §6, §7); the
 * resize itself is resample.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/vision/preprocess.h"

/* Python's round(): half to even. rint() does that in the default FE_TONEAREST mode, which
 * nothing in Strata changes; lround()/round() would round ties away from zero (§4). */
static int64_t py_round(double v) {
    return (int64_t)rint(v);
}

int vision_smart_resize(int64_t *out_h, int64_t *out_w, int64_t h, int64_t w, int64_t factor,
                        int64_t min_pixels, int64_t max_pixels) {
    const int64_t side_max = (int64_t)1 << 31; /* keeps h * w and hb * wb in int64 */
    if (h <= 0 || w <= 0 || factor <= 0 || h > side_max || w > side_max || factor > side_max)
        return strata_set_error(STRATA_EINVAL,
                                "smart_resize: sizes must be in [1, 2^31] (%lldx%lld)",
                                (long long)w, (long long)h);
    double hi = (double)(h > w ? h : w), lo = (double)(h > w ? w : h);
    if (hi / lo > 200.0)
        return strata_set_error(
            STRATA_EINVAL, "absolute aspect ratio must be smaller than 200, got %g (%lldx%lld)",
            hi / lo, (long long)w, (long long)h);
    int64_t hb = py_round((double)h / factor) * factor;
    int64_t wb = py_round((double)w / factor) * factor;
    if (hb * wb > max_pixels) {
        double beta = sqrt((double)(h * w) / (double)max_pixels);
        hb = (int64_t)floor((double)h / beta / factor) * factor;
        wb = (int64_t)floor((double)w / beta / factor) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (hb * wb < min_pixels) {
        double beta = sqrt((double)min_pixels / (double)(h * w));
        hb = (int64_t)ceil((double)h * beta / factor) * factor;
        wb = (int64_t)ceil((double)w * beta / factor) * factor;
    }
    *out_h = hb;
    *out_w = wb;
    return STRATA_OK;
}

/* u8 -> f32 for one channel, exactly as torch computes it (§6). Fast path with both steps on:
 * mean and std are fused with the rescale factor as f32 tensor * scalar, then
 * normalize() subtracts and divides in f32. */
void vision_normalize_lut(float lut[256], const struct vision_preproc_config *cfg, int c) {
    float inv = (float)(1.0 / cfg->rescale_factor);
    float mean = cfg->image_mean[c] * inv, std = cfg->image_std[c] * inv;
    for (int x = 0; x < 256; x++) {
        float v = (float)x;
        if (cfg->do_rescale && cfg->do_normalize)
            v = (v - mean) / std;
        else if (cfg->do_rescale)
            v = v * (float)cfg->rescale_factor;
        else if (cfg->do_normalize)
            v = (v - cfg->image_mean[c]) / cfg->image_std[c];
        lut[x] = v;
    }
}

void vision_patchify(float *pv, const struct image_rgb8 *frames, int n, const float lut[3][256],
                     int P, int M, int T, int64_t gt) {
    const int W = frames[0].width, gh = frames[0].height / P, gw = W / P;
    size_t k = 0;
    for (int64_t t = 0; t < gt; t++)
        for (int bh = 0; bh < gh / M; bh++)
            for (int bw = 0; bw < gw / M; bw++)
                for (int mh = 0; mh < M; mh++)
                    for (int mw = 0; mw < M; mw++) {
                        int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                        for (int c = 0; c < 3; c++)
                            for (int s = 0; s < T; s++) {
                                int64_t f = t * T + s;
                                const uint8_t *base = frames[f < n ? f : n - 1].data;
                                for (int py = 0; py < P; py++) {
                                    const uint8_t *src =
                                        base + ((size_t)(y0 + py) * W + x0) * 3 + c;
                                    for (int px = 0; px < P; px++)
                                        pv[k++] = lut[c][src[px * 3]];
                                }
                            }
                    }
}

static int resize_target(int64_t *th, int64_t *tw, const struct vision_preproc_config *cfg,
                         const struct image_rgb8 *img) {
    int64_t factor = (int64_t)cfg->patch_size * cfg->merge_size;
    if (cfg->do_resize)
        return vision_smart_resize(th, tw, img->height, img->width, factor, cfg->min_pixels,
                                   cfg->max_pixels);
    if (img->height % factor || img->width % factor)
        return strata_set_error(STRATA_EINVAL,
                                "do_resize is off and %dx%d is not a multiple of %lld", img->width,
                                img->height, (long long)factor);
    *th = img->height;
    *tw = img->width;
    return STRATA_OK;
}

int vision_preprocess(struct vision_pixels *out, const struct vision_preproc_config *cfg,
                      const struct image_rgb8 *img) {
    memset(out, 0, sizeof *out);
    if (!cfg || !img || !img->data || img->width <= 0 || img->height <= 0)
        return strata_set_error(STRATA_EINVAL, "vision_preprocess: empty image");
    int64_t th, tw;
    int rc = resize_target(&th, &tw, cfg, img);
    if (rc != STRATA_OK) return rc;
    if (th > INT32_MAX / 4 || tw > INT32_MAX / 4 || th * tw > ((int64_t)1 << 31))
        return strata_set_error(STRATA_ERANGE, "resize target %lldx%lld too large", (long long)tw,
                                (long long)th);
    struct image_rgb8 resized;
    rc = vision_resize_bicubic_aa(&resized, img, (int)tw, (int)th);
    if (rc != STRATA_OK) return rc;
    const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
    out->grid_thw[0] = 1;
    out->grid_thw[1] = th / P;
    out->grid_thw[2] = tw / P;
    out->num_patches = out->grid_thw[1] * out->grid_thw[2];
    out->row_len = (int64_t)3 * T * P * P;
    out->resized_w = (int)tw;
    out->resized_h = (int)th;
    out->pixel_values = malloc((size_t)out->num_patches * (size_t)out->row_len * sizeof(float));
    if (!out->pixel_values) {
        image_rgb8_free(&resized);
        memset(out, 0, sizeof *out);
        return strata_set_error(STRATA_ENOMEM, "out of memory for pixel_values (%lldx%lld)",
                                (long long)tw, (long long)th);
    }
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        vision_normalize_lut(lut[c], cfg, c);
    vision_patchify(out->pixel_values, &resized, 1, (const float(*)[256])lut, P, M, T, 1);
    image_rgb8_free(&resized);
    return STRATA_OK;
}

void vision_pixels_free(struct vision_pixels *px) {
    if (!px) return;
    free(px->pixel_values);
    memset(px, 0, sizeof *px);
}

int64_t vision_image_tokens(const int64_t grid_thw[3], int merge_size) {
    return grid_thw[0] * grid_thw[1] * grid_thw[2] / ((int64_t)merge_size * merge_size);
}
