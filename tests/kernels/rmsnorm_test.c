/* cuda_rmsnorm's own contract, beyond the NMSE sweep over shapes that
 * tests/backend_ops runs for every op: bad arguments are refused before any launch,
 * n == 0 is a no-op, out == x (in place, as the reference allows) gives the
 * reference's result, and rows off a 16-byte boundary give the aligned rows' bits. Without a usable
 * device (or a build without the CUDA toolkit) the test prints "skipped: <reason>" and counts as
 * skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

enum { N = 3, DIM = 777 };

/* In place on the device vs the reference out of place; NMSE < 1e-7. */
static int check_in_place(void) {
    static float x[N * DIM], w[DIM], want[N * DIM], got[N * DIM];
    for (int i = 0; i < N * DIM; ++i)
        x[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    for (int i = 0; i < DIM; ++i)
        w[i] = 1.0f + (float)(i % 7) / 8.0f;
    rmsnorm(want, x, w, 1e-6f, N, DIM);
    float *d_x = NULL, *d_w = NULL;
    int rc = cuda_malloc((void **)&d_x, sizeof x);
    if (!rc) rc = cuda_malloc((void **)&d_w, sizeof w);
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof x);
    if (!rc) rc = cuda_memcpy_to_device(d_w, w, sizeof w);
    if (!rc) rc = cuda_rmsnorm(d_x, d_x, d_w, 1e-6f, N, DIM, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, d_x, sizeof got);
    cuda_free(d_x);
    cuda_free(d_w);
    if (rc) return kernel_test_check(0, "in place");
    double err = 0, ref = 0;
    for (int i = 0; i < N * DIM; ++i) {
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        ref += (double)want[i] * want[i];
    }
    printf("in place nmse=%.3e\n", err / ref);
    return kernel_test_check(err / ref < 1e-7, "in place matches reference rmsnorm");
}

/* A width of 4k gives the same bits wherever its rows lie: x, out and weight 4 bytes past a
 * 16-byte boundary (4-byte loads) against the same rows aligned (16-byte loads). */
static int check_offset_rows(void) {
    enum { W = 1024, ROWS = 16 };
    static float x[ROWS * W + 1], w[W + 1], aligned[ROWS * W], offset[ROWS * W + 1];
    /* magnitudes over six decades, so that another order of the sum rounds otherwise */
    unsigned s = 12345;
    for (int i = 0; i < ROWS * W + 1; ++i) {
        s = s * 1103515245u + 12345u;
        x[i] = (float)((int)(s >> 9) % 2001 - 1000) * powf(10.0f, (float)((s >> 4) % 7) - 3.0f);
    }
    for (int i = 0; i < W + 1; ++i)
        w[i] = 1.0f + (float)(i % 5) / 16.0f;
    float *d_x = NULL, *d_w = NULL, *d_o = NULL;
    int rc = cuda_malloc((void **)&d_x, sizeof x);
    if (!rc) rc = cuda_malloc((void **)&d_w, sizeof w);
    if (!rc) rc = cuda_malloc((void **)&d_o, sizeof offset);
    /* aligned: rows x[1..] copied to the buffers' starts */
    if (!rc) rc = cuda_memcpy_to_device(d_x, x + 1, ROWS * W * sizeof(float));
    if (!rc) rc = cuda_memcpy_to_device(d_w, w + 1, W * sizeof(float));
    if (!rc) rc = cuda_rmsnorm(d_o, d_x, d_w, 1e-6f, ROWS, W, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(aligned, d_o, sizeof aligned);
    /* offset: the same values one float past the starts */
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof x);
    if (!rc) rc = cuda_memcpy_to_device(d_w, w, sizeof w);
    if (!rc) rc = cuda_rmsnorm(d_o + 1, d_x + 1, d_w + 1, 1e-6f, ROWS, W, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(offset, d_o, sizeof offset);
    cuda_free(d_x);
    cuda_free(d_w);
    cuda_free(d_o);
    if (rc) return kernel_test_check(0, "offset rows");
    int differ = 0;
    for (int i = 0; i < ROWS * W; ++i)
        differ += memcmp(&aligned[i], &offset[i + 1], sizeof(float)) != 0;
    printf("offset rows: %d of %d values differ from the aligned rows'\n", differ, ROWS * W);
    return kernel_test_check(differ == 0, "rows off a 16-byte boundary give the aligned bits");
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = 0;
    float *d = NULL;
    failures += kernel_test_check(cuda_malloc((void **)&d, 16 * sizeof(float)) == 0, "cuda_malloc");
    failures += kernel_test_check(cuda_rmsnorm(d, d, d, 1e-6f, 1, 0, NULL) == STRATA_EINVAL,
                                  "dim 0 refused");
    failures += kernel_test_check(cuda_rmsnorm(d, d, d, 1e-6f, -1, 4, NULL) == STRATA_EINVAL,
                                  "n < 0 refused");
    failures += kernel_test_check(cuda_rmsnorm(NULL, d, d, 1e-6f, 1, 4, NULL) == STRATA_EINVAL,
                                  "NULL refused");
    failures +=
        kernel_test_check(cuda_rmsnorm(NULL, NULL, NULL, 1e-6f, 0, 4, NULL) == 0, "n 0 is a no-op");
    failures += kernel_test_check(cuda_synchronize() == 0, "no fault after refused calls");
    cuda_free(d);
    failures += check_in_place();
    failures += check_offset_rows();
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
