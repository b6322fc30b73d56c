/* The CUDA entry points for builds without the toolkit (--define=strata_cuda=0, set by
 * ./strata when /usr/local/cuda/bin/nvcc is absent): every call reports that the toolkit
 * is missing, so GPU tests print "skipped: ..." and GPU paths fail with a clear error
 * instead of the build breaking. Every cuda_<op> of kernels/ needs its stub here. */
#include <stdio.h>

#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "kernels/softmax.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "runtime/base/status.h"

static const char *const reason_text = "CUDA toolkit not installed (nvcc not found)";

static int unavailable(const char *fn) {
    return strata_set_error(STRATA_EDEVICE, "%s: %s", fn, reason_text);
}

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "%s", reason_text);
    return 0;
}

int cuda_malloc(void **ptr, size_t bytes) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return unavailable(__func__);
}

void cuda_free(void *ptr) {
    (void)ptr;
}

int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unavailable(__func__);
}

int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unavailable(__func__);
}

int cuda_synchronize(void) {
    return unavailable(__func__);
}

int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim,
                 void *stream) {
    (void)out, (void)x, (void)weight, (void)eps, (void)n, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream) {
    (void)out, (void)gate, (void)up, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_softmax(float *x, int n, void *stream) {
    (void)x, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_vec_add(float *x, const float *y, int n, void *stream) {
    (void)x, (void)y, (void)n, (void)stream;
    return unavailable(__func__);
}
