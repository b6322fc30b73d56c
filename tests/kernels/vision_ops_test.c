/* The CUDA twins of reference/ops_vision.h (kernels/ops_vision.h) against the reference ops
 * themselves on random inputs, judged by normalised MSE, sum (a-b)^2 / sum b^2: 1e-7 for
 * the fp32 paths whose libm calls differ by ulps (LayerNorm's double moments summed as a
 * tree, GELU tanh / erf, the 2-D RoPE table), and 0 (bitwise) for the ops that are pure
 * correctly rounded fp32 sequences (bias add, linspace, the interpolated position table).
 * Shapes: one row, odd sizes, the Qwen3-VL tower's (hidden 1152, MLP 4304, merger 4608),
 * several frames. LayerNorm also in place. vision_attention: NMSE 1e-7 on random q, k, v
 * (CUDA's expf), and bitwise with q = 0 (every exp is exactly 1, so the scores' and the
 * outputs' matmul-ordered dots and the sequential softmax sum are all that is left).
 * Prints "skipped: <reason>" without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/ops_vision.h"
#include "reference/ops_vision.h"
#include "reference/thread_pool.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

#define NMSE_FP32 1e-7

static unsigned seed = 2024u;

static float uniform(void) {
    seed = seed * 1664525u + 1013904223u;
    return (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static float *host_random(size_t n, float scale, float offset) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; p && i < n; ++i)
        p[i] = offset + scale * uniform();
    return p;
}

/* A device copy of host floats (NULL on failure, message set). */
static float *upload(const float *h, size_t n) {
    float *d = NULL;
    if (cuda_malloc((void **)&d, n * sizeof *d)) return NULL;
    if (cuda_memcpy_to_device(d, h, n * sizeof *d)) {
        cuda_free(d);
        return NULL;
    }
    return d;
}

/* Downloads d [n] after synchronising, frees it, compares with want: 0 when within bound. */
static int judge(const char *what, float *d, const float *want, size_t n, double bound, int rc) {
    float *got = malloc((n ? n : 1) * sizeof *got);
    if (!rc && !got) rc = STRATA_ENOMEM;
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, d, n * sizeof *got);
    cuda_free(d);
    if (rc) {
        printf("FAIL %s: %s\n", what, strata_last_error());
        free(got);
        return 1;
    }
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; ++i) {
        double e = (double)got[i] - (double)want[i];
        err += e * e;
        ref += (double)want[i] * (double)want[i];
    }
    double nmse = ref > 0 ? err / ref : err;
    int ok = bound == 0 ? memcmp(got, want, n * sizeof *got) == 0 : nmse <= bound;
    printf("%s %s: nmse %.3g (bound %s)\n", ok ? "ok  " : "FAIL", what, nmse,
           bound == 0 ? "bitwise" : "1e-7");
    free(got);
    return !ok;
}

static int check_layernorm(int n, int dim, int in_place) {
    char what[96];
    size_t sz = (size_t)n * dim;
    float *x = host_random(sz, 3.0f, 0.5f), *w = host_random((size_t)dim, 0.5f, 1.0f);
    float *b = host_random((size_t)dim, 0.2f, 0.0f), *want = malloc(sz * sizeof *want);
    layernorm(want, x, w, b, 1e-6f, n, dim);
    float *dx = upload(x, sz), *dw = upload(w, (size_t)dim), *db = upload(b, (size_t)dim);
    float *dout = NULL;
    int rc = dx && dw && db ? 0 : STRATA_EDEVICE;
    if (!rc && !in_place) rc = cuda_malloc((void **)&dout, sz * sizeof *dout);
    if (in_place) dout = dx, dx = NULL;
    if (!rc) rc = cuda_layernorm(dout, in_place ? dout : dx, dw, db, 1e-6f, n, dim, NULL);
    snprintf(what, sizeof what, "layernorm [%d, %d]%s", n, dim, in_place ? " in place" : "");
    int bad = judge(what, dout, want, sz, NMSE_FP32, rc);
    cuda_free(dx), cuda_free(dw), cuda_free(db);
    free(x), free(w), free(b), free(want);
    return bad;
}

static int check_add_bias(int n, int dim) {
    char what[96];
    size_t sz = (size_t)n * dim;
    float *x = host_random(sz, 2.0f, 0.0f), *b = host_random((size_t)dim, 1.0f, 0.0f);
    float *dx = upload(x, sz), *db = upload(b, (size_t)dim);
    int rc = dx && db ? cuda_add_bias(dx, db, n, dim, NULL) : STRATA_EDEVICE;
    add_bias(x, b, n, dim);
    snprintf(what, sizeof what, "add_bias [%d, %d]", n, dim);
    int bad = judge(what, dx, x, sz, 0, rc);
    cuda_free(db);
    free(x), free(b);
    return bad;
}

static int check_gelu(int n, int erf_form) {
    char what[96];
    float *x = host_random((size_t)n, 6.0f, 0.0f), *want = malloc((size_t)n * sizeof *want);
    if (erf_form)
        gelu_erf(want, x, n);
    else
        gelu_tanh(want, x, n);
    float *dx = upload(x, (size_t)n);
    int rc = !dx        ? STRATA_EDEVICE
             : erf_form ? cuda_gelu_erf(dx, dx, n, NULL)
                        : cuda_gelu_tanh(dx, dx, n, NULL);
    snprintf(what, sizeof what, "gelu_%s [%d] in place", erf_form ? "erf" : "tanh", n);
    int bad = judge(what, dx, want, (size_t)n, NMSE_FP32, rc);
    free(x), free(want);
    return bad;
}

static int check_linspace(float end, int steps) {
    char what[96];
    float *want = malloc((size_t)steps * sizeof *want), *d = NULL;
    linspace_f32(want, end, steps);
    int rc = cuda_malloc((void **)&d, (size_t)steps * sizeof *d);
    if (!rc) rc = cuda_linspace_f32(d, end, steps, NULL);
    snprintf(what, sizeof what, "linspace_f32 (%g, %d)", end, steps);
    int bad = judge(what, d, want, (size_t)steps, 0, rc);
    free(want);
    return bad;
}

static int check_pos_embed(int grid, int t, int h, int w, int merge, int dim) {
    char what[96];
    size_t tsz = (size_t)grid * grid * dim, sz = (size_t)t * h * w * dim;
    float *table = host_random(tsz, 1.0f, 0.0f), *want = malloc(sz * sizeof *want), *d = NULL;
    vision_pos_embed(want, table, grid, t, h, w, merge, dim);
    float *dt = upload(table, tsz);
    int rc = dt ? cuda_malloc((void **)&d, sz * sizeof *d) : STRATA_EDEVICE;
    if (!rc) rc = cuda_vision_pos_embed(d, dt, grid, t, h, w, merge, dim, NULL);
    snprintf(what, sizeof what, "vision_pos_embed grid %d, t %d, %dx%d, merge %d, dim %d", grid, t,
             h, w, merge, dim);
    int bad = judge(what, d, want, sz, 0, rc);
    cuda_free(dt);
    free(table), free(want);
    return bad;
}

static int check_vision_rope(int row, int col, int quarter) {
    char what[96];
    float *inv = malloc((size_t)quarter * sizeof *inv), *want = malloc(4 * (size_t)quarter * 4);
    for (int j = 0; j < quarter; ++j)
        inv[j] = powf(10000.0f, -(float)j / (float)quarter);
    vision_rope_cos_sin(want, want + 2 * quarter, inv, row, col, quarter);
    float *dinv = upload(inv, (size_t)quarter), *d = NULL;
    int rc = dinv ? cuda_malloc((void **)&d, 4 * (size_t)quarter * sizeof *d) : STRATA_EDEVICE;
    if (!rc) rc = cuda_vision_rope_cos_sin(d, d + 2 * quarter, dinv, row, col, quarter, NULL);
    snprintf(what, sizeof what, "vision_rope_cos_sin (%d, %d), quarter %d", row, col, quarter);
    int bad = judge(what, d, want, 4 * (size_t)quarter, NMSE_FP32, rc);
    cuda_free(dinv);
    free(inv), free(want);
    return bad;
}

/* Segments of the given lengths (frames), nh heads of head_dim D. */
static int check_vision_attention(const int *lens, int n_segments, int nh, int D, int zero_q) {
    int cu[9] = {0}, longest = 0;
    for (int k = 0; k < n_segments; ++k) {
        cu[k + 1] = cu[k] + lens[k];
        if (lens[k] > longest) longest = lens[k];
    }
    const int n = cu[n_segments];
    const size_t hd = (size_t)nh * (size_t)D, qkv_n = (size_t)n * 3 * hd;
    float *qkv = host_random(qkv_n, 1.0f, 0.0f), *want = malloc(hd * (size_t)n * sizeof *want);
    struct thread_pool *pool = NULL;
    float *work = malloc(vision_attention_scratch(n, longest, nh, D, 1) * sizeof *work);
    if (!qkv || !want || !work || thread_pool_init(&pool, 1)) {
        printf("FAIL vision_attention: out of host memory\n");
        free(qkv), free(want), free(work);
        return 1;
    }
    for (int i = 0; zero_q && i < n; ++i)
        memset(qkv + (size_t)i * 3 * hd, 0, hd * sizeof *qkv);
    vision_attention(want, qkv, work, cu, n_segments, n, nh, D, pool);
    float *dqkv = upload(qkv, qkv_n), *d = NULL, *dscratch = NULL;
    int rc = dqkv ? 0 : -1;
    if (!rc) rc = cuda_malloc((void **)&d, hd * (size_t)n * sizeof(float));
    if (!rc)
        rc = cuda_malloc((void **)&dscratch,
                         cuda_vision_attention_scratch(longest, nh) * sizeof(float));
    if (!rc) rc = cuda_vision_attention(d, dqkv, dscratch, cu, n_segments, n, nh, D, NULL);
    char what[96];
    snprintf(what, sizeof what, "vision_attention(%d segments, n %d, nh %d, D %d%s)", n_segments, n,
             nh, D, zero_q ? ", q = 0" : "");
    int bad = judge(what, d, want, hd * (size_t)n, zero_q ? 0 : NMSE_FP32, rc);
    cuda_free(dqkv);
    cuda_free(dscratch);
    thread_pool_free(pool);
    free(qkv), free(want), free(work);
    return bad;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = 0;
    failures += check_layernorm(1, 7, 0);
    failures += check_layernorm(37, 1152, 0);
    failures += check_layernorm(5, 4608, 1);
    failures += check_add_bias(1, 1);
    failures += check_add_bias(33, 1152);
    failures += check_gelu(1, 0);
    failures += check_gelu(4304 * 3 + 5, 0);
    failures += check_gelu(4608 * 2 + 1, 1);
    failures += check_linspace(47.0f, 1);
    failures += check_linspace(47.0f, 28);
    failures += check_linspace(47.0f, 97);
    failures += check_pos_embed(48, 1, 28, 36, 2, 1152);
    failures += check_pos_embed(4, 3, 6, 2, 2, 5);
    failures += check_vision_rope(0, 0, 16);
    failures += check_vision_rope(27, 143, 16);
    static const int one[] = {1}, frames[] = {64, 64, 64}, image[] = {784}, mixed[] = {17, 300};
    failures += check_vision_attention(one, 1, 1, 8, 0);
    failures += check_vision_attention(frames, 3, 4, 72, 0); /* D 72: a K % 16 tail */
    failures += check_vision_attention(image, 1, 16, 72, 0); /* a 28 x 28 patch image */
    failures += check_vision_attention(mixed, 2, 3, 64, 0);
    failures += check_vision_attention(mixed, 2, 3, 72, 1); /* bitwise */
    failures += check_vision_attention(image, 1, 16, 72, 1);
    float *d = NULL;
    if (!cuda_malloc((void **)&d, 64)) {
        int refused = cuda_layernorm(d, d, d, d, 1e-6f, 1, 0, NULL) == STRATA_EINVAL &&
                      cuda_vision_pos_embed(d, d, 4, 1, 3, 2, 2, 4, NULL) == STRATA_EINVAL &&
                      cuda_linspace_f32(d, 1.0f, 0, NULL) == STRATA_EINVAL &&
                      cuda_vision_attention(d, d, d, (const int[]){0, 3}, 1, 2, 1, 8, NULL) ==
                          STRATA_EINVAL &&
                      cuda_vision_attention(d, d, d, (const int[]){0, 2}, 1, 2, 1, 257, NULL) ==
                          STRATA_EINVAL;
        printf("%s bad arguments refused\n", refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
