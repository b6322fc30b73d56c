/* CUDA RMSNorm: one block per row, sized to the row (a thread per 4 elements, 32 to 1024
 * threads); each thread sums the squares of a strided slice of the row (16-byte loads where
 * the row allows), a warp-shuffle + shared-memory reduction gives the row's mean square,
 * then every thread scales its slice. fp32 in and out. A row is one thread's few loads
 * apart, not 16 dependent ones: a decode step's one-row norms of the 8B shape (4096 wide)
 * took 14 us each on an H200 with 256 threads and 4-byte loads. The order of the sum
 * depends on the row's width only, never on the batch or where the row lies: a width of 4k
 * sums in fours whether the pointers allow 16-byte loads or only 4-byte ones. */
#include <stdint.h>

#include "kernels/cuda_common.cuh"
#include "kernels/rmsnorm_row.cuh"

extern "C" {
#include "kernels/rmsnorm.h"
}

/* out [n, dim], x [n, dim], weight [dim]; gridDim.x = n. */
template <bool V4, bool ALIGNED>
__global__ static void rmsnorm_kernel(float *out, const float *x, const float *weight, float eps,
                                      int dim) {
    rmsnorm_row<V4, ALIGNED>(out + (size_t)blockIdx.x * dim, x + (size_t)blockIdx.x * dim, weight,
                             eps, dim);
}

extern "C" int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n,
                            int dim, void *stream) {
    if (n < 0 || dim <= 0 || (n > 0 && (!out || !x || !weight)))
        return strata_set_error(STRATA_EINVAL, "cuda_rmsnorm: bad arguments (n %d, dim %d)", n,
                                dim);
    if (n == 0) return STRATA_OK;
    /* the path by the width alone (the bits follow it); the loads by where the rows lie */
    const bool v4 = dim % 4 == 0,
               aligned = (((uintptr_t)out | (uintptr_t)x | (uintptr_t)weight) & 15) == 0;
    const int threads = rmsnorm_threads(dim);
    cudaStream_t s = (cudaStream_t)stream;
    if (v4 && aligned)
        rmsnorm_kernel<true, true><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    else if (v4)
        rmsnorm_kernel<true, false><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    else
        rmsnorm_kernel<false, false><<<n, threads, 0, s>>>(out, x, weight, eps, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
