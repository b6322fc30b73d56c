/* Shared by the kernels/<op>.cu files only (never by C code): the one way a CUDA call's
 * failure becomes a Strata status, and the argument check every twin runs before it
 * launches, so a bad call fails with a message instead of a launch error later. */
#ifndef STRATA_KERNELS_CUDA_COMMON_CUH
#define STRATA_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>

extern "C" {
#include "runtime/base/op_contract.h"
#include "runtime/base/status.h"
}

#define CUDA_CHECK_RETURN(call)                                                                    \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            return strata_set_error(STRATA_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,    \
                                    cudaGetErrorString(err_));                                     \
    } while (0)

/* Launch errors (bad geometry, no device) surface here; faults inside the kernel surface
 * at the next synchronising call (cuda_synchronize, a copy). */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK_RETURN(cudaGetLastError())

/* Blocks of `threads` covering n elements, one element per thread. */
static inline unsigned cuda_blocks_for(int n, int threads) {
    return (unsigned)((n + threads - 1) / threads);
}

__device__ static inline float cuda_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ static inline float cuda_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* ops_kv_offset (runtime/base/op_contract.h, host code) on the device: the offset in floats
 * of position j of kv head g in a paged cache whose block table is device data. */
__device__ static inline size_t cuda_kv_offset(const ops_kv &kv, int g, int j, int head_dim) {
    return (size_t)kv.blocks[j / OPS_ATTN_BLOCK] * kv.block_stride + (size_t)g * kv.head_stride +
           (size_t)(j % OPS_ATTN_BLOCK) * (size_t)head_dim;
}

/* One thread's binary counter over chunks (attention.cu, attention_kvp.cu): push a chunk's
 * value; equal-sized neighbours merge (left + right); finish folds the rest right to left.
 * reference/ops.c's tree_acc, so a run covering one aligned subtree gives that subtree's
 * value whoever computes it. Up to 2^32 chunks. */
struct TreeAcc {
    float v[32];
    int level[32];
    int top;
};

__device__ static inline void tree_push(TreeAcc &acc, float x) {
    acc.v[acc.top] = x;
    acc.level[acc.top++] = 0;
    while (acc.top >= 2 && acc.level[acc.top - 2] == acc.level[acc.top - 1]) {
        acc.v[acc.top - 2] = __fadd_rn(acc.v[acc.top - 2], acc.v[acc.top - 1]);
        acc.level[acc.top - 2]++;
        acc.top--;
    }
}

__device__ static inline float tree_finish(TreeAcc &acc) {
    for (int k = acc.top - 1; k >= 1; --k)
        acc.v[k - 1] = __fadd_rn(acc.v[k - 1], acc.v[k]);
    return acc.v[0];
}

#endif
