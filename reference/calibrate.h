/* Measures this box for the performance model (runtime/model/perf_model.h) with the CPU
 * backend's own ops, no model needed: the host read bandwidth (reference/tools/bandwidth.h),
 * the weight bytes per second a bf16 matmul of one row streams (every decode step reads its
 * weights once: 64 MiB of them here, past every cache), and the GFLOP/s of the same matmul
 * over 64 rows (prefill), overall and by the matrix's inner dimension K (1024 .. 8192). Each
 * figure is the best of several runs at `threads` threads. */
#ifndef STRATA_REFERENCE_CALIBRATE_H
#define STRATA_REFERENCE_CALIBRATE_H

#include "runtime/model/perf_model.h"

int reference_calibrate(struct perf_device *out, int threads);

#endif
