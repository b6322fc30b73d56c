/* cuda_copy_bandwidth (kernels/cuda_device.h): built on the device calls alone, so the GPU
 * build and kernels/cuda_cpu share it. */
#include "kernels/cuda_device.h"
#include "runtime/base/cli.h"

int cuda_copy_bandwidth(double *bw, size_t bytes, int rounds) {
    void *src = NULL, *dst = NULL;
    *bw = 0;
    int rc = cuda_malloc(&src, bytes);
    if (!rc) rc = cuda_malloc(&dst, bytes);
    if (!rc) rc = cuda_memcpy_on_device(dst, src, bytes); /* warm-up */
    double best = 1e30;
    for (int i = 0; !rc && i < rounds; ++i) {
        const double t0 = cli_now_sec();
        rc = cuda_memcpy_on_device(dst, src, bytes); /* done when it returns */
        const double dt = cli_now_sec() - t0;
        best = dt < best ? dt : best;
    }
    cuda_free(src);
    cuda_free(dst);
    if (!rc && rounds > 0) *bw = 2.0 * (double)bytes / best;
    return rc;
}
