/* Reference ops; contracts and the fixed dot-product order are in ops.h. matmul lives in
 * ops_matmul.c (one file per kernel family keeps each under the size limit). */
#include "reference/ops.h"
#include "reference/ops_q8.h"

#include <math.h>
#include <string.h>

#include "runtime/model/decoder_io.h"

void ops_weight_row(float *out, const struct ops_weight *w, int row) {
    size_t base = (size_t)row * (size_t)w->cols;
    if (w->dtype == OPS_BF16) {
        const uint16_t *src = (const uint16_t *)w->data + base;
        for (int c = 0; c < w->cols; ++c)
            out[c] = bf16_to_f32(src[c]);
    } else if (w->dtype == OPS_Q8) {
        ops_q8_dequantize_row(out, w, row);
    } else {
        memcpy(out, (const float *)w->data + base, (size_t)w->cols * sizeof(float));
    }
}

/* ---------------------------------------------------------------- elementwise and norms */

void rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim) {
    for (int t = 0; t < n; ++t) {
        const float *xr = x + (size_t)t * (size_t)dim;
        float *o = out + (size_t)t * (size_t)dim;
        double sum = 0.0;
        for (int i = 0; i < dim; ++i)
            sum += (double)xr[i] * (double)xr[i];
        float variance = (float)(sum / (double)dim);
        float scale = 1.0f / sqrtf(variance + eps);
        for (int i = 0; i < dim; ++i)
            o[i] = weight[i] * (xr[i] * scale);
    }
}

void rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                  int pos_w, const int *mrope_section, int half) {
    for (int j = 0; j < half; ++j) {
        int p = pos_t;
        if (mrope_section) {
            if (j % 3 == 1 && j < 3 * mrope_section[1])
                p = pos_h;
            else if (j % 3 == 2 && j < 3 * mrope_section[2])
                p = pos_w;
        }
        float angle = (float)p * inv_freq[j];
        cos_out[j] = cosf(angle);
        sin_out[j] = sinf(angle);
    }
}

void rope_inv_freq(float *inv_freq, float theta, int head_dim) {
    for (int j = 0; j < head_dim / 2; ++j)
        inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
}

void rope_tables(float *cos_out, float *sin_out, const float *inv_freq,
                 const struct forward_item *items, int n_items, const int *mrope_section,
                 int half) {
    size_t row = 0;
    for (int it = 0; it < n_items; ++it) {
        const struct forward_item *item = &items[it];
        for (int i = 0; i < item->n_tokens; ++i, ++row) {
            int pt = item->pos + i, ph = pt, pw = pt;
            if (item->mrope_positions) {
                pt = item->mrope_positions[i];
                ph = item->mrope_positions[item->n_tokens + i];
                pw = item->mrope_positions[2 * item->n_tokens + i];
            }
            rope_cos_sin(cos_out + row * (size_t)half, sin_out + row * (size_t)half, inv_freq, pt,
                         ph, pw, mrope_section, half);
        }
    }
}

void rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; ++h) {
        float *v = x + (size_t)h * (size_t)head_dim;
        for (int j = 0; j < half; ++j) {
            float a = v[j], b = v[j + half];
            v[j] = a * cos_t[j] - b * sin_t[j];
            v[j + half] = b * cos_t[j] + a * sin_t[j];
        }
    }
}

void swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; ++i) {
        float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; ++i)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; ++i)
        x[i] *= inv;
}

void vec_add(float *x, const float *y, int n) {
    for (int i = 0; i < n; ++i)
        x[i] += y[i];
}

/* ---------------------------------------------------------------- attention */

struct attention_job {
    float *out;
    const float *q;
    const float *k_cache, *v_cache;
    size_t kv_head_stride;
    float *scratch;
    int pos, n, nh, nkv, head_dim;
};

/* scores [ctx_len] = (q · k_j) * scale, each dot a sequential fp32 sum in ascending d.
 * Four keys run side by side only so their independent add chains overlap (a single chain
 * is add-latency bound); every score still sees exactly the same operations in the same
 * order, so the bits do not change. */
static void attention_scores(float *scores, const float *q, const float *keys, int ctx_len,
                             int d_len, float scale) {
    size_t ld = (size_t)d_len;
    int j = 0;
    for (; j + 4 <= ctx_len; j += 4) {
        const float *k0 = keys + (size_t)j * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int d = 0; d < d_len; ++d) {
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
    for (; j < ctx_len; ++j) {
        const float *kj = keys + (size_t)j * ld;
        float dot = 0.0f;
        for (int d = 0; d < d_len; ++d)
            dot += q[d] * kj[d];
        scores[j] = dot * scale;
    }
}

/* Task = one (query token, query head) pair. */
static void attention_task(void *ctx, int begin, int end, int worker) {
    const struct attention_job *job = ctx;
    int d_len = job->head_dim, group = job->nh / job->nkv;
    float scale = 1.0f / sqrtf((float)d_len);
    float *scores = job->scratch + (size_t)worker * (size_t)(job->pos + job->n);
    for (int task = begin; task < end; ++task) {
        int i = task / job->nh, h = task % job->nh;
        int ctx_len = job->pos + i + 1;
        const float *q = job->q + ((size_t)i * (size_t)job->nh + (size_t)h) * (size_t)d_len;
        const float *keys = job->k_cache + (size_t)(h / group) * job->kv_head_stride;
        const float *values = job->v_cache + (size_t)(h / group) * job->kv_head_stride;
        attention_scores(scores, q, keys, ctx_len, d_len, scale);
        softmax(scores, ctx_len);
        float *o = job->out + ((size_t)i * (size_t)job->nh + (size_t)h) * (size_t)d_len;
        for (int d = 0; d < d_len; ++d)
            o[d] = 0.0f;
        for (int j = 0; j < ctx_len; ++j) {
            const float *vj = values + (size_t)j * (size_t)d_len;
            float p = scores[j];
            for (int d = 0; d < d_len; ++d)
                o[d] += p * vj[d];
        }
    }
}

void attention(float *out, const float *q, const float *k_cache, const float *v_cache,
               size_t kv_head_stride, float *scratch, int pos, int n, int nh, int nkv, int head_dim,
               struct thread_pool *pool) {
    struct attention_job job = {out, q, k_cache, v_cache, kv_head_stride, scratch,
                                pos, n, nh,      nkv,     head_dim};
    thread_pool_run(pool, attention_task, &job, n * nh);
}

/* KV parallelism: one (query token, query head) pair over the keys this rank holds. */
struct partial_job {
    float *part;
    const float *q, *k_cache, *v_cache;
    size_t kv_head_stride;
    float *scratch;
    int pos, n, lo, held, nh, nkv, head_dim;
};

static void partial_task(void *ctx, int begin, int end, int worker) {
    const struct partial_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv;
    const float scale = 1.0f / sqrtf((float)d_len);
    float *scores = job->scratch + (size_t)worker * (size_t)job->held;
    for (int task = begin; task < end; ++task) {
        const int i = task / job->nh, h = task % job->nh;
        int seen = job->pos + i + 1 - job->lo; /* keys [lo, pos + i] held here */
        if (seen > job->held) seen = job->held;
        float *o = job->part + (size_t)task * (size_t)(d_len + 2);
        for (int d = 0; d < d_len + 2; ++d)
            o[d] = 0.0f;
        if (seen <= 0) {
            o[d_len] = -INFINITY;
            continue;
        }
        const float *q = job->q + (size_t)task * (size_t)d_len;
        const float *keys = job->k_cache + (size_t)(h / group) * job->kv_head_stride;
        const float *values = job->v_cache + (size_t)(h / group) * job->kv_head_stride;
        attention_scores(scores, q, keys, seen, d_len, scale);
        float max = scores[0], sum = 0.0f;
        for (int j = 1; j < seen; ++j)
            if (scores[j] > max) max = scores[j];
        for (int j = 0; j < seen; ++j) {
            const float p = expf(scores[j] - max);
            const float *vj = values + (size_t)j * (size_t)d_len;
            sum += p;
            for (int d = 0; d < d_len; ++d)
                o[d] += p * vj[d];
        }
        o[d_len] = max;
        o[d_len + 1] = sum;
    }
}

void attention_partial(float *part, const float *q, const float *k_cache, const float *v_cache,
                       size_t kv_head_stride, float *scratch, int pos, int n, int lo, int held,
                       int nh, int nkv, int head_dim, struct thread_pool *pool) {
    struct partial_job job = {part, q,    k_cache, v_cache, kv_head_stride, scratch, pos, n,
                              lo,   held, nh,      nkv,     head_dim};
    thread_pool_run(pool, partial_task, &job, n * nh);
}

void attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim) {
    const size_t w = (size_t)head_dim + 2, per_rank = (size_t)n * (size_t)nh * w;
    for (size_t t = 0; t < (size_t)n * (size_t)nh; ++t) {
        float m = -INFINITY, l = 0.0f;
        for (int k = 0; k < ranks; ++k) {
            const float mk = parts[(size_t)k * per_rank + t * w + (size_t)head_dim];
            if (mk > m) m = mk;
        }
        float *o = out + t * (size_t)head_dim;
        for (int d = 0; d < head_dim; ++d)
            o[d] = 0.0f;
        for (int k = 0; k < ranks; ++k) {
            const float *p = parts + (size_t)k * per_rank + t * w;
            if (p[head_dim + 1] == 0.0f) continue; /* no keys on rank k */
            const float c = expf(p[head_dim] - m);
            l += p[head_dim + 1] * c;
            for (int d = 0; d < head_dim; ++d)
                o[d] += p[d] * c;
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < head_dim; ++d)
            o[d] *= inv;
    }
}

/* ---------------------------------------------------------------- MoE routing */

void moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
               int num_experts, int top_k) {
    /* Softmax over E in fp32 without a scratch buffer: max, then the sum of exps. */
    float max = router_logits[0];
    for (int e = 1; e < num_experts; ++e)
        if (router_logits[e] > max) max = router_logits[e];
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e)
        sum += expf(router_logits[e] - max);
    float inv = 1.0f / sum;
    /* Selection sort of the top_k: strictly greater wins, so ties keep the lower index. */
    for (int t = 0; t < top_k; ++t) {
        int best = -1;
        float best_p = 0.0f;
        for (int e = 0; e < num_experts; ++e) {
            int taken = 0;
            for (int u = 0; u < t; ++u)
                taken |= experts[u] == e;
            if (taken) continue;
            float p = expf(router_logits[e] - max) * inv;
            if (best < 0 || p > best_p) {
                best = e;
                best_p = p;
            }
        }
        experts[t] = best;
        weights[t] = best_p;
    }
    if (renormalize) {
        float total = 0.0f;
        for (int t = 0; t < top_k; ++t)
            total += weights[t];
        for (int t = 0; t < top_k; ++t)
            weights[t] /= total;
    }
}
