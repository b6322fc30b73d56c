/* The CUDA table in a build without the CUDA toolkit (--define=strata_cuda=0): no device to
 * probe and no twins, so backend_ops_cuda_test prints "skipped: cuda: <why>" there. */
#include <stdio.h>

#include "tests/backend_ops/backend_ops.h"

static int absent(char *reason, size_t cap) {
    snprintf(reason, cap,
             "this build has no CUDA kernels (the CUDA toolkit was not installed "
             "when it was built: nvcc not found)");
    return 0;
}

const struct bo_backend bo_backend_cuda = {.name = "cuda", .available = absent};
