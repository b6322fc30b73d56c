/* CUDA RMSNorm: one block per row, each thread sums the squares of a strided slice of the
 * row, a warp-shuffle + shared-memory reduction gives the row's mean square, then every
 * thread scales its slice. fp32 in and out. Launch geometry is chosen in one place
 * (rmsnorm_cuda_launch). */
#include <cuda_runtime.h>

extern "C" {
#include "kernels/rmsnorm.h"
#include "runtime/base/status.h"
}

#define CUDA_CHECK_RETURN(call)                                                                    \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            return strata_set_error(STRATA_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,    \
                                    cudaGetErrorString(err_));                                     \
    } while (0)

static const int kThreads = 256;

__device__ static float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* out [rows, dim], x [rows, dim], w [dim]; gridDim.x = rows, blockDim.x = kThreads. */
__global__ static void rmsnorm_kernel(float *out, const float *x, const float *w, int dim,
                                      float eps) {
    __shared__ float partial[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *outr = out + (size_t)blockIdx.x * dim;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        sum += xr[i] * xr[i];
    sum = warp_sum(sum);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        sum = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        sum = warp_sum(sum);
        if (lane == 0) partial[0] = rsqrtf(sum / (float)dim + eps);
    }
    __syncthreads();
    const float scale = partial[0];
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        outr[i] = xr[i] * scale * w[i];
}

extern "C" int rmsnorm_cuda_launch(float *out, const float *x, const float *w, int rows, int dim,
                                   float eps, void *stream) {
    if (!out || !x || !w || rows < 0 || dim <= 0)
        return strata_set_error(STRATA_EINVAL,
                                "rmsnorm_cuda_launch: bad arguments (rows %d, dim %d)", rows, dim);
    if (rows == 0) return STRATA_OK;
    rmsnorm_kernel<<<rows, kThreads, 0, (cudaStream_t)stream>>>(out, x, w, dim, eps);
    CUDA_CHECK_RETURN(cudaGetLastError());
    return STRATA_OK;
}

extern "C" int rmsnorm_cuda(float *out, const float *x, const float *w, int rows, int dim,
                            float eps) {
    if (!out || !x || !w || rows < 0 || dim <= 0)
        return strata_set_error(STRATA_EINVAL, "rmsnorm_cuda: bad arguments (rows %d, dim %d)",
                                rows, dim);
    const size_t act_bytes = (size_t)rows * (size_t)dim * sizeof(float);
    float *d_x = NULL, *d_w = NULL;
    int rc = STRATA_OK;
    cudaError_t err;
    if ((err = cudaMalloc((void **)&d_x, act_bytes ? act_bytes : 1)) != cudaSuccess ||
        (err = cudaMalloc((void **)&d_w, (size_t)dim * sizeof(float))) != cudaSuccess ||
        (err = cudaMemcpy(d_x, x, act_bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaMemcpy(d_w, w, (size_t)dim * sizeof(float), cudaMemcpyHostToDevice)) !=
            cudaSuccess) {
        rc = strata_set_error(STRATA_EDEVICE, "rmsnorm_cuda: %s", cudaGetErrorString(err));
        goto done;
    }
    if ((rc = rmsnorm_cuda_launch(d_x, d_x, d_w, rows, dim, eps, NULL))) goto done;
    if ((err = cudaMemcpy(out, d_x, act_bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        rc = strata_set_error(STRATA_EDEVICE, "rmsnorm_cuda: %s", cudaGetErrorString(err));
done:
    cudaFree(d_x);
    cudaFree(d_w);
    return rc;
}
