/* Reference ops; contracts and the fixed dot-product order are in ops.h.
 *
 * matmul has two implementations of the same arithmetic: AVX2+FMA intrinsics (chosen at
 * run time with cpuid, so the build needs no -march flag) and portable C with fmaf. Both
 * use two 8-lane accumulators over 16-element blocks, the same lane-folding tree and the
 * same fma tail, so they produce identical bits. The AVX2 kernels tile 4 weight rows × 1
 * token (decode) or 1 weight row × 4 tokens (prefill) for instruction-level parallelism;
 * tiling never changes the arithmetic of one output element. */
#include "reference/ops.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OPS_HAVE_X86 1
#else
#define OPS_HAVE_X86 0
#endif

void ops_weight_row(float *out, const struct ops_weight *w, int row) {
    size_t base = (size_t)row * (size_t)w->cols;
    if (w->dtype == OPS_BF16) {
        const uint16_t *src = (const uint16_t *)w->data + base;
        for (int c = 0; c < w->cols; ++c)
            out[c] = bf16_to_f32(src[c]);
    } else {
        memcpy(out, (const float *)w->data + base, (size_t)w->cols * sizeof(float));
    }
}

/* ---------------------------------------------------------------- portable dot product */

static float fold_lanes(const float s[8]) {
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

static float portable_dot(const void *w_row, enum ops_dtype dtype, const float *x, int k_len) {
    float a0[8] = {0}, a1[8] = {0};
    int k = 0;
    if (dtype == OPS_BF16) {
        const uint16_t *w = w_row;
        for (; k + 16 <= k_len; k += 16)
            for (int l = 0; l < 8; ++l) {
                a0[l] = fmaf(bf16_to_f32(w[k + l]), x[k + l], a0[l]);
                a1[l] = fmaf(bf16_to_f32(w[k + 8 + l]), x[k + 8 + l], a1[l]);
            }
    } else {
        const float *w = w_row;
        for (; k + 16 <= k_len; k += 16)
            for (int l = 0; l < 8; ++l) {
                a0[l] = fmaf(w[k + l], x[k + l], a0[l]);
                a1[l] = fmaf(w[k + 8 + l], x[k + 8 + l], a1[l]);
            }
    }
    float s[8];
    for (int l = 0; l < 8; ++l)
        s[l] = a0[l] + a1[l];
    float r = fold_lanes(s);
    for (; k < k_len; ++k) {
        float wk = dtype == OPS_BF16 ? bf16_to_f32(((const uint16_t *)w_row)[k])
                                     : ((const float *)w_row)[k];
        r = fmaf(wk, x[k], r);
    }
    return r;
}

/* ---------------------------------------------------------------- AVX2 + FMA kernels */
#if OPS_HAVE_X86
#define AVX2_TARGET __attribute__((target("avx2,fma")))

AVX2_TARGET static inline __m256 load8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_TARGET static inline __m256 load8_f32(const float *p) {
    return _mm256_loadu_ps(p);
}

AVX2_TARGET static inline float fold_avx(__m256 a0, __m256 a1) {
    __m256 s = _mm256_add_ps(a0, a1);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* [t0+t2, t1+t3, ..] */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

/* Generates, for one weight element type, three kernels with the ops.h order:
 * dot1 (1 row × 1 token), rows4 (4 rows × 1 token), tok4 (1 row × 4 tokens). */
#define DEFINE_AVX_KERNELS(SUF, WT, LOAD, WIDEN)                                                   \
    AVX2_TARGET static float avx_dot1_##SUF(const WT *w, const float *x, int k_len) {              \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                 \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            a0 = _mm256_fmadd_ps(LOAD(w + k), _mm256_loadu_ps(x + k), a0);                         \
            a1 = _mm256_fmadd_ps(LOAD(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);                 \
        }                                                                                          \
        float r = fold_avx(a0, a1);                                                                \
        for (; k < k_len; ++k)                                                                     \
            r = fmaf(WIDEN(w[k]), x[k], r);                                                        \
        return r;                                                                                  \
    }                                                                                              \
    AVX2_TARGET static void avx_rows4_##SUF(float out[4], const WT *w, size_t ldw, const float *x, \
                                            int k_len) {                                           \
        const WT *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;                     \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                         \
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);                   \
            a00 = _mm256_fmadd_ps(LOAD(w0 + k), x0, a00);                                          \
            a01 = _mm256_fmadd_ps(LOAD(w0 + k + 8), x1, a01);                                      \
            a10 = _mm256_fmadd_ps(LOAD(w1 + k), x0, a10);                                          \
            a11 = _mm256_fmadd_ps(LOAD(w1 + k + 8), x1, a11);                                      \
            a20 = _mm256_fmadd_ps(LOAD(w2 + k), x0, a20);                                          \
            a21 = _mm256_fmadd_ps(LOAD(w2 + k + 8), x1, a21);                                      \
            a30 = _mm256_fmadd_ps(LOAD(w3 + k), x0, a30);                                          \
            a31 = _mm256_fmadd_ps(LOAD(w3 + k + 8), x1, a31);                                      \
        }                                                                                          \
        out[0] = fold_avx(a00, a01);                                                               \
        out[1] = fold_avx(a10, a11);                                                               \
        out[2] = fold_avx(a20, a21);                                                               \
        out[3] = fold_avx(a30, a31);                                                               \
        for (; k < k_len; ++k) {                                                                   \
            out[0] = fmaf(WIDEN(w0[k]), x[k], out[0]);                                             \
            out[1] = fmaf(WIDEN(w1[k]), x[k], out[1]);                                             \
            out[2] = fmaf(WIDEN(w2[k]), x[k], out[2]);                                             \
            out[3] = fmaf(WIDEN(w3[k]), x[k], out[3]);                                             \
        }                                                                                          \
    }                                                                                              \
    AVX2_TARGET static void avx_tok4_##SUF(float out[4], const WT *w, const float *x, size_t ldx,  \
                                           int k_len) {                                            \
        const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;                  \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;                         \
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;                                         \
        int k = 0;                                                                                 \
        for (; k + 16 <= k_len; k += 16) {                                                         \
            __m256 w0 = LOAD(w + k), w1 = LOAD(w + k + 8);                                         \
            a00 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a00);                               \
            a01 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a01);                           \
            a10 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), a10);                               \
            a11 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), a11);                           \
            a20 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), a20);                               \
            a21 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + k + 8), a21);                           \
            a30 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), a30);                               \
            a31 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + k + 8), a31);                           \
        }                                                                                          \
        out[0] = fold_avx(a00, a01);                                                               \
        out[1] = fold_avx(a10, a11);                                                               \
        out[2] = fold_avx(a20, a21);                                                               \
        out[3] = fold_avx(a30, a31);                                                               \
        for (; k < k_len; ++k) {                                                                   \
            float wk = WIDEN(w[k]);                                                                \
            out[0] = fmaf(wk, x0[k], out[0]);                                                      \
            out[1] = fmaf(wk, x1[k], out[1]);                                                      \
            out[2] = fmaf(wk, x2[k], out[2]);                                                      \
            out[3] = fmaf(wk, x3[k], out[3]);                                                      \
        }                                                                                          \
    }

#define WIDEN_BF16(v) bf16_to_f32(v)
#define WIDEN_F32(v) (v)
DEFINE_AVX_KERNELS(bf16, uint16_t, load8_bf16, WIDEN_BF16)
DEFINE_AVX_KERNELS(f32, float, load8_f32, WIDEN_F32)

static int cpu_has_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
}
#else
static int cpu_has_avx2(void) {
    return 0;
}
#endif

static int force_portable;

int ops_force_portable(int force) {
    force_portable = force;
    return cpu_has_avx2();
}

/* ---------------------------------------------------------------- matmul */

struct matmul_job {
    float *out;
    const float *x;
    const struct ops_weight *w;
    int n;
    int use_avx;
};

#define MATMUL_ROWS_PER_TASK 16

static void matmul_rows_portable(const struct matmul_job *job, int r0, int r1) {
    const struct ops_weight *w = job->w;
    size_t esz = w->dtype == OPS_BF16 ? 2 : 4;
    for (int r = r0; r < r1; ++r) {
        const char *row = (const char *)w->data + (size_t)r * (size_t)w->cols * esz;
        for (int t = 0; t < job->n; ++t)
            job->out[(size_t)t * (size_t)w->rows + (size_t)r] =
                portable_dot(row, w->dtype, job->x + (size_t)t * (size_t)w->cols, w->cols);
    }
}

#if OPS_HAVE_X86
#define DEFINE_AVX_ROWS(SUF, WT)                                                                   \
    static void matmul_rows_avx_##SUF(const struct matmul_job *job, int r0, int r1) {              \
        const struct ops_weight *w = job->w;                                                       \
        const WT *base = w->data;                                                                  \
        size_t ld = (size_t)w->cols, rows = (size_t)w->rows;                                       \
        float tile[4];                                                                             \
        if (job->n == 1) {                                                                         \
            int r = r0;                                                                            \
            for (; r + 4 <= r1; r += 4) {                                                          \
                avx_rows4_##SUF(tile, base + (size_t)r * ld, ld, job->x, w->cols);                 \
                memcpy(job->out + r, tile, sizeof tile);                                           \
            }                                                                                      \
            for (; r < r1; ++r)                                                                    \
                job->out[r] = avx_dot1_##SUF(base + (size_t)r * ld, job->x, w->cols);              \
            return;                                                                                \
        }                                                                                          \
        for (int r = r0; r < r1; ++r) {                                                            \
            const WT *row = base + (size_t)r * ld;                                                 \
            int t = 0;                                                                             \
            for (; t + 4 <= job->n; t += 4) {                                                      \
                avx_tok4_##SUF(tile, row, job->x + (size_t)t * ld, ld, w->cols);                   \
                for (int i = 0; i < 4; ++i)                                                        \
                    job->out[(size_t)(t + i) * rows + (size_t)r] = tile[i];                        \
            }                                                                                      \
            for (; t < job->n; ++t)                                                                \
                job->out[(size_t)t * rows + (size_t)r] =                                           \
                    avx_dot1_##SUF(row, job->x + (size_t)t * ld, w->cols);                         \
        }                                                                                          \
    }
DEFINE_AVX_ROWS(bf16, uint16_t)
DEFINE_AVX_ROWS(f32, float)
#endif

static void matmul_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct matmul_job *job = ctx;
    int r0 = begin * MATMUL_ROWS_PER_TASK;
    int r1 = end * MATMUL_ROWS_PER_TASK;
    if (r1 > job->w->rows) r1 = job->w->rows;
#if OPS_HAVE_X86
    if (job->use_avx) {
        if (job->w->dtype == OPS_BF16)
            matmul_rows_avx_bf16(job, r0, r1);
        else
            matmul_rows_avx_f32(job, r0, r1);
        return;
    }
#endif
    matmul_rows_portable(job, r0, r1);
}

void matmul(float *out, const float *x, const struct ops_weight *w, int n,
            struct thread_pool *pool) {
    struct matmul_job job = {out, x, w, n, cpu_has_avx2() && !force_portable};
    int tasks = (w->rows + MATMUL_ROWS_PER_TASK - 1) / MATMUL_ROWS_PER_TASK;
    thread_pool_run(pool, matmul_task, &job, tasks);
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
        for (int j = 0; j < ctx_len; ++j) {
            const float *kj = keys + (size_t)j * (size_t)d_len;
            float dot = 0.0f;
            for (int d = 0; d < d_len; ++d)
                dot += q[d] * kj[d];
            scores[j] = dot * scale;
        }
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
