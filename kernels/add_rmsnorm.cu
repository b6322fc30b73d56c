/* CUDA add_rmsnorm: a layer's residual add and the RMSNorm after it in one launch, a block
 * per row: the row's add element by element (cuda_vec_add's one rounded add), the block's
 * barrier, then rmsnorm_row on the sums (cuda_rmsnorm's code and block size: the same bits).
 * A decode step ran them as two launches a layer. */
#include <stdint.h>

#include "kernels/cuda_common.cuh"
#include "kernels/rmsnorm_row.cuh"

extern "C" {
#include "kernels/add_rmsnorm.h"
}

template <bool V4, bool ALIGNED>
__global__ static void add_rmsnorm_kernel(float *out, float *h, const float *y, const float *weight,
                                          float eps, int dim) {
    float *hr = h + (size_t)blockIdx.x * dim;
    const float *yr = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        hr[i] += yr[i];
    __syncthreads(); /* every sum written before any thread's slice of the norm reads it */
    rmsnorm_row<V4, ALIGNED>(out + (size_t)blockIdx.x * dim, hr, weight, eps, dim);
}

extern "C" int cuda_add_rmsnorm(float *out, float *h, const float *y, const float *weight,
                                float eps, int n, int dim, void *stream) {
    if (n < 0 || dim <= 0 ||
        (n > 0 && (!out || !h || !y || !weight || (const float *)out == h || out == y)))
        return strata_set_error(STRATA_EINVAL, "cuda_add_rmsnorm: bad arguments (n %d, dim %d)", n,
                                dim);
    if (n == 0) return STRATA_OK;
    /* the path by the width alone (the bits follow it); the loads by where the rows lie */
    const bool v4 = dim % 4 == 0,
               aligned = (((uintptr_t)out | (uintptr_t)h | (uintptr_t)weight) & 15) == 0;
    const int threads = rmsnorm_threads(dim);
    cudaStream_t s = (cudaStream_t)stream;
    if (v4 && aligned)
        add_rmsnorm_kernel<true, true><<<n, threads, 0, s>>>(out, h, y, weight, eps, dim);
    else if (v4)
        add_rmsnorm_kernel<true, false><<<n, threads, 0, s>>>(out, h, y, weight, eps, dim);
    else
        add_rmsnorm_kernel<false, false><<<n, threads, 0, s>>>(out, h, y, weight, eps, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
