/* CUDA twins of reference/ops.h's KV-parallel attention (attention_partial_max,
 * attention_partial, attention_merge; naming convention: kernels/README.md) and of the
 * group max between them (attention_group_max).
 * Plain C header: no CUDA types. All pointers are device pointers; every call is
 * asynchronous on `stream` and returns 0 or STRATA_EINVAL / STRATA_EDEVICE.
 *
 * Numerics: the reference's operation sequence (nvcc --fmad=false, __fadd_rn / __fmaf_rn):
 * each score is the chain of fused multiply-adds q·k in ascending d times D^-0.5 (the same code
 * as cuda_attention's scores), the max exact, e_j = expf(s_j - M) (CUDA's expf, within 2 ulp;
 * the reference's ops_expf: the only difference from the reference), per aligned block of
 * OPS_ATTN_BLOCK positions the sum of e_j and the fused sum of e_j v_j[d] in ascending j, the
 * blocks and then the ranks' parts combined by the reference's binary counter
 * (reference/ops_attention.c tree_acc). So a KVP group's merge has the bits of one rank's
 * cuda_attention (whose chunks are subtrees of the same tree) up to expf. */
#ifndef STRATA_KERNELS_ATTENTION_KVP_H
#define STRATA_KERNELS_ATTENTION_KVP_H

#include <stddef.h>

#include "runtime/base/op_contract.h" /* struct ops_kv */

/* Step 1: scores [n*nh][held] = each (query, head)'s scores over the keys (kv->k) it sees
 * here (global positions [lo, min(lo + held, pos + i + 1)) at cache positions 0.. of kv,
 * struct ops_kv: the struct host memory, what it points at device memory), max [n*nh]
 * their max (-inf when it sees none). The reference's argument list, the pool replaced by
 * `stream`. */
int cuda_attention_partial_max(float *max, float *scores, const float *q, const struct ops_kv *kv,
                               int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                               void *stream);

/* max [n] <- the group's max: starting from max[t] (this rank's), every all[k][t] (k <
 * ranks) greater than it replaces it, in ascending k (reference/ops.h attention_group_max). */
int cuda_attention_group_max(float *max, const float *all, int ranks, size_t n, void *stream);

/* Step 2: part [n, nh, D+2] per (query, head): o [D] and l of this rank's subtree (values
 * kv->v, as step 1's view) with e_j = exp(s_j - m[query, head]), then 1 if the query sees a
 * key here, else 0 (o = l = 0). */
int cuda_attention_partial(float *part, const float *scores, const float *m,
                           const struct ops_kv *kv, int pos, int n, int lo, int held, int nh,
                           int nkv, int head_dim, void *stream);

/* out [n, nh*D] = the ranks' parts [ranks][n][nh][D+2] merged by the top of the aligned
 * tree (ranks whose flag is 0 skipped), times 1/l; zeros where no rank saw a key. */
int cuda_attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim,
                         void *stream);

#endif
