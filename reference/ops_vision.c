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

/* Query rows per attention task: bounds the per-worker score block at ROWS x longest. */
#define VISION_ATTN_ROWS 16

size_t vision_attention_scratch(int n, int longest, int nh, int head_dim, int threads) {
    const size_t hd = (size_t)nh * (size_t)head_dim;
    return 3 * (size_t)n * hd +
           (size_t)threads * VISION_ATTN_ROWS * ((size_t)longest + (size_t)head_dim);
}

struct vision_attention_job {
    float *out;
    const float *qkv;
    float *q, *k, *vt; /* packed, see vision_attention */
    float *work;       /* [threads, ROWS, longest + D] */
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

/* Rows [begin, end): q, k of each head to [nh][n][D], v to [nh][D][len] per segment. */
static void vision_attention_pack(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct vision_attention_job *job = ctx;
    const size_t D = (size_t)job->head_dim, HD = (size_t)job->nh * D, n = (size_t)job->n;
    for (int i = begin; i < end; ++i) {
        const int s = segment_of(job->cu_seqlens, job->n_segments, i);
        const size_t start = (size_t)job->cu_seqlens[s],
                     len = (size_t)job->cu_seqlens[s + 1] - start;
        const float *row = job->qkv + (size_t)i * 3 * HD;
        for (size_t h = 0; h < (size_t)job->nh; ++h) {
            memcpy(job->q + (h * n + (size_t)i) * D, row + h * D, D * sizeof(float));
            memcpy(job->k + (h * n + (size_t)i) * D, row + HD + h * D, D * sizeof(float));
            float *vt = job->vt + h * n * D + start * D; /* [D][len] block of this segment */
            for (size_t d = 0; d < D; ++d)
                vt[d * len + ((size_t)i - start)] = row[2 * HD + h * D + d];
        }
    }
}

/* Query rows [r0, r1) of one segment and head: scores = Q K^T * scale, softmax, out = P V. Both
 * products are matmul_serial, so each score and output element has ops.h's fixed dot order. */
static void attend_rows(const struct vision_attention_job *job, float *work, int h, int s, int r0,
                        int r1) {
    const int D = job->head_dim, start = job->cu_seqlens[s];
    const int len = job->cu_seqlens[s + 1] - start, rows = r1 - r0;
    const size_t n = (size_t)job->n, hoff = (size_t)h * n * (size_t)D;
    const float scale = (float)(1.0 / sqrt((double)D)); /* Python's head_dim ** -0.5 */
    float *scores = work, *o = work + (size_t)VISION_ATTN_ROWS * (size_t)job->longest;
    const struct ops_weight keys = {job->k + hoff + (size_t)start * D, OPS_F32, len, D};
    const struct ops_weight vt = {job->vt + hoff + (size_t)start * D, OPS_F32, D, len};
    matmul_serial(scores, job->q + hoff + (size_t)r0 * D, &keys, rows);
    for (int r = 0; r < rows; ++r) {
        float *sr = scores + (size_t)r * (size_t)len;
        for (int j = 0; j < len; ++j)
            sr[j] *= scale;
        softmax(sr, len);
    }
    matmul_serial(o, scores, &vt, rows);
    for (int r = 0; r < rows; ++r)
        memcpy(job->out + (size_t)(r0 + r) * (size_t)job->nh * D + (size_t)h * D, o + (size_t)r * D,
               (size_t)D * sizeof(float));
}

/* Task = (head, block of ROWS query rows), split where a segment ends. */
static void vision_attention_task(void *ctx, int begin, int end, int worker) {
    const struct vision_attention_job *job = ctx;
    const int blocks = (job->n + VISION_ATTN_ROWS - 1) / VISION_ATTN_ROWS;
    float *work = job->work + (size_t)worker * VISION_ATTN_ROWS *
                                  ((size_t)job->longest + (size_t)job->head_dim);
    for (int task = begin; task < end; ++task) {
        const int h = task / blocks, b = task % blocks;
        int i = b * VISION_ATTN_ROWS;
        const int last = i + VISION_ATTN_ROWS < job->n ? i + VISION_ATTN_ROWS : job->n;
        while (i < last) {
            const int s = segment_of(job->cu_seqlens, job->n_segments, i);
            const int stop = job->cu_seqlens[s + 1] < last ? job->cu_seqlens[s + 1] : last;
            attend_rows(job, work, h, s, i, stop);
            i = stop;
        }
    }
}

void vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                      int n_segments, int n, int nh, int head_dim, struct thread_pool *pool) {
    int longest = 0;
    for (int s = 0; s < n_segments; ++s)
        if (cu_seqlens[s + 1] - cu_seqlens[s] > longest)
            longest = cu_seqlens[s + 1] - cu_seqlens[s];
    const size_t packed = (size_t)n * (size_t)nh * (size_t)head_dim;
    struct vision_attention_job job = {out,
                                       qkv,
                                       scratch,
                                       scratch + packed,
                                       scratch + 2 * packed,
                                       scratch + 3 * packed,
                                       cu_seqlens,
                                       n_segments,
                                       n,
                                       nh,
                                       head_dim,
                                       longest};
    thread_pool_run(pool, vision_attention_pack, &job, n);
    const int blocks = (n + VISION_ATTN_ROWS - 1) / VISION_ATTN_ROWS;
    thread_pool_run(pool, vision_attention_task, &job, nh * blocks);
}
