/* Weighted scatter-add of one expert's rows: one thread per element, a grid row per token. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/moe_combine.h"
}

static const int kThreads = 256;

__global__ static void moe_combine_kernel(float *out, const float *y, const int32_t *rows,
                                          const float *weights, int dim) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    const int j = blockIdx.y;
    float *o = out + (size_t)rows[j] * (size_t)dim;
    o[d] = __fadd_rn(o[d], __fmul_rn(y[(size_t)j * (size_t)dim + d], weights[j]));
}

extern "C" int cuda_moe_combine(float *out, const float *y, const int32_t *rows,
                                const float *weights, int count, int dim, void *stream) {
    if (count < 0 || count > 65535 || dim <= 0 ||
        (count > 0 && (!out || !y || !rows || !weights)))
        return strata_set_error(STRATA_EINVAL, "cuda_moe_combine: bad arguments (count %d, dim %d)",
                                count, dim);
    if (count == 0) return STRATA_OK;
    dim3 grid(cuda_blocks_for(dim, kThreads), (unsigned)count);
    moe_combine_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(out, y, rows, weights, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
