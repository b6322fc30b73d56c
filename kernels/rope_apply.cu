/* CUDA RoPE rotation: one thread per (token, head, j < half) pair. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/rope_apply.h"
}

static const int kThreads = 256;

__global__ static void rope_apply_kernel(float *x, const float *cos_t, const float *sin_t,
                                         int n_rows, int row_stride, int n_heads, int head_dim) {
    const int half = head_dim / 2;
    const long long per_row = (long long)n_heads * half;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= per_row * n_rows) return;
    const int t = (int)(idx / per_row), rem = (int)(idx % per_row);
    const int h = rem / half, j = rem % half;
    float *v = x + (size_t)t * (size_t)row_stride + (size_t)h * (size_t)head_dim;
    const float c = cos_t[(size_t)t * half + j], s = sin_t[(size_t)t * half + j];
    const float a = v[j], b = v[j + half];
    v[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[j + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

extern "C" int cuda_rope_apply_rows(float *x, const float *cos_t, const float *sin_t, int n_rows,
                                    int row_stride, int n_heads, int head_dim, void *stream) {
    if (n_rows < 0 || n_heads < 0 || head_dim < 0 || head_dim % 2 ||
        row_stride < n_heads * head_dim ||
        (n_rows > 0 && n_heads > 0 && head_dim > 0 && (!x || !cos_t || !sin_t)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_rope_apply: bad arguments (rows %d, stride %d, heads %d, "
                                "head_dim %d)",
                                n_rows, row_stride, n_heads, head_dim);
    const long long total = (long long)n_rows * n_heads * (head_dim / 2);
    if (total == 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((total + kThreads - 1) / kThreads);
    rope_apply_kernel<<<blocks, kThreads, 0, (cudaStream_t)stream>>>(x, cos_t, sin_t, n_rows,
                                                                     row_stride, n_heads, head_dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads,
                               int head_dim, void *stream) {
    return cuda_rope_apply_rows(x, cos_t, sin_t, 1, n_heads * head_dim, n_heads, head_dim, stream);
}
