/* CUDA SwiGLU: one thread per element, the reference's expression and operation order. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/swiglu.h"
}

static const int kThreads = 256;

__global__ static void swiglu_kernel(float *out, const float *gate, const float *up, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    /* expf, not __expf: the fast intrinsic's error would dominate the comparison. */
    out[i] = (g / (1.0f + expf(-g))) * up[i];
}

extern "C" int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream) {
    if (n < 0 || (n > 0 && (!out || !gate || !up)))
        return strata_set_error(STRATA_EINVAL, "cuda_swiglu: bad arguments (n %d)", n);
    if (n == 0) return STRATA_OK;
    swiglu_kernel<<<cuda_blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(out, gate,
                                                                                       up, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
