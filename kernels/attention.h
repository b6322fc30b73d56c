/* CUDA twin of reference/ops.h attention (naming convention: kernels/README.md): causal GQA
 * attention of one request over its KV cache. Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_ATTENTION_H
#define STRATA_KERNELS_ATTENTION_H

#include <stddef.h>

/* out [n, nh*D]; q [n, nh*D] (post q-norm and RoPE); query i sits at cache position pos+i
 * and sees positions 0..pos+i. k_cache/v_cache point at kv head 0 of the layer: kv head
 * g's keys are k_cache + g*kv_head_stride, [max_seq][D] (reference/kv_cache.h's layout).
 * Query head h uses kv head h / (nh/nkv). All pointers are device pointers.
 *
 * Differences from the reference's argument list: the thread pool is replaced by
 * `stream`, and `scratch` holds [n * nh][pos + n] device floats (one score row per
 * (query, head) pair, instead of one per CPU thread).
 *
 * Numerics: one block per (query, head); each score is the reference's sequential q·k in
 * ascending d times D^-0.5; the softmax takes the exact max and expf (CUDA's, within 2 ulp
 * of glibc's); the sum of exps and each output element's sum of e_j v_j[d] follow the
 * reference's split-invariant order (per aligned block of OPS_ATTN_BLOCK positions in
 * ascending j, the blocks combined by the aligned binary tree), then times the reciprocal of
 * the sum. Everything but expf is the reference's operation sequence (nvcc --fmad=false),
 * and nothing depends on n, on other requests or on the launch geometry. Asynchronous on
 * `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                   size_t kv_head_stride, float *scratch, int pos, int n, int nh, int nkv,
                   int head_dim, void *stream);

#endif
