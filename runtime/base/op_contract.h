/* The contract between the reference ops (reference/ops.h) and their device twins
 * (kernels/): the weight view they both read and the constants that fix their reduction
 * orders, so that a twin can give the reference's bits. It sits below both: kernels/ needs
 * nothing of the reference's code to agree with it. What the orders are is written in
 * reference/ops.h (the numerical truth); a forward pass's rows and items are in
 * runtime/model/decoder_io.h. Header only. */
#ifndef STRATA_RUNTIME_BASE_OP_CONTRACT_H
#define STRATA_RUNTIME_BASE_OP_CONTRACT_H

#include <stddef.h>
#include <stdint.h>

/* OPS_Q8: 8-bit blocks quantised at load (reference/ops_q8.h); matmul runs it with its own
 * arithmetic (activations quantised too), so its results differ from bf16's. OPS_F16: IEEE
 * half, a KV cache's storage only (struct ops_kv). */
enum ops_dtype { OPS_F32 = 0, OPS_BF16 = 1, OPS_Q8 = 2, OPS_F16 = 3 };

/* A row-major weight matrix [rows, cols] (nn.Linear layout: y = x @ W^T), in the memory of
 * whoever reads it (the host for reference/ops, the device for kernels/). */
struct ops_weight {
    const void *data; /* bf16 (uint16 bit patterns) or f32 [rows][cols]; OPS_Q8: int8
                         [rows][cols] followed by f32 scales [rows][cols / 32] (ops_q8.h) */
    enum ops_dtype dtype;
    int rows;
    int cols;
};

/* matmul_multi's most matrices per call (and its device twin's). */
#define OPS_MULTI_MAX 4

/* Leaves of a split-invariant dot product (matmul_split): TP degrees must divide it. */
#define OPS_SPLIT_LEAVES 8

/* Positions per block of attention's split-invariant sums. */
#define OPS_ATTN_BLOCK 16

/* Where one layer's cached keys and values of one request live: in blocks of OPS_ATTN_BLOCK
 * positions, so a block is one leaf of attention's tree and a request's sums keep their order
 * wherever its blocks are. Elements are `dtype`: OPS_F32, or OPS_BF16 / OPS_F16 (uint16 bit
 * patterns: kv_store rounds to nearest even, attention widens exactly, runtime/base/dtype.h).
 * Position j (0-based in what the cache holds) of kv head g is the head_dim elements at
 *   k (or v) + blocks[j / OPS_ATTN_BLOCK] * block_stride + g * head_stride
 *            + (j % OPS_ATTN_BLOCK) * head_dim.
 * A paged pool ([block][layer][kv_head][OPS_ATTN_BLOCK][head_dim], reference/kv_cache.h)
 * has k at the layer's head 0 of block 0, head_stride = OPS_ATTN_BLOCK * head_dim and
 * block_stride = one whole block; a contiguous [kv_head][seq][head_dim] cache is the same
 * view with blocks[b] = b, block_stride = OPS_ATTN_BLOCK * head_dim, head_stride = seq *
 * head_dim (strides in elements). All in the memory of whoever reads them (the block table
 * too). */
struct ops_kv {
    void *k, *v; /* written by kv_store, read by attention */
    const int32_t *blocks;
    size_t block_stride, head_stride;
    enum ops_dtype dtype; /* 0: OPS_F32 */
};

/* Bytes of one cached element. */
static inline size_t ops_kv_elem_bytes(enum ops_dtype dtype) {
    return dtype == OPS_F32 ? 4 : 2;
}

/* Offset in elements of position j of kv head g (see struct ops_kv). */
static inline size_t ops_kv_offset(const struct ops_kv *kv, int g, int j, int head_dim) {
    return (size_t)kv->blocks[j / OPS_ATTN_BLOCK] * kv->block_stride + (size_t)g * kv->head_stride +
           (size_t)(j % OPS_ATTN_BLOCK) * (size_t)head_dim;
}

/* attention's largest head_dim (its block tree's partial sums live on the stack). */
#define OPS_ATTN_MAX_HEAD_DIM 256

/* Most experts per token the MoE sum takes (its per-row list lives on the stack). */
#define OPS_MOE_MAX_TOP_K 64

#endif
