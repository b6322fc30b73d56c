/* A host emulation of the kernels/ C API (cuda_device.h and every cuda_<op> the CUDA stage
 * backend calls): "device memory" is host memory and each twin runs its reference op. It
 * lets golden_backends_emulated_test drive runtime/stage/backend_cuda.c's own logic (the
 * weight walk, the layer loop, the device KV layout, pack / restore, MoE grouping,
 * DeepStack runs, query chunking) through every golden case on machines without a GPU.
 * It says nothing about the kernels themselves: tests/backend_ops and tests/kernels check
 * those on a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/moe_route.h"
#include "kernels/ops_weight_row.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_apply.h"
#include "kernels/rope_cos_sin.h"
#include "kernels/softmax.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "runtime/base/status.h"

static struct thread_pool *pool(void) {
    static struct thread_pool *p;
    if (!p && thread_pool_init(&p, 1)) abort();
    return p;
}

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "host emulation of the kernels/ API");
    return 1;
}

int cuda_malloc(void **ptr, size_t bytes) {
    /* Filled with NaN-ish garbage so a read of unwritten memory shows. */
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr) return strata_set_error(STRATA_ENOMEM, "emulated cuda_malloc %zu", bytes);
    memset(*ptr, 0xff, bytes);
    return 0;
}

void cuda_free(void *ptr) {
    free(ptr);
}

int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

int cuda_synchronize(void) {
    return 0;
}

int cuda_set_device(int index) {
    return index == 0 ? 0
                      : strata_set_error(STRATA_EDEVICE, "no CUDA device %d (emulation has 1)",
                                         index);
}

int cuda_device_describe(int index, char *buf, size_t cap) {
    snprintf(buf, cap, "emulated device %d", index);
    return 0;
}

int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind) {
    (void)kind;
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_memcpy_2d: width > pitch");
    for (size_t r = 0; r < height && width; ++r)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

int cuda_memset(void *dst, int value, size_t bytes) {
    memset(dst, value, bytes);
    return 0;
}

int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim,
                 void *stream) {
    (void)stream;
    rmsnorm(out, x, weight, eps, n, dim);
    return 0;
}

int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream) {
    (void)stream;
    swiglu(out, gate, up, n);
    return 0;
}

int cuda_softmax(float *x, int n, void *stream) {
    (void)stream;
    softmax(x, n);
    return 0;
}

int cuda_vec_add(float *x, const float *y, int n, void *stream) {
    (void)stream;
    vec_add(x, y, n);
    return 0;
}

int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n, void *stream) {
    (void)stream;
    if (n > 0 && (const void *)out == (const void *)x)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul: out aliases x");
    matmul(out, x, w, n, pool());
    return 0;
}

int cuda_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                   size_t kv_head_stride, float *scratch, int pos, int n, int nh, int nkv,
                   int head_dim, void *stream) {
    (void)stream;
    attention(out, q, k_cache, v_cache, kv_head_stride, scratch, pos, n, nh, nkv, head_dim,
              pool());
    return 0;
}

int cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim,
                    void *stream) {
    (void)stream;
    rope_apply(x, cos_t, sin_t, n_heads, head_dim);
    return 0;
}

int cuda_rope_apply_rows(float *x, const float *cos_t, const float *sin_t, int n_rows,
                         int row_stride, int n_heads, int head_dim, void *stream) {
    (void)stream;
    size_t half = (size_t)head_dim / 2;
    for (int t = 0; t < n_rows; ++t)
        rope_apply(x + (size_t)t * (size_t)row_stride, cos_t + t * half, sin_t + t * half, n_heads,
                   head_dim);
    return 0;
}

int cuda_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                      int pos_w, const int *mrope_section, int half, void *stream) {
    (void)stream;
    rope_cos_sin(cos_out, sin_out, inv_freq, pos_t, pos_h, pos_w, mrope_section, half);
    return 0;
}

int cuda_moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
                   int num_experts, int top_k, void *stream) {
    (void)stream;
    moe_route(experts, weights, router_logits, renormalize, num_experts, top_k);
    return 0;
}

int cuda_moe_combine(float *out, const float *y, const int32_t *rows, const float *weights,
                     int count, int dim, void *stream) {
    (void)stream;
    for (int j = 0; j < count; ++j) {
        float *o = out + (size_t)rows[j] * (size_t)dim;
        for (int d = 0; d < dim; ++d)
            o[d] += y[(size_t)j * (size_t)dim + d] * weights[j];
    }
    return 0;
}

int cuda_ops_weight_row(float *out, const struct ops_weight *w, int row, void *stream) {
    (void)stream;
    ops_weight_row(out, w, row);
    return 0;
}

int cuda_ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n,
                         void *stream) {
    (void)stream;
    for (int i = 0; i < n; ++i)
        ops_weight_row(out + (size_t)i * (size_t)w->cols, w, rows[i]);
    return 0;
}
