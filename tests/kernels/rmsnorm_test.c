/* GPU RMSNorm against its CPU twin, judged by normalised MSE (< 1e-7) over several
 * shapes, including dims that are not a multiple of the block size and a single row.
 * Without a usable device (or a build without the CUDA toolkit) the test prints
 * "skipped: <reason>" and counts as skipped. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "runtime/base/status.h"
#include "tests/test_util.h"

static uint64_t rng_state = 12345;

static float uniform(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* sum (a-b)^2 / sum b^2 */
static double nmse(const float *a, const float *b, size_t n) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - (double)b[i];
        err += d * d;
        ref += (double)b[i] * (double)b[i];
    }
    return ref > 0 ? err / ref : err;
}

static int check_shape(int rows, int dim, float scale) {
    size_t n = (size_t)rows * (size_t)dim;
    float *x = malloc(n * sizeof *x), *w = malloc((size_t)dim * sizeof *w);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    int ok = 0;
    if (!x || !w || !want || !got) goto done;
    for (size_t i = 0; i < n; ++i)
        x[i] = scale * uniform();
    for (int i = 0; i < dim; ++i)
        w[i] = 1.0f + 0.5f * uniform();
    rmsnorm_cpu(want, x, w, rows, dim, 1e-6f);
    if (rmsnorm_cuda(got, x, w, rows, dim, 1e-6f) != 0) {
        printf("FAIL rows=%d dim=%d: %s\n", rows, dim, strata_last_error());
        goto done;
    }
    double e = nmse(got, want, n);
    ok = e < 1e-7;
    printf("%s rows=%d dim=%d scale=%g nmse=%.3e\n", ok ? "ok  " : "FAIL", rows, dim, scale, e);
done:
    free(x);
    free(w);
    free(want);
    free(got);
    return ok;
}

int main(void) {
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        test_skip_all(reason);
        return 0;
    }
    printf("device: %s\n", reason);
    static const struct {
        int rows, dim;
        float scale;
    } shapes[] = {{1, 16, 1.0f},     {7, 100, 1.0f},    {32, 1024, 3.0f}, {5, 2560, 0.01f},
                  {128, 4096, 1.0f}, {3, 5000, 100.0f}, {64, 128, 1.0f}};
    int failures = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
        failures += !check_shape(shapes[i].rows, shapes[i].dim, shapes[i].scale);
    /* Bad arguments are refused with a message, not launched. */
    float one = 1.0f;
    if (rmsnorm_cuda(&one, &one, &one, 1, 0, 1e-6f) != STRATA_EINVAL) {
        printf("FAIL: dim 0 accepted\n");
        ++failures;
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
