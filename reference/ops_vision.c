/* Vision encoder ops; contracts in ops_vision.h, math in shared spec qwen3-architecture.md §6.
 * Each follows the PyTorch computation it mirrors step by step in fp32 (separate statements
 * where torch rounds between a product and a sum), so the differences from transformers are
 * only summation order and libm ulps. */
#include "reference/ops_vision.h"

#include <math.h>
#include <string.h>

#include "reference/ops.h"

void layernorm(float *out, const float *x, const float *weight, const float *bias, float eps, int n,
               int dim) {
    for (int t = 0; t < n; ++t) {
        const float *xr = x + (size_t)t * (size_t)dim;
        float *o = out + (size_t)t * (size_t)dim;
        double sum = 0.0;
        for (int i = 0; i < dim; ++i)
            sum += (double)xr[i];
        double mean = sum / (double)dim, sq = 0.0;
        for (int i = 0; i < dim; ++i) {
            double d = (double)xr[i] - mean;
            sq += d * d;
        }
        float mean_f = (float)mean;
        float rstd = (float)(1.0 / sqrt(sq / (double)dim + (double)eps));
        for (int i = 0; i < dim; ++i) {
            float centered = (xr[i] - mean_f) * rstd;
            float scaled = centered * weight[i];
            o[i] = scaled + bias[i];
        }
    }
}

void add_bias(float *x, const float *bias, int n, int dim) {
    for (int t = 0; t < n; ++t) {
        float *r = x + (size_t)t * (size_t)dim;
        for (int i = 0; i < dim; ++i)
            r[i] += bias[i];
    }
}

void gelu_tanh(float *out, const float *x, int n) {
    /* ATen's constants: kBeta = sqrt(2) * (2 / sqrt(pi)) * 0.5 = sqrt(2 / pi). */
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    for (int i = 0; i < n; ++i) {
        float z = x[i];
        float cube = z * z * z;
        float inner = beta * (z + kappa * cube);
        out[i] = 0.5f * z * (1.0f + tanhf(inner));
    }
}

void gelu_erf(float *out, const float *x, int n) {
    for (int i = 0; i < n; ++i) {
        float z = x[i];
        out[i] = 0.5f * z * (1.0f + erff(z * (float)M_SQRT1_2));
    }
}

/* Element i of linspace_f32(end, steps). */
static float linspace_at(float end, int steps, int i) {
    if (steps == 1) return 0.0f;
    float step = end / (float)(steps - 1);
    return i < steps / 2 ? step * (float)i : end - step * (float)(steps - 1 - i);
}

void linspace_f32(float *out, float end, int steps) {
    for (int i = 0; i < steps; ++i)
        out[i] = linspace_at(end, steps, i);
}

/* One raster cell (r, c) of the interpolated table (spec §6.2): torch forms each weight as an
 * fp32 product, scales each of the four table rows, then adds the scaled rows left to right. */
static void pos_embed_cell(float *out, const float *table, int grid, int h, int w, int r, int c,
                           int dim) {
    float hr = linspace_at((float)(grid - 1), h, r), wc = linspace_at((float)(grid - 1), w, c);
    int h0 = (int)hr, w0 = (int)wc; /* .int(): truncation, the values are >= 0 */
    int h1 = h0 + 1 < grid ? h0 + 1 : grid - 1, w1 = w0 + 1 < grid ? w0 + 1 : grid - 1;
    float dh = hr - (float)h0, dw = wc - (float)w0;
    float one_dh = 1.0f - dh, one_dw = 1.0f - dw;
    float w00 = one_dh * one_dw, w01 = one_dh * dw, w10 = dh * one_dw, w11 = dh * dw;
    const float *p00 = table + ((size_t)h0 * (size_t)grid + (size_t)w0) * (size_t)dim;
    const float *p01 = table + ((size_t)h0 * (size_t)grid + (size_t)w1) * (size_t)dim;
    const float *p10 = table + ((size_t)h1 * (size_t)grid + (size_t)w0) * (size_t)dim;
    const float *p11 = table + ((size_t)h1 * (size_t)grid + (size_t)w1) * (size_t)dim;
    for (int i = 0; i < dim; ++i) {
        float a = p00[i] * w00, b = p01[i] * w01, cc = p10[i] * w10, d = p11[i] * w11;
        float s = a + b;
        s = s + cc;
        out[i] = s + d;
    }
}

void vision_pos_embed(float *out, const float *table, int grid, int t, int h, int w, int merge,
                      int dim) {
    const size_t frame = (size_t)h * (size_t)w * (size_t)dim;
    size_t row = 0;
    for (int bh = 0; bh < h / merge; ++bh)
        for (int bw = 0; bw < w / merge; ++bw)
            for (int ih = 0; ih < merge; ++ih)
                for (int iw = 0; iw < merge; ++iw, ++row)
                    pos_embed_cell(out + row * (size_t)dim, table, grid, h, w, bh * merge + ih,
                                   bw * merge + iw, dim);
    for (int f = 1; f < t; ++f) /* every frame gets the same table (pos_embed.repeat(t, 1)) */
        memcpy(out + (size_t)f * frame, out, frame * sizeof(float));
}

void vision_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int row, int col,
                         int quarter) {
    for (int j = 0; j < quarter; ++j) {
        float fr = (float)row * inv_freq[j], fc = (float)col * inv_freq[j];
        cos_out[j] = cosf(fr);
        sin_out[j] = sinf(fr);
        cos_out[quarter + j] = cosf(fc);
        sin_out[quarter + j] = sinf(fc);
    }
}

/* ---------------------------------------------------------------- attention */

struct vision_attention_job {
    float *out;
    const float *qkv;
    float *scratch;
    const int *cu_seqlens;
    int n_segments, n, nh, head_dim, longest;
};

/* The segment holding row i: the last s with cu_seqlens[s] <= i (binary search). */
static int segment_of(const int *cu_seqlens, int n_segments, int i) {
    int lo = 0, hi = n_segments - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu_seqlens[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Task = one (row, head): scores over the row's segment, softmax, then P·V. Four keys run side
 * by side only to overlap independent add chains; each dot is a sequential sum in ascending d. */
static void vision_attention_task(void *ctx, int begin, int end, int worker) {
    const struct vision_attention_job *job = ctx;
    const int D = job->head_dim, HD = job->nh * D;
    const size_t ld = (size_t)3 * (size_t)HD;
    const float scale = (float)(1.0 / sqrt((double)D)); /* Python's head_dim ** -0.5 */
    float *scores = job->scratch + (size_t)worker * (size_t)job->longest;
    for (int task = begin; task < end; ++task) {
        int i = task / job->nh, h = task % job->nh;
        int s = segment_of(job->cu_seqlens, job->n_segments, i);
        int start = job->cu_seqlens[s], len = job->cu_seqlens[s + 1] - start;
        const float *q = job->qkv + (size_t)i * ld + (size_t)h * (size_t)D;
        const float *keys = job->qkv + (size_t)start * ld + (size_t)HD + (size_t)h * (size_t)D;
        const float *values = keys + HD;
        int j = 0;
        for (; j + 4 <= len; j += 4) {
            const float *k0 = keys + (size_t)j * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int d = 0; d < D; ++d) {
                s0 += q[d] * k0[d];
                s1 += q[d] * k1[d];
                s2 += q[d] * k2[d];
                s3 += q[d] * k3[d];
            }
            scores[j] = s0 * scale;
            scores[j + 1] = s1 * scale;
            scores[j + 2] = s2 * scale;
            scores[j + 3] = s3 * scale;
        }
        for (; j < len; ++j) {
            const float *kj = keys + (size_t)j * ld;
            float dot = 0.0f;
            for (int d = 0; d < D; ++d)
                dot += q[d] * kj[d];
            scores[j] = dot * scale;
        }
        softmax(scores, len);
        float *o = job->out + (size_t)i * (size_t)HD + (size_t)h * (size_t)D;
        memset(o, 0, (size_t)D * sizeof *o);
        for (j = 0; j < len; ++j) {
            const float *vj = values + (size_t)j * ld;
            float p = scores[j];
            for (int d = 0; d < D; ++d)
                o[d] += p * vj[d];
        }
    }
}

void vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                      int n_segments, int n, int nh, int head_dim, struct thread_pool *pool) {
    int longest = 0;
    for (int s = 0; s < n_segments; ++s)
        if (cu_seqlens[s + 1] - cu_seqlens[s] > longest)
            longest = cu_seqlens[s + 1] - cu_seqlens[s];
    struct vision_attention_job job = {out, qkv, scratch,  cu_seqlens, n_segments,
                                       n,   nh,  head_dim, longest};
    thread_pool_run(pool, vision_attention_task, &job, n * nh);
}
