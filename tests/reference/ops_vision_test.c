/* Unit tests of reference/ops_vision.h against straightforward double-precision loops on small
 * random inputs, plus the properties the encoder relies on: linspace end points are exact,
 * the position table comes out in merge-window order, and segment attention gives the same
 * bits at any thread count and never looks across a segment boundary. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/ops_vision.h"
#include "reference/thread_pool.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *random_floats(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < n; ++i)
        x[i] = scale * frand();
    return x;
}

/* |got - want| <= tol * (1 + |want|) for every element, with the worst one reported. */
static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        double err = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (!(err <= worst)) {
            worst = err;
            at = i;
        }
    }
    if (!(worst <= tol))
        fail_msg("%s: element %zu is %.9g, want %.9g (scaled error %.3g > %.3g)", what, at,
                 (double)got[at], want[at], worst, tol);
}

static void test_layernorm(void **state) {
    (void)state;
    const int n = 5, dim = 37;
    float *x = random_floats((size_t)n * dim, 3.0f), *w = random_floats(dim, 1.0f);
    float *b = random_floats(dim, 0.5f), *out = malloc((size_t)n * dim * sizeof(float));
    double *want = malloc((size_t)n * dim * sizeof(double));
    for (int i = 0; i < dim; ++i) /* an offset row checks the centring */
        x[i] += 100.0f;
    for (int t = 0; t < n; ++t) {
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < dim; ++i)
            mean += x[t * dim + i];
        mean /= dim;
        for (int i = 0; i < dim; ++i)
            var += (x[t * dim + i] - mean) * (x[t * dim + i] - mean);
        var /= dim; /* biased, as torch.nn.LayerNorm */
        for (int i = 0; i < dim; ++i)
            want[t * dim + i] = (x[t * dim + i] - mean) / sqrt(var + 1e-6) * w[i] + b[i];
    }
    layernorm(out, x, w, b, 1e-6f, n, dim);
    assert_close(out, want, (size_t)n * dim, 2e-6, "layernorm");
    layernorm(x, x, w, b, 1e-6f, n, dim); /* in place */
    assert_memory_equal(x, out, (size_t)n * dim * sizeof(float));
    free(x);
    free(w);
    free(b);
    free(out);
    free(want);
}

static void test_add_bias(void **state) {
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {0.5f, -1, 2};
    add_bias(x, bias, 2, 3);
    const float want[6] = {1.5f, 1, 5, 4.5f, 4, 8};
    assert_memory_equal(x, want, sizeof want);
}

static void test_gelu(void **state) {
    (void)state;
    const int n = 257;
    float *x = random_floats(n, 6.0f), *out = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    x[0] = 0.0f;
    x[1] = -10.0f;
    x[2] = 10.0f;
    for (int i = 0; i < n; ++i) {
        double z = x[i];
        want[i] = 0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    }
    gelu_tanh(out, x, n);
    assert_close(out, want, n, 1e-6, "gelu_tanh");
    for (int i = 0; i < n; ++i)
        want[i] = 0.5 * (double)x[i] * (1.0 + erf((double)x[i] / sqrt(2.0)));
    gelu_erf(out, x, n);
    assert_close(out, want, n, 1e-6, "gelu_erf");
    assert_true(out[0] == 0.0f);
    free(x);
    free(out);
    free(want);
}

static void test_linspace(void **state) {
    (void)state;
    const int sides[] = {1, 2, 3, 6, 7, 28, 33, 100};
    for (size_t s = 0; s < sizeof sides / sizeof sides[0]; ++s) {
        int steps = sides[s];
        float out[100];
        double want[100];
        linspace_f32(out, 47.0f, steps);
        for (int i = 0; i < steps; ++i)
            want[i] = steps == 1 ? 0.0 : 47.0 * i / (steps - 1);
        assert_close(out, want, (size_t)steps, 1e-6, "linspace");
        assert_true(out[0] == 0.0f);
        if (steps > 1) assert_true(out[steps - 1] == 47.0f); /* end is exact, as in torch */
    }
}

/* Bilinear sample of table [G*G, dim] at raster cell (r, c) of an h x w grid, in double. */
static void bilinear(double *out, const float *table, int G, int h, int w, int r, int c, int dim) {
    double hr = h == 1 ? 0.0 : (double)(G - 1) * r / (h - 1);
    double wc = w == 1 ? 0.0 : (double)(G - 1) * c / (w - 1);
    int h0 = (int)hr, w0 = (int)wc, h1 = h0 + 1 < G ? h0 + 1 : G - 1,
        w1 = w0 + 1 < G ? w0 + 1 : G - 1;
    double dh = hr - h0, dw = wc - w0;
    for (int i = 0; i < dim; ++i)
        out[i] = (1 - dh) * (1 - dw) * table[(h0 * G + w0) * dim + i] +
                 (1 - dh) * dw * table[(h0 * G + w1) * dim + i] +
                 dh * (1 - dw) * table[(h1 * G + w0) * dim + i] +
                 dh * dw * table[(h1 * G + w1) * dim + i];
}

static void check_pos_embed(int G, int t, int h, int w, int merge, int dim) {
    float *table = random_floats((size_t)G * G * dim, 1.0f);
    size_t rows = (size_t)t * h * w;
    float *out = malloc(rows * dim * sizeof(float));
    double *want = malloc(rows * dim * sizeof(double));
    size_t row = 0;
    for (int f = 0; f < t; ++f) /* patch order (t, bh, bw, ih, iw), spec §6.1 */
        for (int bh = 0; bh < h / merge; ++bh)
            for (int bw = 0; bw < w / merge; ++bw)
                for (int ih = 0; ih < merge; ++ih)
                    for (int iw = 0; iw < merge; ++iw, ++row)
                        bilinear(want + row * dim, table, G, h, w, bh * merge + ih, bw * merge + iw,
                                 dim);
    vision_pos_embed(out, table, G, t, h, w, merge, dim);
    assert_close(out, want, rows * dim, 1e-6, "vision_pos_embed");
    free(table);
    free(out);
    free(want);
}

static void test_pos_embed(void **state) {
    (void)state;
    check_pos_embed(4, 1, 4, 6, 2, 3);  /* the goldens' shape */
    check_pos_embed(5, 2, 6, 10, 2, 4); /* two frames, upsampling */
    check_pos_embed(6, 1, 2, 2, 2, 2);  /* downsampling */
    check_pos_embed(3, 1, 9, 3, 3, 1);  /* merge 3 */
    check_pos_embed(4, 1, 1, 1, 1, 5);  /* a single patch samples the corner */
}

static void test_vision_rope_cos_sin(void **state) {
    (void)state;
    const int quarter = 6;
    float inv[6], c[12], s[12];
    for (int j = 0; j < quarter; ++j)
        inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)(2 * quarter));
    const int rows[] = {0, 1, 7, 31}, cols[] = {0, 5, 2, 17};
    for (int k = 0; k < 4; ++k) {
        vision_rope_cos_sin(c, s, inv, rows[k], cols[k], quarter);
        double wc[12], ws[12];
        for (int j = 0; j < quarter; ++j) {
            double fr = (double)rows[k] * inv[j], fc = (double)cols[k] * inv[j];
            wc[j] = cos(fr);
            ws[j] = sin(fr);
            wc[quarter + j] = cos(fc);
            ws[quarter + j] = sin(fc);
        }
        assert_close(c, wc, 12, 5e-6, "rope cos");
        assert_close(s, ws, 12, 5e-6, "rope sin");
    }
}

/* Double-precision attention of one row and head over its segment. */
static void attention_ref(double *out, const float *qkv, const int *cu, int n_seg, int i, int h,
                          int nh, int D) {
    int s = 0;
    while (s + 1 < n_seg && cu[s + 1] <= i)
        ++s;
    int HD = nh * D, ld = 3 * HD, len = cu[s + 1] - cu[s];
    double scores[64], max = -INFINITY, sum = 0.0;
    for (int j = 0; j < len; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d)
            dot += (double)qkv[i * ld + h * D + d] * qkv[(cu[s] + j) * ld + HD + h * D + d];
        scores[j] = dot / sqrt((double)D);
        if (scores[j] > max) max = scores[j];
    }
    for (int j = 0; j < len; ++j)
        sum += (scores[j] = exp(scores[j] - max));
    for (int d = 0; d < D; ++d) {
        out[d] = 0.0;
        for (int j = 0; j < len; ++j)
            out[d] += scores[j] / sum * qkv[(cu[s] + j) * ld + 2 * HD + h * D + d];
    }
}

static void test_vision_attention(void **state) {
    (void)state;
    const int n = 11, nh = 3, D = 8, HD = nh * D;
    const int cu[4] = {0, 4, 5, 11}; /* segments of 4, 1 and 6 rows */
    float *qkv = random_floats((size_t)n * 3 * HD, 2.0f);
    float *out1 = malloc((size_t)n * HD * sizeof(float)),
          *out3 = malloc((size_t)n * HD * sizeof(float));
    double *want = malloc((size_t)n * HD * sizeof(double));
    float *scratch = malloc(vision_attention_scratch(n, 6, nh, D, 3) * sizeof(float));
    struct thread_pool *p1 = NULL, *p3 = NULL;
    assert_int_equal(thread_pool_init(&p1, 1), 0);
    assert_int_equal(thread_pool_init(&p3, 3), 0);
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < nh; ++h)
            attention_ref(want + i * HD + h * D, qkv, cu, 3, i, h, nh, D);
    vision_attention(out1, qkv, scratch, cu, 3, n, nh, D, p1);
    assert_close(out1, want, (size_t)n * HD, 2e-6, "vision_attention");
    vision_attention(out3, qkv, scratch, cu, 3, n, nh, D, p3);
    assert_memory_equal(out1, out3, (size_t)n * HD * sizeof(float));
    /* A one-row segment attends only to itself: its output is its own v. */
    assert_memory_equal(out1 + 4 * HD, qkv + 4 * 3 * HD + 2 * HD, (size_t)HD * sizeof(float));
    /* Changing a key in the last segment leaves the first two untouched. */
    qkv[8 * 3 * HD + HD] += 1.0f;
    vision_attention(out3, qkv, scratch, cu, 3, n, nh, D, p3);
    assert_memory_equal(out1, out3, (size_t)5 * HD * sizeof(float));
    assert_true(memcmp(out1 + 5 * HD, out3 + 5 * HD, (size_t)6 * HD * sizeof(float)) != 0);
    thread_pool_free(p1);
    thread_pool_free(p3);
    free(scratch);
    free(qkv);
    free(out1);
    free(out3);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_add_bias),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_linspace),
        cmocka_unit_test(test_pos_embed),
        cmocka_unit_test(test_vision_rope_cos_sin),
        cmocka_unit_test(test_vision_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
