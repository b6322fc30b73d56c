/* CUDA row gather with bf16 widening: one thread per output element, a grid row per
 * gathered row. */
#include <stdint.h>
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/ops_weight_row.h"
#include "runtime/base/op_contract.h"
}

static const int kThreads = 256;

template <typename WT>
__global__ static void gather_kernel(float *out, const WT *w, const int32_t *rows, int fixed_row,
                                     int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const int r = rows ? rows[blockIdx.y] : fixed_row;
    const WT v = w[(size_t)r * (size_t)cols + c];
    float f;
    if (sizeof(WT) == 2)
        f = __uint_as_float((unsigned)v << 16);
    else
        f = (float)v;
    out[(size_t)blockIdx.y * (size_t)cols + c] = f;
}

static int launch(float *out, const struct ops_weight *w, const int32_t *rows, int row, int n,
                  void *stream) {
    dim3 grid(cuda_blocks_for(w->cols, kThreads), (unsigned)n);
    cudaStream_t s = (cudaStream_t)stream;
    if (w->dtype == OPS_BF16)
        gather_kernel<uint16_t>
            <<<grid, kThreads, 0, s>>>(out, (const uint16_t *)w->data, rows, row, w->cols);
    else
        gather_kernel<float><<<grid, kThreads, 0, s>>>(out, (const float *)w->data, rows, row,
                                                       w->cols);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

static int bad_weight(const struct ops_weight *w) {
    return !w || !w->data || w->rows <= 0 || w->cols <= 0 ||
           (w->dtype != OPS_BF16 && w->dtype != OPS_F32);
}

extern "C" int cuda_ops_weight_row(float *out, const struct ops_weight *w, int row, void *stream) {
    if (bad_weight(w) || !out || row < 0 || row >= w->rows)
        return strata_set_error(STRATA_EINVAL, "cuda_ops_weight_row: bad arguments (row %d of %d)",
                                row, w ? w->rows : 0);
    return launch(out, w, NULL, row, 1, stream);
}

extern "C" int cuda_ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows,
                                    int n, void *stream) {
    if (bad_weight(w) || n < 0 || n > 65535 || (n > 0 && (!out || !rows)))
        return strata_set_error(STRATA_EINVAL, "cuda_ops_weight_rows: bad arguments (%d rows)", n);
    if (n == 0) return STRATA_OK;
    return launch(out, w, rows, 0, n, stream);
}
