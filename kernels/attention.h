/* CUDA twin of reference/ops.h attention (naming convention: kernels/README.md): causal GQA
 * attention of one request over its KV cache. Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_ATTENTION_H
#define STRATA_KERNELS_ATTENTION_H

#include <stddef.h>

#include "runtime/base/op_contract.h" /* struct ops_kv */

/* Positions per split-K chunk: an aligned power-of-two number of the reference's
 * OPS_ATTN_BLOCK blocks, so a chunk is one subtree of its block tree (checked in the .cu). */
#define CUDA_ATTN_CHUNK 256

/* Scratch floats of one (query, head) pair of a call at cache position pos with n queries:
 * scores [pos + n], chunk maxes [chunks], chunk parts [chunks][head_dim + 1]. */
static inline size_t cuda_attention_row_floats(int pos, int n, int head_dim) {
    size_t ctx = (size_t)pos + (size_t)n, chunks = (ctx + CUDA_ATTN_CHUNK - 1) / CUDA_ATTN_CHUNK;
    return ctx + chunks * ((size_t)head_dim + 2);
}

/* Scratch floats cuda_attention needs for n queries of nh heads at cache position pos. */
static inline size_t cuda_attention_scratch_floats(int pos, int n, int nh, int head_dim) {
    return (size_t)n * (size_t)nh * cuda_attention_row_floats(pos, n, head_dim);
}

/* out [n, nh*D]; q [n, nh*D] (post q-norm and RoPE); query i sits at cache position pos+i
 * and sees positions 0..pos+i of kv (struct ops_kv, runtime/base/op_contract.h: the layer's
 * keys and values in blocks of OPS_ATTN_BLOCK positions that its block table places; the
 * struct itself is host memory, read by this call; k, v and the table it points at are
 * device memory). Query head h uses kv head h / (nh/nkv). out, q and scratch are device
 * pointers. Where the blocks lie does not change the bits.
 *
 * Differences from the reference's argument list: the thread pool is replaced by
 * `stream`, and `scratch` holds cuda_attention_scratch_floats(pos, n, nh, head_dim) device
 * floats: per (query, head) pair its scores, its chunks' maxes and its chunks' partial sums.
 *
 * Numerics: split-K over chunks of CUDA_ATTN_CHUNK positions (kernels/attention.cu), each
 * chunk whole blocks looked up in the table; each score is the reference's chain of fused
 * multiply-adds q·k in ascending d times D^-0.5; the softmax takes the exact max over all keys
 * seen and expf (CUDA's, within 2 ulp; the reference's ops_expf is within half an ulp); the sum of
 * exps and each output element's sum of e_j v_j[d] follow the reference's split-invariant order
 * (per aligned block of OPS_ATTN_BLOCK positions in ascending j, the blocks combined by the aligned
 * binary tree; a chunk is one subtree of it; the weighted values by __fmaf_rn, as the reference's
 * fmaf), then times the reciprocal of the sum. Everything but expf is the reference's operation
 * sequence (nvcc
 * --fmad=false: every fusion is written), and nothing depends on n, on other
 * requests, on the chunk count, on the launch geometry or on where the blocks lie. head_dim
 * at most OPS_ATTN_MAX_HEAD_DIM (256). Asynchronous on `stream` (three launches); 0 or
 * STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_attention(float *out, const float *q, const struct ops_kv *kv, float *scratch, int pos,
                   int n, int nh, int nkv, int head_dim, void *stream);

#endif
