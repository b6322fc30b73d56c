/* The CUDA entry points for builds without the toolkit (--define=strata_cuda=0, set by
 * ./strata when /usr/local/cuda/bin/nvcc is absent): every call reports that the toolkit
 * is missing, so GPU tests print "skipped: ..." and GPU paths fail with a clear error
 * instead of the build breaking. Every cuda_<op> of kernels/ needs its stub here. */
#include <stdio.h>

#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/attention_kvp.h"
#include "kernels/cuda_device.h"
#include "kernels/kv_store.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/moe_group.h"
#include "kernels/moe_route.h"
#include "kernels/ops_vision.h"
#include "kernels/ops_weight_row.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_apply.h"
#include "kernels/rope_cos_sin.h"
#include "kernels/softmax.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "runtime/base/status.h"

static const char *const reason_text = "CUDA toolkit not installed (nvcc not found)";

static int unavailable(const char *fn) {
    return strata_set_error(STRATA_EDEVICE, "%s: %s", fn, reason_text);
}

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "%s", reason_text);
    return 0;
}

int cuda_malloc(void **ptr, size_t bytes) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return unavailable(__func__);
}

void cuda_free(void *ptr) {
    (void)ptr;
}

int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unavailable(__func__);
}

int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unavailable(__func__);
}

int cuda_synchronize(void) {
    return unavailable(__func__);
}

int cuda_set_device(int index) {
    (void)index;
    return unavailable(__func__);
}

int cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return unavailable(__func__);
}

int cuda_device_describe(int index, char *buf, size_t cap) {
    (void)index;
    if (buf && cap) snprintf(buf, cap, "%s", reason_text);
    return unavailable(__func__);
}

int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unavailable(__func__);
}

int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind) {
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)kind;
    return unavailable(__func__);
}

int cuda_memset(void *dst, int value, size_t bytes) {
    (void)dst, (void)value, (void)bytes;
    return unavailable(__func__);
}

int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n, void *stream) {
    (void)out, (void)x, (void)w, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_matmul_split(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                      void *stream) {
    (void)out, (void)x, (void)w, (void)n, (void)leaves, (void)stream;
    return unavailable(__func__);
}

int cuda_attention(float *out, const float *q, const struct ops_kv *kv, float *scratch, int pos,
                   int n, int nh, int nkv, int head_dim, void *stream) {
    (void)out, (void)q, (void)kv, (void)scratch;
    (void)pos, (void)n, (void)nh, (void)nkv, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_attention_partial_max(float *max, float *scores, const float *q, const struct ops_kv *kv,
                               int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                               void *stream) {
    (void)max, (void)scores, (void)q, (void)kv, (void)pos, (void)n;
    (void)lo, (void)held, (void)nh, (void)nkv, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_attention_group_max(float *max, const float *all, int ranks, size_t n, void *stream) {
    (void)max, (void)all, (void)ranks, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_attention_partial(float *part, const float *scores, const float *m,
                           const struct ops_kv *kv, int pos, int n, int lo, int held, int nh,
                           int nkv, int head_dim, void *stream) {
    (void)part, (void)scores, (void)m, (void)kv, (void)pos, (void)n;
    (void)lo, (void)held, (void)nh, (void)nkv, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim,
                         void *stream) {
    (void)out, (void)parts, (void)ranks, (void)n, (void)nh, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim,
                    void *stream) {
    (void)x, (void)cos_t, (void)sin_t, (void)n_heads, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_rope_apply_rows(float *x, const float *cos_t, const float *sin_t, int n_rows,
                         int row_stride, int n_heads, int head_dim, void *stream) {
    (void)x, (void)cos_t, (void)sin_t, (void)n_rows, (void)row_stride, (void)n_heads;
    (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                      int pos_w, const int *mrope_section, int half, void *stream) {
    (void)cos_out, (void)sin_out, (void)inv_freq, (void)pos_t, (void)pos_h, (void)pos_w;
    (void)mrope_section, (void)half, (void)stream;
    return unavailable(__func__);
}

int cuda_moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
                   int num_experts, int top_k, void *stream) {
    (void)experts, (void)weights, (void)router_logits, (void)renormalize, (void)num_experts;
    (void)top_k, (void)stream;
    return unavailable(__func__);
}

int cuda_moe_combine(float *out, const float *y, const int32_t *rows, const float *weights,
                     int count, int dim, void *stream) {
    (void)out, (void)y, (void)rows, (void)weights, (void)count, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_moe_route_rows(int *experts, float *weights, const float *router_logits, int renormalize,
                        int num_experts, int top_k, int n, void *stream) {
    (void)experts, (void)weights, (void)router_logits, (void)renormalize, (void)num_experts;
    (void)top_k, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos, const int *experts, int n,
                   int top_k, int num_experts, int experts_lo, int experts_hi, void *stream) {
    (void)offsets, (void)rows, (void)slot_pos, (void)experts, (void)n, (void)top_k;
    (void)num_experts, (void)experts_lo, (void)experts_hi, (void)stream;
    return unavailable(__func__);
}

int cuda_moe_expert_sum(float *out, const float *y, const int32_t *slot_pos, const int *experts,
                        const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                        int dim, void *stream) {
    (void)out, (void)y, (void)slot_pos, (void)experts, (void)weights, (void)n, (void)top_k;
    (void)experts_lo, (void)experts_hi, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_matmul_grouped(float *out, const float *x, const struct ops_weight *w,
                        const void *const *ptrs, const int32_t *offsets, int n_groups, int cap,
                        int leaves, void *stream) {
    (void)out, (void)x, (void)w, (void)ptrs, (void)offsets, (void)n_groups, (void)cap;
    (void)leaves, (void)stream;
    return unavailable(__func__);
}

int cuda_ops_weight_row(float *out, const struct ops_weight *w, int row, void *stream) {
    (void)out, (void)w, (void)row, (void)stream;
    return unavailable(__func__);
}

int cuda_ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n,
                         void *stream) {
    (void)out, (void)w, (void)rows, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim,
                 void *stream) {
    (void)out, (void)x, (void)weight, (void)eps, (void)n, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream) {
    (void)out, (void)gate, (void)up, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_softmax(float *x, int n, void *stream) {
    (void)x, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_vec_add(float *x, const float *y, int n, void *stream) {
    (void)x, (void)y, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_argmax(int32_t *out, const float *x, int n, void *stream) {
    (void)out, (void)x, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_argmax_rows(int32_t *out, const float *x, int n_rows, int n, void *stream) {
    (void)out, (void)x, (void)n_rows, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_argmax_part_rows(float *pairs, const float *x, int n_rows, int n, int start,
                          void *stream) {
    (void)pairs, (void)x, (void)n_rows, (void)n, (void)start, (void)stream;
    return unavailable(__func__);
}

int cuda_kv_store(const struct ops_kv *kv, const float *k, const float *v, int row_stride, int pos,
                  int n, int nkv, int head_dim, void *stream) {
    (void)kv, (void)k, (void)v, (void)row_stride;
    (void)pos, (void)n, (void)nkv, (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_stream_create(void **stream) {
    if (stream) *stream = NULL;
    return unavailable(__func__);
}

void cuda_stream_destroy(void *stream) {
    (void)stream;
}

int cuda_stream_synchronize(void *stream) {
    (void)stream;
    return unavailable(__func__);
}

int cuda_host_alloc(void **ptr, size_t bytes) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return unavailable(__func__);
}

void cuda_host_free(void *ptr) {
    (void)ptr;
}

int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                      void *stream) {
    (void)dst, (void)src, (void)bytes, (void)kind, (void)stream;
    return unavailable(__func__);
}

int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cuda_copy_kind kind, void *stream) {
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)kind;
    (void)stream;
    return unavailable(__func__);
}

int cuda_memset_async(void *dst, int value, size_t bytes, void *stream) {
    (void)dst, (void)value, (void)bytes, (void)stream;
    return unavailable(__func__);
}

int cuda_graph_capture_begin(void *stream) {
    (void)stream;
    return unavailable(__func__);
}

int cuda_graph_capture_end(void *stream, void **exec, int *instantiated) {
    (void)stream, (void)exec;
    if (instantiated) *instantiated = 0;
    return unavailable(__func__);
}

void cuda_graph_capture_abort(void *stream) {
    (void)stream;
}

int cuda_graph_launch(void *exec, void *stream) {
    (void)exec, (void)stream;
    return unavailable(__func__);
}

void cuda_graph_exec_destroy(void *exec) {
    (void)exec;
}

int cuda_layernorm(float *out, const float *x, const float *weight, const float *bias, float eps,
                   int n, int dim, void *stream) {
    (void)out, (void)x, (void)weight, (void)bias, (void)eps, (void)n, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_add_bias(float *x, const float *bias, int n, int dim, void *stream) {
    (void)x, (void)bias, (void)n, (void)dim, (void)stream;
    return unavailable(__func__);
}

int cuda_gelu_tanh(float *out, const float *x, int n, void *stream) {
    (void)out, (void)x, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_gelu_erf(float *out, const float *x, int n, void *stream) {
    (void)out, (void)x, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_linspace_f32(float *out, float end, int steps, void *stream) {
    (void)out, (void)end, (void)steps, (void)stream;
    return unavailable(__func__);
}

int cuda_vision_pos_embed(float *out, const float *table, int grid, int t, int h, int w, int merge,
                          int dim, void *stream) {
    (void)out, (void)table, (void)grid, (void)t, (void)h, (void)w, (void)merge, (void)dim;
    (void)stream;
    return unavailable(__func__);
}

int cuda_vision_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int row,
                             int col, int quarter, void *stream) {
    (void)cos_out, (void)sin_out, (void)inv_freq, (void)row, (void)col, (void)quarter, (void)stream;
    return unavailable(__func__);
}

int cuda_vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                          int n_segments, int n, int nh, int head_dim, void *stream) {
    (void)out, (void)qkv, (void)scratch, (void)cu_seqlens, (void)n_segments, (void)n, (void)nh;
    (void)head_dim, (void)stream;
    return unavailable(__func__);
}

int cuda_event_create(void **event) {
    if (event) *event = NULL;
    return unavailable(__func__);
}

void cuda_event_destroy(void *event) {
    (void)event;
}

int cuda_event_record(void *event, void *stream) {
    (void)event, (void)stream;
    return unavailable(__func__);
}

int cuda_stream_wait_event(void *stream, void *event) {
    (void)stream, (void)event;
    return unavailable(__func__);
}

int cuda_kv_store_rows(void *k_cache, void *v_cache, enum ops_dtype dtype, const float *k,
                       const float *v, const int64_t *row_dst, size_t kv_head_stride,
                       int row_stride, int n_rows, int nkv, int head_dim, void *stream) {
    (void)k_cache, (void)v_cache, (void)dtype, (void)k, (void)v, (void)row_dst;
    (void)kv_head_stride;
    (void)row_stride, (void)n_rows, (void)nkv, (void)head_dim, (void)stream;
    return unavailable(__func__);
}
