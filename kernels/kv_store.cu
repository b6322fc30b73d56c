/* CUDA KV append: one thread per (token, kv head, element), a grid-stride loop; each
 * position's row is where the block table puts it (cuda_kv_offset), stored as the view's
 * dtype (f32 as is; bf16 / f16 rounded by cuda_kv_put, the reference kv_store's bits). */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/kv_store.h"
}

static const int kThreads = 256;

template <int DT>
__global__ static void kv_store_kernel(ops_kv kv, const float *k, const float *v, int row_stride,
                                       int pos, long long total, int nkv, int head_dim) {
    const long long per_row = (long long)nkv * head_dim;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long i = idx / per_row;
        const int rem = (int)(idx % per_row), g = rem / head_dim, d = rem % head_dim;
        const size_t src = (size_t)i * (size_t)row_stride + (size_t)g * head_dim + d;
        const size_t dst = cuda_kv_offset(kv, g, pos + (int)i, head_dim) + d;
        cuda_kv_put<DT>(kv.k, dst, k[src]);
        cuda_kv_put<DT>(kv.v, dst, v[src]);
    }
}

/* Blocks of kThreads for `total` elements, capped (the kernels loop over the rest). */
static unsigned store_blocks(long long total) {
    long long blocks = (total + kThreads - 1) / kThreads;
    return (unsigned)(blocks > 65535LL * 16 ? 65535LL * 16 : blocks);
}

extern "C" int cuda_kv_store(const struct ops_kv *kv, const float *k, const float *v,
                             int row_stride, int pos, int n, int nkv, int head_dim, void *stream) {
    if (n < 0 || pos < 0 || nkv <= 0 || head_dim <= 0 || row_stride < nkv * head_dim ||
        (long long)pos + n > 2147483647LL ||
        (n > 0 &&
         (!kv || !kv->k || !kv->v || !kv->blocks || !k || !v || !cuda_kv_dtype_ok(kv->dtype))))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_kv_store: bad arguments (pos %d, n %d, nkv %d, head_dim %d, "
                                "row stride %d, kv dtype %d)",
                                pos, n, nkv, head_dim, row_stride, kv ? (int)kv->dtype : -1);
    if (n == 0) return STRATA_OK;
    const long long total = (long long)n * nkv * head_dim;
    const unsigned blocks = store_blocks(total);
    cudaStream_t s = (cudaStream_t)stream;
    switch (kv->dtype) {
    case OPS_BF16:
        kv_store_kernel<OPS_BF16>
            <<<blocks, kThreads, 0, s>>>(*kv, k, v, row_stride, pos, total, nkv, head_dim);
        break;
    case OPS_F16:
        kv_store_kernel<OPS_F16>
            <<<blocks, kThreads, 0, s>>>(*kv, k, v, row_stride, pos, total, nkv, head_dim);
        break;
    default:
        kv_store_kernel<OPS_F32>
            <<<blocks, kThreads, 0, s>>>(*kv, k, v, row_stride, pos, total, nkv, head_dim);
        break;
    }
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

template <int DT>
__global__ static void kv_store_rows_kernel(void *k_cache, void *v_cache, const float *k,
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
        cuda_kv_put<DT>(k_cache, dst, k[src]);
        cuda_kv_put<DT>(v_cache, dst, v[src]);
    }
}

extern "C" int cuda_kv_store_rows(void *k_cache, void *v_cache, enum ops_dtype dtype,
                                  const float *k, const float *v, const int64_t *row_dst,
                                  size_t kv_head_stride, int row_stride, int n_rows, int nkv,
                                  int head_dim, void *stream) {
    if (n_rows < 0 || nkv <= 0 || head_dim <= 0 || row_stride < nkv * head_dim ||
        (n_rows > 0 && (!k_cache || !v_cache || !k || !v || !row_dst || !cuda_kv_dtype_ok(dtype))))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_kv_store_rows: bad arguments (%d rows, nkv %d, head_dim %d, "
                                "row stride %d, kv dtype %d)",
                                n_rows, nkv, head_dim, row_stride, (int)dtype);
    if (n_rows == 0) return STRATA_OK;
    const long long total = (long long)n_rows * nkv * head_dim;
    const unsigned blocks = store_blocks(total);
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case OPS_BF16:
        kv_store_rows_kernel<OPS_BF16><<<blocks, kThreads, 0, s>>>(
            k_cache, v_cache, k, v, row_dst, kv_head_stride, row_stride, total, nkv, head_dim);
        break;
    case OPS_F16:
        kv_store_rows_kernel<OPS_F16><<<blocks, kThreads, 0, s>>>(
            k_cache, v_cache, k, v, row_dst, kv_head_stride, row_stride, total, nkv, head_dim);
        break;
    default:
        kv_store_rows_kernel<OPS_F32><<<blocks, kThreads, 0, s>>>(
            k_cache, v_cache, k, v, row_dst, kv_head_stride, row_stride, total, nkv, head_dim);
        break;
    }
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
