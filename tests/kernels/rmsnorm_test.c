/* cuda_rmsnorm's own contract, beyond the NMSE sweep over shapes that
 * tests/backend_ops runs for every op: bad arguments are refused before any launch,
 * n == 0 is a no-op, and out == x (in place, as the reference allows) gives the
 * reference's result. Without a usable device (or a build without the CUDA toolkit) the
 * test prints "skipped: <reason>" and counts as skipped. */
#include <stdio.h>
#include <stdlib.h>

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
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
