/* strata-stage --calibrate --device cuda[:N]: the GPU's profile for the performance model
 * (runtime/model/perf_model.h), measured with the CUDA backend's own kernels as
 * reference/calibrate.h measures a CPU with the CPU backend's ops: the device's copy
 * bandwidth (read + write, 2 x bytes / time: HBM), the weight bytes per second a bf16 matmul
 * of one row streams (every decode step reads its weights once) over working sets from one
 * matrix that the L2 holds to 512 MiB that it does not, and the GFLOP/s of 64 rows by the
 * inner dimension K (plain and as the row-parallel split matrices). Without a CUDA toolkit in
 * the build (calibrate_cuda_absent.c) it refuses with the reason. */
#ifndef STRATA_RUNTIME_STAGE_CALIBRATE_CUDA_H
#define STRATA_RUNTIME_STAGE_CALIBRATE_CUDA_H

#include <stddef.h>

#include "runtime/model/perf_model.h"

/* How much to measure: weight bytes in all (default 512 MiB) and timed rounds (default 5);
 * the tests pass less for the host emulation. */
struct stage_calibrate_cuda_options {
    size_t weight_bytes;
    int rounds;
};

/* Measures CUDA device `device` into *out (source "measured", device "cuda"). opt NULL:
 * the defaults. STRATA_EDEVICE without the device (or the toolkit). */
int stage_calibrate_cuda(struct perf_device *out, int device,
                         const struct stage_calibrate_cuda_options *opt);

#endif
