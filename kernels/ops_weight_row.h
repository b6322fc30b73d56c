/* CUDA twin of reference/ops.h ops_weight_row (naming convention: kernels/README.md), and
 * the gather of many rows the stage backend uses for the embedding lookup and for
 * collecting one expert's tokens. Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_OPS_WEIGHT_ROW_H
#define STRATA_KERNELS_OPS_WEIGHT_ROW_H

#include <stdint.h>

struct ops_weight; /* reference/ops.h */

/* out [w->cols] = row `row` of w widened to f32 (exact); row in [0, w->rows). `w` is a
 * host struct whose `data` is a device pointer; out is a device pointer. Asynchronous on
 * `stream`; 0 or STRATA_EINVAL (also for a row out of range) / STRATA_EDEVICE. */
int cuda_ops_weight_row(float *out, const struct ops_weight *w, int row, void *stream);

/* Not a reference op: out [n, w->cols] row i = row rows[i] of w widened to f32, rows [n]
 * a device array. Indices are not checked on the device: the caller checks them (as
 * reference_embed does) before the launch. */
int cuda_ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n,
                         void *stream);

#endif
