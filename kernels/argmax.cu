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
static const int kUnroll = 16;

/* (va, ia) := the better of (va, ia) and (vb, ib); index -1 = no candidate. */
__device__ static inline void better(float &va, int &ia, float vb, int ib) {
    if (ib < 0) return;
    if (ia < 0 || vb > va || (!(va > vb) && ib < ia)) {
        va = vb;
        ia = ib;
    }
}

/* The block's first largest non-NaN element of `row` [n]: (v, idx), idx -1 when none; valid
 * in thread 0. */
__device__ static void block_best(const float *row, int n, float &v, int &idx) {
    __shared__ float sv[kThreads];
    __shared__ int si[kThreads];
    v = 0.0f;
    idx = -1;
    /* kUnroll loads in flight a thread before the comparisons: one at a time, a 151936-wide
     * row (Qwen3's vocabulary) took 64 us on an H200, each thread waiting out ~150 memory
     * latencies in turn. A thread still visits its indices in ascending order. */
    const int stride = (int)blockDim.x;
    int i = (int)threadIdx.x;
    for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
        float xs[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            xs[u] = row[i + u * stride];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            if (xs[u] == xs[u]) better(v, idx, xs[u], i + u * stride); /* NaN never wins */
    }
    for (; i < n; i += stride) {
        const float xi = row[i];
        if (xi == xi) better(v, idx, xi, i);
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
}

__global__ static void argmax_kernel(int32_t *out, const float *x, int n) {
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    float v;
    int idx;
    block_best(row, n, v, idx);
    if (threadIdx.x == 0) {
        const float x0 = row[0];
        out[blockIdx.x] = (x0 != x0 || idx < 0) ? 0 : idx;
    }
}

/* argmax_part: the part holding id 0 reports argmax()'s pick (x[0] when it is NaN), a later
 * part its first largest non-NaN value or (0, -1). */
__global__ static void argmax_part_kernel(float *pairs, const float *x, int n, int start) {
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    float v;
    int idx;
    block_best(row, n, v, idx);
    if (threadIdx.x != 0) return;
    float *out = pairs + 2 * (size_t)blockIdx.x;
    if (start == 0) {
        const float x0 = row[0];
        if (x0 != x0 || idx < 0) idx = 0, v = x0;
        out[0] = v;
        out[1] = (float)idx;
    } else {
        out[0] = idx < 0 ? 0.0f : v;
        out[1] = idx < 0 ? -1.0f : (float)(start + idx);
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

extern "C" int cuda_argmax_part_rows(float *pairs, const float *x, int n_rows, int n, int start,
                                     void *stream) {
    if (n_rows < 0 || n <= 0 || start < 0 || start > (1 << 24) - n ||
        (n_rows > 0 && (!pairs || !x)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_argmax_part_rows: bad arguments (rows %d, n %d, start %d)",
                                n_rows, n, start);
    if (n_rows == 0) return STRATA_OK;
    argmax_part_kernel<<<(unsigned)n_rows, kThreads, 0, (cudaStream_t)stream>>>(pairs, x, n, start);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_argmax(int32_t *out, const float *x, int n, void *stream) {
    return cuda_argmax_rows(out, x, 1, n, stream);
}
