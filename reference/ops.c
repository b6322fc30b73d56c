/* Reference ops; contracts and the fixed dot-product order are in ops.h. A family with state
 * of its own lives in its own file: matmul in ops_matmul.c, attention (its block tree and the
 * KVP steps) in ops_attention.c. */
#include "reference/ops.h"
#include "reference/ops_q8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/dtype.h"
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

void qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm, float eps,
                  const float *cos_t, const float *sin_t, int rows, int heads, int kv_heads,
                  int head_dim) {
    const size_t half = (size_t)(head_dim / 2);
    rmsnorm(q, q, q_norm, eps, rows * heads, head_dim);
    rmsnorm(k, k, k_norm, eps, rows * kv_heads, head_dim);
    for (int t = 0; t < rows; ++t) {
        rope_apply(q + (size_t)t * (size_t)heads * (size_t)head_dim, cos_t + (size_t)t * half,
                   sin_t + (size_t)t * half, heads, head_dim);
        rope_apply(k + (size_t)t * (size_t)kv_heads * (size_t)head_dim, cos_t + (size_t)t * half,
                   sin_t + (size_t)t * half, kv_heads, head_dim);
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

void add_rmsnorm(float *out, float *h, const float *y, const float *weight, float eps, int n,
                 int dim) {
    vec_add(h, y, n * dim);
    rmsnorm(out, h, weight, eps, n, dim);
}

/* ---------------------------------------------------------------- the KV cache's store */

void kv_store(const struct ops_kv *kv, const float *k, const float *v, int row_stride, int pos,
              int n, int nkv, int head_dim) {
    const size_t bytes = (size_t)head_dim * sizeof(float);
    for (int i = 0; i < n; ++i)
        for (int g = 0; g < nkv; ++g) {
            const size_t src = (size_t)i * (size_t)row_stride + (size_t)g * (size_t)head_dim;
            const size_t dst = ops_kv_offset(kv, g, pos + i, head_dim);
            if (kv->dtype == OPS_F32) {
                memcpy((float *)kv->k + dst, k + src, bytes);
                memcpy((float *)kv->v + dst, v + src, bytes);
                continue;
            }
            uint16_t *kd = (uint16_t *)kv->k + dst, *vd = (uint16_t *)kv->v + dst;
            for (int d = 0; d < head_dim; ++d) {
                kd[d] = kv->dtype == OPS_BF16 ? f32_to_bf16(k[src + d]) : f32_to_f16(k[src + d]);
                vd[d] = kv->dtype == OPS_BF16 ? f32_to_bf16(v[src + d]) : f32_to_f16(v[src + d]);
            }
        }
}

/* ---------------------------------------------------------------- MoE sum */

/* Adds slots ids[0..c) [dim] (their experts ex[0..c) ascending, all in [a, b)) by the
 * halving tree over expert indices (moe_sum_rows). The sum lands in slot ids[0]. */
static void expert_tree(float *slots, const int *ids, const int *ex, int c, int a, int b, int dim) {
    while (c > 1) {
        const int mid = a + (b - a) / 2;
        int s = 0;
        while (s < c && ex[s] < mid)
            ++s;
        if (s == 0 || s == c) { /* one half is empty: descend into the other */
            if (s == 0)
                a = mid;
            else
                b = mid;
            continue;
        }
        expert_tree(slots, ids, ex, s, a, mid, dim);
        expert_tree(slots, ids + s, ex + s, c - s, mid, b, dim);
        vec_add(slots + (size_t)ids[0] * (size_t)dim, slots + (size_t)ids[s] * (size_t)dim, dim);
        return;
    }
}

/* Row i of out = the tree over its held slots, slot s's value at slots row
 * (slot_pos ? slot_pos[s] : s), first multiplied by weights[s] when weights is not NULL. */
static void sum_rows(float *out, float *slots, const int32_t *slot_pos, const int *experts,
                     const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                     int dim) {
    int ids[OPS_MOE_MAX_TOP_K], ex[OPS_MOE_MAX_TOP_K];
    for (int i = 0; i < n; ++i) {
        int c = 0;
        for (int t = 0; t < top_k; ++t) {
            const int s = i * top_k + t, e = experts[s];
            if (e < experts_lo || e >= experts_hi) continue; /* another rank's */
            const int id = slot_pos ? slot_pos[s] : s;
            if (weights) {
                float *y = slots + (size_t)id * (size_t)dim;
                for (int d = 0; d < dim; ++d)
                    y[d] *= weights[s];
            }
            int at = c++;
            for (; at > 0 && ex[at - 1] > e; --at) { /* ascending expert index */
                ex[at] = ex[at - 1];
                ids[at] = ids[at - 1];
            }
            ex[at] = e;
            ids[at] = id;
        }
        float *o = out + (size_t)i * (size_t)dim;
        if (!c) {
            memset(o, 0, (size_t)dim * sizeof(float));
            continue;
        }
        expert_tree(slots, ids, ex, c, experts_lo, experts_hi, dim);
        memcpy(o, slots + (size_t)ids[0] * (size_t)dim, (size_t)dim * sizeof(float));
    }
}

void moe_sum_rows(float *out, float *slots, const int *experts, int n, int top_k, int experts_lo,
                  int experts_hi, int dim) {
    sum_rows(out, slots, NULL, experts, NULL, n, top_k, experts_lo, experts_hi, dim);
}

void moe_expert_sum(float *out, float *y, const int32_t *slot_pos, const int *experts,
                    const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                    int dim) {
    sum_rows(out, y, slot_pos, experts, weights, n, top_k, experts_lo, experts_hi, dim);
}

/* ---------------------------------------------------------------- MoE grouping */

void moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos, const int *experts, int n,
               int top_k, int num_experts, int experts_lo, int experts_hi) {
    const int slots = n * top_k;
    int32_t at = 0;
    for (int s = 0; s < slots; ++s)
        slot_pos[s] = -1;
    for (int e = 0; e < num_experts; ++e) {
        offsets[e] = at;
        if (e < experts_lo || e >= experts_hi) continue;
        for (int s = 0; s < slots; ++s)
            if (experts[s] == e) {
                rows[at] = s / top_k;
                slot_pos[s] = at++;
            }
    }
    offsets[num_experts] = at;
    for (int j = at; j < slots; ++j)
        rows[j] = 0;
}

void ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n) {
    for (int i = 0; i < n; ++i)
        ops_weight_row(out + (size_t)i * (size_t)w->cols, w, rows[i]);
}

void matmul_grouped(float *out, const float *x, const struct ops_weight *ws, const int32_t *offsets,
                    int n_groups, int cap, int leaves, struct thread_pool *pool) {
    for (int g = 0; g < n_groups; ++g) {
        const int lo = offsets[g], hi = offsets[g + 1] < cap ? offsets[g + 1] : cap;
        if (hi <= lo) continue;
        float *o = out + (size_t)lo * (size_t)ws[g].rows;
        const float *xg = x + (size_t)lo * (size_t)ws[g].cols;
        if (leaves == 1)
            matmul(o, xg, &ws[g], hi - lo, pool);
        else
            matmul_split(o, xg, &ws[g], hi - lo, leaves, pool);
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

void moe_route_rows(int *experts, float *weights, const float *router_logits, int renormalize,
                    int num_experts, int top_k, int n) {
    for (int i = 0; i < n; ++i)
        moe_route(experts + (size_t)i * (size_t)top_k, weights + (size_t)i * (size_t)top_k,
                  router_logits + (size_t)i * (size_t)num_experts, renormalize, num_experts, top_k);
}
