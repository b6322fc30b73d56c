/* The weighted sum of one expert's outputs into the MoE block's result, as the reference's
 * moe_block does it (reference/model.c): not a reference/ops.h op, the inner loop of the
 * reference's layer, so a backend adds expert after expert in the reference's order.
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MOE_COMBINE_H
#define STRATA_KERNELS_MOE_COMBINE_H

#include <stdint.h>

/* For j < count: out[rows[j], :] += y[j, :] * weights[j] (the product rounded, then the
 * sum: bitwise the reference's). out [*, dim], y [count, dim], rows [count] (distinct, so
 * no two threads write one element), weights [count]: device pointers. The stage backend
 * writes the weighted (row, choice) slots with it into zeroed rows, and with weight 1 runs
 * the additions of the reference's expert tree, one height at a time
 * (runtime/stage/backend_cuda_moe.c). Asynchronous on `stream`; 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
int cuda_moe_combine(float *out, const float *y, const int32_t *rows, const float *weights,
                     int count, int dim, void *stream);

#endif
