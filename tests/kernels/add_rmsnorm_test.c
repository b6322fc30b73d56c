/* cuda_add_rmsnorm's own contract, beyond the NMSE sweep against the reference that
 * tests/backend_ops runs: one launch gives, bit for bit, the sums of cuda_vec_add and the
 * norm of cuda_rmsnorm that the stage backend ran before it as two, on every path of the norm
 * (widths of 4k with aligned and unaligned rows, other widths, rows past one block's
 * threads); out aliasing h or y and bad arguments are refused before any launch; no rows is a
 * no-op. Without a usable device it prints "skipped: <reason>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/add_rmsnorm.h"
#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "kernels/vec_add.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

static float value(unsigned i, float scale) {
    i = i * 2654435761u + 313u;
    return scale * ((float)((i >> 8) % 2001u) / 1000.0f - 1.0f);
}

/* 0 when the fused call's h and out equal the two calls' bit for bit. `offset` floats shift
 * the rows off a 16-byte boundary (1: the unaligned path). */
static int check(int n, int dim, int offset) {
    const size_t m = (size_t)n * dim, bytes = sizeof(float);
    float *host = malloc(bytes * (2 * m + (size_t)dim)), *got = malloc(bytes * 2 * m),
          *want = malloc(bytes * 2 * m);
    float *d = NULL;
    int rc = host && got && want ? cuda_malloc((void **)&d, bytes * (6 * m + dim + 2 * offset))
                                 : STRATA_ENOMEM;
    if (rc) goto done;
    for (size_t i = 0; i < 2 * m; ++i)
        host[i] = value((unsigned)i, 3.0f);
    for (int i = 0; i < dim; ++i)
        host[2 * m + i] = 1.0f + 0.5f * value((unsigned)i + 7000u, 1.0f);
    /* device: fused [out | h | y], two-call [out | h | y] from `offset`, then the weight */
    float *fo = d + offset, *fh = fo + m, *fy = fh + m, *to = fy + m, *th = to + m, *ty = th + m;
    float *w = ty + m + offset;
    rc = cuda_memcpy_to_device(fh, host, bytes * 2 * m);
    if (!rc) rc = cuda_memcpy_to_device(th, host, bytes * 2 * m);
    if (!rc) rc = cuda_memcpy_to_device(w, host + 2 * m, bytes * (size_t)dim);
    if (!rc) rc = cuda_add_rmsnorm(fo, fh, fy, w, 1e-6f, n, dim, NULL);
    if (!rc) rc = cuda_vec_add(th, ty, (int)m, NULL);
    if (!rc) rc = cuda_rmsnorm(to, th, w, 1e-6f, n, dim, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, fo, bytes * 2 * m); /* out and h */
    if (!rc) rc = cuda_memcpy_to_host(want, to, bytes * 2 * m);
done:;
    char what[128];
    snprintf(what, sizeof what, "n %d, dim %d%s: the two launches' sums and norms", n, dim,
             offset ? " (unaligned)" : "");
    const int ok = !rc && !memcmp(got, want, bytes * 2 * m);
    if (!rc && !ok) strata_set_error(STRATA_EINVAL, "the fused rows differ");
    cuda_free(d);
    free(host);
    free(got);
    free(want);
    return kernel_test_check(ok, what);
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failed = 0;
    failed += check(1, 4096, 0); /* a decode row of the 8B shape */
    failed += check(1, 4096, 1); /* the same off a 16-byte boundary */
    failed += check(9, 1024, 0); /* a prefill chunk of the 0.6B shape */
    failed += check(3, 100, 1);  /* a width of 4k, small and unaligned */
    failed += check(2, 5001, 0); /* off the 4-float path, past one block's 1024 threads */
    float buf[4] = {0};
    failed += kernel_test_check(cuda_add_rmsnorm(buf, buf, buf + 1, buf + 2, 1e-6f, 1, 1, NULL) ==
                                    STRATA_EINVAL,
                                "out aliasing h is refused");
    failed += kernel_test_check(cuda_add_rmsnorm(buf, buf + 1, buf, buf + 2, 1e-6f, 1, 1, NULL) ==
                                    STRATA_EINVAL,
                                "out aliasing y is refused");
    failed += kernel_test_check(cuda_add_rmsnorm(NULL, NULL, NULL, NULL, 1e-6f, 1, 8, NULL) ==
                                    STRATA_EINVAL,
                                "missing buffers are refused");
    failed +=
        kernel_test_check(cuda_add_rmsnorm(NULL, NULL, NULL, NULL, 1e-6f, 0, 8, NULL) == STRATA_OK,
                          "no rows: nothing to do");
    printf("%d failure(s)\n", failed);
    return failed ? 1 : 0;
}
