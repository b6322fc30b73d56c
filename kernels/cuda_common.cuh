/* Shared by the kernels/<op>.cu files only (never by C code): the one way a CUDA call's
 * failure becomes a Strata status, and the argument check every twin runs before it
 * launches, so a bad call fails with a message instead of a launch error later. */
#ifndef STRATA_KERNELS_CUDA_COMMON_CUH
#define STRATA_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

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

/* runtime/base/dtype.h's conversions for a KV cache of 16-bit elements, ported bit for bit
 * (__host__ __device__: cuda_cpu runs the same code). Not CUDA's __float2half_rn /
 * __float2bfloat16_rn: the cache must hold exactly the reference kv_store's bits, NaN
 * patterns included, and these are those functions' own integer steps (round to nearest
 * even, NaN kept quiet, f16 overflow to infinity, subnormals by shifting). */
__host__ __device__ static inline uint32_t cuda_f32_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

__host__ __device__ static inline float cuda_bits_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

__host__ __device__ static inline float cuda_bf16_to_f32(uint16_t v) {
    return cuda_bits_f32((uint32_t)v << 16);
}

__host__ __device__ static inline uint16_t cuda_f32_to_bf16(float f) {
    const uint32_t bits = cuda_f32_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding) >> 16);
}

__host__ __device__ static inline uint16_t cuda_f32_to_f16(float f) {
    const uint32_t bits = cuda_f32_bits(f);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: inf */
    if (abs < 0x38800000u) {                       /* f16 subnormal or 0 */
        if (abs < 0x33000000u) return sign;        /* < 2^-25: rounds to 0 */
        const uint32_t exponent = abs >> 23;
        const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - exponent; /* unit 2^-24 */
        uint32_t result = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (result & 1u))) result++;
        return sign | (uint16_t)result;
    }
    const uint32_t rebased = abs - ((127u - 15u) << 23); /* a carry may bump the exponent */
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return sign | (uint16_t)((rebased + rounding) >> 13);
}

__host__ __device__ static inline float cuda_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return cuda_bits_f32(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return cuda_bits_f32(sign);
        /* A subnormal: mantissa * 2^-24, normalised by integer steps (dtype.c multiplies by
         * 2^-24 in float, exact too; this needs no floating-point mode). */
        int shift = 0;
        uint32_t m = mantissa;
        while (!(m & 0x400u)) {
            m <<= 1;
            ++shift;
        }
        return cuda_bits_f32(sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3ffu) << 13));
    }
    return cuda_bits_f32(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

/* Element i of a KV cache storing DT (struct ops_kv's dtype, a template argument so each
 * kernel is compiled once per stored type): load widens exactly, store rounds as the
 * reference kv_store does. */
template <int DT> __device__ static inline float cuda_kv_widen(uint16_t h) {
    return DT == OPS_BF16 ? cuda_bf16_to_f32(h) : cuda_f16_to_f32(h);
}

template <int DT> __device__ static inline float cuda_kv_load(const void *base, size_t i) {
    if (DT == OPS_F32) return ((const float *)base)[i];
    return cuda_kv_widen<DT>(((const uint16_t *)base)[i]);
}

template <int DT> __device__ static inline void cuda_kv_put(void *base, size_t i, float x) {
    if (DT == OPS_F32)
        ((float *)base)[i] = x;
    else
        ((uint16_t *)base)[i] = DT == OPS_BF16 ? cuda_f32_to_bf16(x) : cuda_f32_to_f16(x);
}

/* 1 for a dtype a KV cache may store (the launchers refuse others before any launch). */
static inline int cuda_kv_dtype_ok(int dtype) {
    return dtype == OPS_F32 || dtype == OPS_BF16 || dtype == OPS_F16;
}

/* ops_kv_offset (runtime/base/op_contract.h, host code) on the device: the offset in elements
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
