/* CUDA qk_norm_rope: a layer's queries and keys normed per head and rotated in one launch, a
 * block per (row, head), q's heads then k's. The block norms its head with rmsnorm_row
 * (cuda_rmsnorm's code and block size for a head_dim row: the same bits) and, after its
 * barrier, rotates the head's pairs with cuda_rope_apply's expression. A decode step ran the
 * four as four launches a layer (two norms, two rotations), each a few microseconds of a
 * step whose matrices take tens. */
#include <limits.h>
#include <stdint.h>

#include "kernels/cuda_common.cuh"
#include "kernels/rmsnorm_row.cuh"

extern "C" {
#include "kernels/qk_norm_rope.h"
}

/* Block b < q_blocks is head-row b of q (row b / heads), the rest head-rows of k (row
 * (b - q_blocks) / kv_heads); a head-row is head_dim contiguous floats. */
template <bool V4, bool ALIGNED>
__global__ static void qk_norm_rope_kernel(float *q, float *k, const float *q_norm,
                                           const float *k_norm, float eps, const float *cos_t,
                                           const float *sin_t, int q_blocks, int heads,
                                           int kv_heads, int head_dim) {
    const bool is_q = (int)blockIdx.x < q_blocks;
    const int hr = is_q ? (int)blockIdx.x : (int)blockIdx.x - q_blocks;
    float *v = (is_q ? q : k) + (size_t)hr * (size_t)head_dim;
    rmsnorm_row<V4, ALIGNED>(v, v, is_q ? q_norm : k_norm, eps, head_dim);
    __syncthreads(); /* the normed head, written by every thread, read by its pairs' threads */
    const int half = head_dim / 2, t = hr / (is_q ? heads : kv_heads);
    const float *c = cos_t + (size_t)t * (size_t)half, *s = sin_t + (size_t)t * (size_t)half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const float a = v[j], b = v[j + half];
        v[j] = __fsub_rn(__fmul_rn(a, c[j]), __fmul_rn(b, s[j]));
        v[j + half] = __fadd_rn(__fmul_rn(b, c[j]), __fmul_rn(a, s[j]));
    }
}

extern "C" int cuda_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm,
                                 float eps, const float *cos_t, const float *sin_t, int rows,
                                 int heads, int kv_heads, int head_dim, void *stream) {
    const long long blocks = (long long)rows * ((long long)heads + kv_heads);
    if (rows < 0 || heads < 0 || kv_heads < 0 || head_dim <= 0 || head_dim % 2 ||
        blocks > INT_MAX ||
        (blocks > 0 &&
         (!cos_t || !sin_t || (heads > 0 && (!q || !q_norm)) || (kv_heads > 0 && (!k || !k_norm)))))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_qk_norm_rope: bad arguments (rows %d, heads %d, kv_heads %d, "
                                "head_dim %d)",
                                rows, heads, kv_heads, head_dim);
    if (blocks == 0) return STRATA_OK;
    /* the path by the width alone (the bits follow it); the loads by where the heads lie */
    const bool v4 = head_dim % 4 == 0,
               aligned = (((uintptr_t)q | (uintptr_t)k | (uintptr_t)q_norm | (uintptr_t)k_norm) &
                          15) == 0;
    const int threads = rmsnorm_threads(head_dim), q_blocks = rows * heads;
    cudaStream_t s = (cudaStream_t)stream;
#define STRATA_QK(V4, ALIGNED)                                                                     \
    qk_norm_rope_kernel<V4, ALIGNED><<<(unsigned)blocks, threads, 0, s>>>(                         \
        q, k, q_norm, k_norm, eps, cos_t, sin_t, q_blocks, heads, kv_heads, head_dim)
    if (v4 && aligned)
        STRATA_QK(true, true);
    else if (v4)
        STRATA_QK(true, false);
    else
        STRATA_QK(false, false);
#undef STRATA_QK
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
