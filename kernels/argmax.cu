/* CUDA argmax: one block per row; each thread scans a strided subset in ascending index
 * keeping the first maximal non-NaN element, then a shared-memory tree combines pairs
 * (greater value wins, equal values the lower index). Every combination is a comparison,
 * so the order of the tree cannot change the result: it is the first index of the maximum
 * over non-NaN values, which is what the reference's scan returns unless x[0] is NaN
 * (then the scan never moves: 0). */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/argmax.h"
}

static const int kThreads = 1024;

/* (va, ia) := the better of (va, ia) and (vb, ib); index -1 = no candidate. */
__device__ static inline void better(float &va, int &ia, float vb, int ib) {
    if (ib < 0) return;
    if (ia < 0 || vb > va || (!(va > vb) && ib < ia)) {
        va = vb;
        ia = ib;
    }
}

__global__ static void argmax_kernel(int32_t *out, const float *x, int n) {
    __shared__ float sv[kThreads];
    __shared__ int si[kThreads];
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    float v = 0.0f;
    int idx = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float xi = row[i];
        if (xi == xi) better(v, idx, xi, i); /* NaN never wins */
    }
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) {
            better(v, idx, sv[threadIdx.x + half], si[threadIdx.x + half]);
            sv[threadIdx.x] = v;
            si[threadIdx.x] = idx;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float x0 = row[0];
        out[blockIdx.x] = (x0 != x0 || idx < 0) ? 0 : idx;
    }
}

extern "C" int cuda_argmax_rows(int32_t *out, const float *x, int n_rows, int n, void *stream) {
    if (n_rows < 0 || n <= 0 || (n_rows > 0 && (!out || !x)))
        return strata_set_error(STRATA_EINVAL, "cuda_argmax: bad arguments (rows %d, n %d)", n_rows,
                                n);
    if (n_rows == 0) return STRATA_OK;
    argmax_kernel<<<(unsigned)n_rows, kThreads, 0, (cudaStream_t)stream>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_argmax(int32_t *out, const float *x, int n, void *stream) {
    return cuda_argmax_rows(out, x, 1, n, stream);
}
