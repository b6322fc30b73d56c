/* CUDA KV append: one thread per (token, kv head, element), a grid-stride loop; each
 * position's row is where the block table puts it (cuda_kv_offset). */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/kv_store.h"
}

static const int kThreads = 256;

__global__ static void kv_store_kernel(ops_kv kv, const float *k, const float *v, int row_stride,
                                       int pos, long long total, int nkv, int head_dim) {
    const long long per_row = (long long)nkv * head_dim;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long i = idx / per_row;
        const int rem = (int)(idx % per_row), g = rem / head_dim, d = rem % head_dim;
        const size_t src = (size_t)i * (size_t)row_stride + (size_t)g * head_dim + d;
        const size_t dst = cuda_kv_offset(kv, g, pos + (int)i, head_dim) + d;
        ((float *)kv.k)[dst] = k[src]; /* the CUDA cache stores f32 (backend_cuda_kv.c) */
        ((float *)kv.v)[dst] = v[src];
    }
}

extern "C" int cuda_kv_store(const struct ops_kv *kv, const float *k, const float *v,
                             int row_stride, int pos, int n, int nkv, int head_dim, void *stream) {
    if (n < 0 || pos < 0 || nkv <= 0 || head_dim <= 0 || row_stride < nkv * head_dim ||
        (long long)pos + n > 2147483647LL ||
        (n > 0 && (!kv || !kv->k || !kv->v || !kv->blocks || !k || !v)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_kv_store: bad arguments (pos %d, n %d, nkv %d, head_dim %d, "
                                "row stride %d)",
                                pos, n, nkv, head_dim, row_stride);
    if (n == 0) return STRATA_OK;
    const long long total = (long long)n * nkv * head_dim;
    long long blocks = (total + kThreads - 1) / kThreads;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    kv_store_kernel<<<(unsigned)blocks, kThreads, 0, (cudaStream_t)stream>>>(
        *kv, k, v, row_stride, pos, total, nkv, head_dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

__global__ static void kv_store_rows_kernel(float *k_cache, float *v_cache, const float *k,
                                            const float *v, const int64_t *row_dst,
                                            size_t kv_head_stride, int row_stride, long long total,
                                            int nkv, int head_dim) {
    const long long per_row = (long long)nkv * head_dim;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / per_row;
        const int rem = (int)(idx % per_row), g = rem / head_dim, d = rem % head_dim;
        const size_t src = (size_t)r * (size_t)row_stride + (size_t)g * head_dim + d;
        const size_t dst = (size_t)row_dst[r] + (size_t)g * kv_head_stride + d;
        k_cache[dst] = k[src];
        v_cache[dst] = v[src];
    }
}

extern "C" int cuda_kv_store_rows(float *k_cache, float *v_cache, const float *k, const float *v,
                                  const int64_t *row_dst, size_t kv_head_stride, int row_stride,
                                  int n_rows, int nkv, int head_dim, void *stream) {
    if (n_rows < 0 || nkv <= 0 || head_dim <= 0 || row_stride < nkv * head_dim ||
        (n_rows > 0 && (!k_cache || !v_cache || !k || !v || !row_dst)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_kv_store_rows: bad arguments (%d rows, nkv %d, head_dim %d, "
                                "row stride %d)",
                                n_rows, nkv, head_dim, row_stride);
    if (n_rows == 0) return STRATA_OK;
    const long long total = (long long)n_rows * nkv * head_dim;
    long long blocks = (total + kThreads - 1) / kThreads;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    kv_store_rows_kernel<<<(unsigned)blocks, kThreads, 0, (cudaStream_t)stream>>>(
        k_cache, v_cache, k, v, row_dst, kv_head_stride, row_stride, total, nkv, head_dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
