/* The CUDA entry points for builds without the toolkit (--define=strata_cuda=0, set by
 * ./strata when /usr/local/cuda/bin/nvcc is absent): every call reports that the toolkit
 * is missing, so GPU tests print "skipped: ..." and GPU paths fail with a clear error
 * instead of the build breaking. */
#include <stdio.h>

#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "runtime/base/status.h"

static const char *const reason_text = "CUDA toolkit not installed (nvcc not found)";

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "%s", reason_text);
    return 0;
}

int rmsnorm_cuda_launch(float *out, const float *x, const float *w, int rows, int dim, float eps,
                        void *stream) {
    (void)out, (void)x, (void)w, (void)rows, (void)dim, (void)eps, (void)stream;
    return strata_set_error(STRATA_EDEVICE, "rmsnorm_cuda_launch: %s", reason_text);
}

int rmsnorm_cuda(float *out, const float *x, const float *w, int rows, int dim, float eps) {
    (void)out, (void)x, (void)w, (void)rows, (void)dim, (void)eps;
    return strata_set_error(STRATA_EDEVICE, "rmsnorm_cuda: %s", reason_text);
}
