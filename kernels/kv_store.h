/* CUDA twin of reference/ops.h kv_store (naming convention: kernels/README.md): appending
 * one request's keys and values to its paged cache. A kernel rather than copies so that the
 * append is one kernel node whose arguments a CUDA graph update may change from one decode
 * step to the next (a 2-D memcpy node's addresses cannot be updated). Plain C header: no
 * CUDA types. */
#ifndef STRATA_KERNELS_KV_STORE_H
#define STRATA_KERNELS_KV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/op_contract.h" /* struct ops_kv */

/* For i < n, g < nkv, d < head_dim, position pos + i of kv head g gets
 *   keys:   k [i * row_stride + g * head_dim + d]
 *   values: v [i * row_stride + g * head_dim + d]
 * (struct ops_kv: the struct is host memory, read by this call; the cache and its block
 * table are device memory, and the table must cover positions pos .. pos + n - 1). k, v
 * [n, row_stride] are the projected rows (device). Stored as kv->dtype: f32 copied exactly,
 * bf16 / f16 rounded to nearest even, bit for bit runtime/base/dtype.h's f32_to_bf16 /
 * f32_to_f16 as the reference does. The reference's argument list plus `stream`;
 * asynchronous on it; 0 or STRATA_EINVAL (a dtype other than those three too) /
 * STRATA_EDEVICE. */
int cuda_kv_store(const struct ops_kv *kv, const float *k, const float *v, int row_stride, int pos,
                  int n, int nkv, int head_dim, void *stream);

/* Not a reference op: the KV append of a whole microbatch in one launch (the stage backend's
 * form: one launch per layer however many requests share the step, each row to its own
 * request's blocks). For r < n_rows, g < nkv, d < head_dim:
 *   k_cache[row_dst[r] + g * kv_head_stride + d] = k[r * row_stride + g * head_dim + d]
 * and the same for v, the caches storing `dtype` (OPS_F32, OPS_BF16 or OPS_F16: stored as
 * cuda_kv_store stores it). row_dst [n_rows] (device int64) holds each row's offset in
 * elements from k_cache / v_cache: kv head 0 of the row's position, ops_kv_offset(view, 0,
 * j, head_dim) of its request's view of the layer, computed on the host from the block
 * table; kv_head_stride is the views' head_stride. The caller checks the offsets (they are
 * device data). */
int cuda_kv_store_rows(void *k_cache, void *v_cache, enum ops_dtype dtype, const float *k,
                       const float *v, const int64_t *row_dst, size_t kv_head_stride,
                       int row_stride, int n_rows, int nkv, int head_dim, void *stream);

#endif
