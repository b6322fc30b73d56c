/* A build without the CUDA toolkit: --calibrate --device cuda refuses with the reason. */
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/calibrate_cuda.h"

int stage_calibrate_cuda(struct perf_device *out, int device,
                         const struct stage_calibrate_cuda_options *opt) {
    (void)opt;
    memset(out, 0, sizeof *out);
    return strata_set_error(STRATA_EDEVICE,
                            "cuda:%d: this build has no CUDA (built without the toolkit)", device);
}
