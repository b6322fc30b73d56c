/* cuda_rope_cos_sin against the reference rope_cos_sin (an int section table as input,
 * which the tests/backend_ops harness does not generate): plain RoPE and interleaved
 * M-RoPE, NMSE < 1e-7 (the angles are bitwise, cosf/sinf are CUDA's). Prints
 * "skipped: <reason>" without a device. */
#include <math.h>
#include <stdio.h>

#include "kernels/cuda_device.h"
#include "kernels/rope_cos_sin.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

enum { HALF = 64 };

static int check(int pos_t, int pos_h, int pos_w, const int *section) {
    float inv[HALF], want_c[HALF], want_s[HALF], got_c[HALF], got_s[HALF];
    for (int j = 0; j < HALF; ++j)
        inv[j] = 1.0f / powf(1000000.0f, (float)(2 * j) / (float)(2 * HALF));
    rope_cos_sin(want_c, want_s, inv, pos_t, pos_h, pos_w, section, HALF);
    float *d_inv = NULL, *d_c = NULL, *d_s = NULL;
    int *d_sec = NULL;
    int rc = cuda_malloc((void **)&d_inv, sizeof inv);
    if (!rc) rc = cuda_malloc((void **)&d_c, sizeof inv);
    if (!rc) rc = cuda_malloc((void **)&d_s, sizeof inv);
    if (!rc) rc = cuda_malloc((void **)&d_sec, 3 * sizeof(int));
    if (!rc) rc = cuda_memcpy_to_device(d_inv, inv, sizeof inv);
    if (!rc && section) rc = cuda_memcpy_to_device(d_sec, section, 3 * sizeof(int));
    if (!rc)
        rc = cuda_rope_cos_sin(d_c, d_s, d_inv, pos_t, pos_h, pos_w, section ? d_sec : NULL, HALF,
                               NULL);
    if (!rc) rc = cuda_memcpy_to_host(got_c, d_c, sizeof got_c);
    if (!rc) rc = cuda_memcpy_to_host(got_s, d_s, sizeof got_s);
    cuda_free(d_inv);
    cuda_free(d_c);
    cuda_free(d_s);
    cuda_free(d_sec);
    if (rc) {
        printf("FAIL pos (%d,%d,%d): %s\n", pos_t, pos_h, pos_w, strata_last_error());
        return 1;
    }
    double err = 0, ref = 0;
    for (int j = 0; j < HALF; ++j) {
        err += (got_c[j] - want_c[j]) * (double)(got_c[j] - want_c[j]) +
               (got_s[j] - want_s[j]) * (double)(got_s[j] - want_s[j]);
        ref += (double)want_c[j] * want_c[j] + (double)want_s[j] * want_s[j];
    }
    int ok = err / ref < 1e-7;
    printf("%s pos (%d,%d,%d)%s nmse=%.3e\n", ok ? "ok  " : "FAIL", pos_t, pos_h, pos_w,
           section ? " mrope" : "", err / ref);
    return !ok;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    static const int section[3] = {24, 20, 20};
    int failures = check(0, 0, 0, NULL) + check(17, 17, 17, NULL) + check(4000, 4000, 4000, NULL) +
                   check(5, 3, 9, section) + check(1234, 40, 77, section);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
