/* The two rules kernels/cuda_cpu enforces for the CUDA stage backend beyond what a device
 * checks (kernels/cuda_cpu/device_cpu.cc): an asynchronous copy's host side must be pinned
 * (cuda_host_alloc), and once a stream exists nothing may be queued on the legacy default
 * stream. The golden backends tests run the whole backend under them; this shows each rule
 * refuses what it should and lets through what it should. cuda_cpu only: a device would
 * accept both (an unpinned copy is merely synchronous; the default stream merely serialises). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/vec_add.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"

int main(void) {
    if (!kernel_test_device()) return 0;
    int failed = 0;
    float *dev = NULL, *pinned = NULL, host[4] = {1, 2, 3, 4};
    void *stream = NULL;
    if (cuda_malloc((void **)&dev, sizeof host) || cuda_host_alloc((void **)&pinned, sizeof host)) {
        printf("FAIL allocations: %s\n", strata_last_error());
        return 1;
    }
    /* before any stream: the default stream is the only one, and fine */
    failed += kernel_test_check(cuda_vec_add(dev, dev, 4, NULL) == STRATA_OK,
                                "a launch on the default stream with no stream alive");
    failed += kernel_test_check(cuda_stream_create(&stream) == STRATA_OK, "a stream");
    memcpy(pinned, host, sizeof host);
    failed += kernel_test_check(
        cuda_memcpy_async(dev, pinned, sizeof host, CUDA_COPY_TO_DEVICE, stream) == STRATA_OK,
        "an asynchronous copy from pinned memory");
    int rc = cuda_memcpy_async(dev, host, sizeof host, CUDA_COPY_TO_DEVICE, stream);
    failed += kernel_test_check(rc == STRATA_EDEVICE && strstr(strata_last_error(), "not pinned"),
                                "an asynchronous copy from unpinned memory refused");
    rc = cuda_memcpy_async(host, dev, sizeof host, CUDA_COPY_TO_HOST, stream);
    failed += kernel_test_check(rc == STRATA_EDEVICE, "and one to unpinned memory");
    failed += kernel_test_check(cuda_memcpy_to_host(host, dev, sizeof host) == STRATA_OK,
                                "a synchronous copy to unpinned memory");
    failed +=
        kernel_test_check(cuda_vec_add(dev, dev, 4, stream) == STRATA_OK, "a launch on the stream");
    rc = cuda_vec_add(dev, dev, 4, NULL);
    failed += kernel_test_check(rc == STRATA_EDEVICE && strstr(strata_last_error(), "default"),
                                "a launch on the default stream while a stream exists refused");
    rc = cuda_memset_async(dev, 0, sizeof host, NULL);
    failed += kernel_test_check(rc == STRATA_EDEVICE, "and a copy queued there");
    cuda_stream_destroy(stream);
    failed += kernel_test_check(cuda_vec_add(dev, dev, 4, NULL) == STRATA_OK,
                                "the default stream again once the stream is gone");
    cuda_host_free(pinned);
    cuda_free(dev);
    printf("%d failure(s)\n", failed);
    return failed ? 1 : 0;
}
