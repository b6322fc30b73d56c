/* Appending one forward item's keys and values to its KV slot, as reference/model.c's
 * store_kv does: not a reference/ops.h op (the reference copies with memcpy), a kernel so
 * that the copy is a kernel node whose arguments a CUDA graph update may change from one
 * decode step to the next (a 2-D memcpy node's addresses cannot be updated). Plain C
 * header: no CUDA types. */
#ifndef STRATA_KERNELS_KV_STORE_H
#define STRATA_KERNELS_KV_STORE_H

#include <stddef.h>
#include <stdint.h>

/* For i < n_tokens, g < nkv, d < head_dim:
 *   k_cache[g * kv_head_stride + (pos + i) * head_dim + d] = k[i * row_stride + g * head_dim + d]
 * and the same for v_cache / v. k_cache, v_cache point at kv head 0 of one (slot, layer)
 * (reference/kv_cache.h's [kv_head][max_seq][head_dim] layout); k, v [n_tokens, row_stride]
 * are the projected rows. Device pointers; an exact copy. Asynchronous on `stream`; 0 or
 * STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_kv_store(float *k_cache, float *v_cache, const float *k, const float *v,
                  size_t kv_head_stride, int row_stride, int pos, int n_tokens, int nkv,
                  int head_dim, void *stream);

/* Not a reference op: the KV append of a whole microbatch in one launch (the stage backend's
 * form: one launch per layer however many requests share the step). For r < n_rows,
 * g < nkv, d < head_dim:
 *   k_cache[row_dst[r] + g * kv_head_stride + d] = k[r * row_stride + g * head_dim + d]
 * and the same for v. row_dst [n_rows] (device int64) holds each row's offset in floats
 * from k_cache / v_cache (the slot's kv head 0 at the row's position). The caller checks
 * the offsets (they are device data). */
int cuda_kv_store_rows(float *k_cache, float *v_cache, const float *k, const float *v,
                       const int64_t *row_dst, size_t kv_head_stride, int row_stride, int n_rows,
                       int nkv, int head_dim, void *stream);

#endif
