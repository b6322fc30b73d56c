/* The opening every CUDA kernel test shares: is there a device to run on? */
#ifndef STRATA_TESTS_KERNELS_KERNEL_TEST_H
#define STRATA_TESTS_KERNELS_KERNEL_TEST_H

#include <stdio.h>

#include "kernels/cuda_device.h"
#include "runtime/base/status.h"
#include "tests/test_util.h"

/* 1 with "device: <name>" printed (a GPU, or kernels/cuda_cpu's host runner); 0 with
 * "skipped: <reason>" printed, after which main returns 0 (./strata counts it skipped).
 * Header-only: the test's own kernels library (//kernels:cuda_kernels or
 * :cuda_kernels_cpu) supplies cuda_device_available. */
static inline int kernel_test_device(void) {
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        test_skip_all(reason);
        return 0;
    }
    printf("device: %s\n", reason);
    return 1;
}

/* One judged line, "ok   <what>" or "FAIL <what>: <the last error>"; 0 when ok, 1 when not,
 * so a test sums failures: `failed += kernel_test_check(max_err < 1e-6f, "rmsnorm");`. */
static inline int kernel_test_check(int ok, const char *what) {
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, ok ? "" : ": ",
           ok ? "" : strata_last_error());
    return ok ? 0 : 1;
}

#endif
