/* The "cuda" kind of a build without the CUDA toolkit (--define=strata_cuda=0): registered
 * so that --device cuda[:N] is refused with the reason (and checked like any kind, e.g. q8
 * is still "cpu only"), instead of being an unknown device. No kernel is linked. */
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"

static int open_absent(struct stage_backend **out, const struct stage_backend_options *opt) {
    *out = NULL;
    return strata_set_error(STRATA_EDEVICE,
                            "device '%s' is not available: this build has no CUDA backend (the "
                            "CUDA toolkit was not installed when it was built: nvcc not found)",
                            opt->device);
}

static const struct stage_backend_kind absent_kind = {"cuda", 0, open_absent};

__attribute__((constructor)) static void backend_cuda_absent_register(void) {
    stage_backend_register(&absent_kind);
}
