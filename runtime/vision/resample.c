/* torchvision's antialiased bicubic resize on u8 images, as ATen's _upsample_bicubic2d_aa
 * runs it on CPU (UpSampleKernel.cpp, UpSampleKernelAVXAntialias.h; spec
 * qwen3-vl-preprocessing.md §5.1–§5.2): separable, double weights from Keys' cubic (a = -0.5)
 * normalised per output, quantised to int16 with a per-axis precision, int32 accumulation,
 * u8 intermediate, width pass first. The AVX2 and generic kernels give the same bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/vision/preprocess.h"

/* HelperInterpCubic::aa_filter with a = -0.5 (UpSample.h cubic_convolution1/2), in the
 * evaluation order of the source: f64 rounding is part of the result (spec §5.2). */
static double aa_cubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
}

/* _compute_indices_min_size_weights_aa for one output: taps and normalised f64 weights. */
static void axis_weights_f64(double *w, int *xmin_out, int *xsize_out, int o, double scale,
                             double support, double invscale, int in_size, int ksize) {
    double center = scale * (o + 0.5);
    int64_t xmin = (int64_t)(center - support + 0.5); /* truncation toward zero */
    if (xmin < 0) xmin = 0;
    int64_t xsize = (int64_t)(center + support + 0.5);
    if (xsize > in_size) xsize = in_size;
    xsize -= xmin;
    if (xsize < 0) xsize = 0;
    if (xsize > ksize) xsize = ksize;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; j++) {
        double v = aa_cubic(((double)(j + xmin) - center + 0.5) * invscale);
        w[j] = v;
        total += v;
    }
    for (int64_t j = 0; j < xsize; j++)
        if (total != 0.0) w[j] /= total;
    for (int64_t j = xsize; j < ksize; j++)
        w[j] = 0.0;
    *xmin_out = (int)xmin;
    *xsize_out = (int)xsize;
}

/* _compute_index_ranges_int16_weights: the largest precision whose doubled largest weight
 * still fits in int16, then round half away from zero. */
static void axis_quantise(struct vision_resample_axis *ax, const double *w, size_t n) {
    double wt_max = 0.0;
    for (size_t i = 0; i < n; i++)
        wt_max = w[i] > wt_max ? w[i] : wt_max;
    int p;
    for (p = 0; p < 22; ++p)
        if ((int)(0.5 + wt_max * (1 << (p + 1))) >= (1 << 15)) break;
    ax->precision = p;
    for (size_t i = 0; i < n; i++) {
        double v = w[i] * (1 << p);
        ax->weights[i] = (int16_t)(v < 0 ? (int)(v - 0.5) : (int)(v + 0.5));
    }
}

int vision_resample_axis_init(struct vision_resample_axis *ax, int in_size, int out_size) {
    memset(ax, 0, sizeof *ax);
    if (in_size <= 0 || out_size <= 0)
        return strata_set_error(STRATA_EINVAL, "resample: sizes must be positive (%d -> %d)",
                                in_size, out_size);
    double scale = (double)in_size / out_size;
    double support = scale >= 1.0 ? 2.0 * scale : 2.0; /* interp_size 4, halved */
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    ax->in_size = in_size;
    ax->out_size = out_size;
    ax->ksize = (int)ceil(support) * 2 + 1;
    size_t n = (size_t)out_size * (size_t)ax->ksize;
    double *w = malloc(n * sizeof *w);
    ax->xmin = malloc((size_t)out_size * sizeof *ax->xmin);
    ax->xsize = malloc((size_t)out_size * sizeof *ax->xsize);
    ax->weights = malloc(n * sizeof *ax->weights);
    if (!w || !ax->xmin || !ax->xsize || !ax->weights) {
        free(w);
        vision_resample_axis_free(ax);
        return strata_set_error(STRATA_ENOMEM, "resample: out of memory (%d -> %d)", in_size,
                                out_size);
    }
    for (int o = 0; o < out_size; o++)
        axis_weights_f64(w + (size_t)o * ax->ksize, &ax->xmin[o], &ax->xsize[o], o, scale, support,
                         invscale, in_size, ax->ksize);
    axis_quantise(ax, w, n);
    free(w);
    return STRATA_OK;
}

void vision_resample_axis_free(struct vision_resample_axis *ax) {
    if (!ax) return;
    free(ax->xmin);
    free(ax->xsize);
    free(ax->weights);
    memset(ax, 0, sizeof *ax);
}

static uint8_t clamp_u8(int32_t v) {
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One pass over `n_lines` lines of `ax->in_size` pixels (3 channels) whose consecutive pixels
 * are `step` bytes apart and consecutive lines `line_stride` bytes apart. */
static void resample_pass(uint8_t *dst, size_t dst_step, size_t dst_line, const uint8_t *src,
                          size_t src_step, size_t src_line, int n_lines,
                          const struct vision_resample_axis *ax) {
    const int32_t half = 1 << (ax->precision - 1);
    for (int l = 0; l < n_lines; l++) {
        const uint8_t *s = src + (size_t)l * src_line;
        uint8_t *d = dst + (size_t)l * dst_line;
        for (int o = 0; o < ax->out_size; o++) {
            const int16_t *w = ax->weights + (size_t)o * ax->ksize;
            const uint8_t *p = s + (size_t)ax->xmin[o] * src_step;
            int32_t acc[3] = {half, half, half};
            for (int j = 0; j < ax->xsize[o]; j++, p += src_step)
                for (int c = 0; c < 3; c++)
                    acc[c] += (int32_t)w[j] * p[c];
            for (int c = 0; c < 3; c++)
                d[(size_t)o * dst_step + c] = clamp_u8(acc[c] >> ax->precision);
        }
    }
}

/* Resizes one axis of `in` (width when horizontal) into a new image. */
static int resize_axis(struct image_rgb8 *out, const struct image_rgb8 *in, int horizontal,
                       int out_size) {
    struct vision_resample_axis ax;
    int rc = vision_resample_axis_init(&ax, horizontal ? in->width : in->height, out_size);
    if (rc != STRATA_OK) return rc;
    int ow = horizontal ? out_size : in->width, oh = horizontal ? in->height : out_size;
    out->data = malloc((size_t)ow * oh * 3);
    if (!out->data) {
        vision_resample_axis_free(&ax);
        return strata_set_error(STRATA_ENOMEM, "resize: out of memory for %dx%d", ow, oh);
    }
    out->width = ow;
    out->height = oh;
    size_t in_row = (size_t)in->width * 3, out_row = (size_t)ow * 3;
    if (horizontal)
        resample_pass(out->data, 3, out_row, in->data, 3, in_row, in->height, &ax);
    else /* a "line" is a column: pixels one row apart, lines one pixel apart */
        resample_pass(out->data, out_row, 3, in->data, in_row, 3, in->width, &ax);
    vision_resample_axis_free(&ax);
    return STRATA_OK;
}

int vision_resize_bicubic_aa(struct image_rgb8 *out, const struct image_rgb8 *in, int out_w,
                             int out_h) {
    memset(out, 0, sizeof *out);
    if (!in || !in->data || in->width <= 0 || in->height <= 0 || out_w <= 0 || out_h <= 0)
        return strata_set_error(STRATA_EINVAL, "resize: empty image or target");
    struct image_rgb8 cur = *in, tmp = {0, 0, NULL};
    if (out_w != in->width) { /* only the axes that change run (ATen need_horizontal) */
        int rc = resize_axis(&tmp, in, 1, out_w);
        if (rc != STRATA_OK) return rc;
        cur = tmp;
    }
    if (out_h != in->height) {
        int rc = resize_axis(out, &cur, 0, out_h);
        image_rgb8_free(&tmp);
        return rc;
    }
    if (tmp.data) {
        *out = tmp;
        return STRATA_OK;
    }
    size_t n = (size_t)in->width * in->height * 3;
    if (!(out->data = malloc(n))) return strata_set_error(STRATA_ENOMEM, "resize: out of memory");
    memcpy(out->data, in->data, n);
    out->width = in->width;
    out->height = in->height;
    return STRATA_OK;
}
