/* A host emulation of the kernels/ C API (cuda_device.h and every cuda_<op> the CUDA stage
 * backend calls): "device memory" is host memory and each twin runs its reference op. It
 * lets golden_backends_emulated_test drive runtime/stage/backend_cuda.c's own logic (the
 * weight walk, the layer loop, the device KV layout, pack / restore, MoE grouping,
 * DeepStack runs, query chunking) through every golden case on machines without a GPU.
 * It says nothing about the kernels themselves: tests/backend_ops and tests/kernels check
 * those on a device.
 *
 * It does check the rules of streams and graphs that a device would enforce, or that the
 * backend's design relies on, so breaking them fails here rather than on the first GPU:
 *   - an asynchronous copy's host side must be pinned (cuda_host_alloc);
 *   - once a stream exists, nothing runs on the legacy default stream (NULL);
 *   - while a thread captures a stream: every launch and copy it queues goes to that
 *     stream, and a synchronous call (copy, memset, malloc, synchronize) fails and spoils
 *     the capture, as CUDA's thread-local capture mode makes it
 *     (cudaErrorStreamCaptureUnsupported). The capture state is per thread and shared with
 *     the NCCL emulation (emulated_capture.h), so the collectives of a TP / KVP decode step
 *     are captured under the same rules, each rank's thread capturing its own stream.
 * Captured work runs at once (the graph's later launch does nothing): the results are
 * those of a launch right after capture, which is how the backend uses graphs (the ranks
 * of a group capture the same step together, so their collectives meet as they would when
 * the graphs are launched). A graph "updates" when its node count matches the previous
 * capture, else it "instantiates". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
#include "reference/ops.h"
#include "reference/ops_vision.h"
#include "reference/sampler.h"
#include "reference/thread_pool.h"
#include "runtime/base/status.h"
#include "tests/backend_ops/emulated_capture.h"

/* One pool of one thread: it runs every task on the caller, so backends on several threads
 * (TP / KVP ranks, tests/backend_ops/golden_backends_test.c) may share it. */
static struct thread_pool *the_pool;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) {
    if (thread_pool_init(&the_pool, 1)) abort();
}

static struct thread_pool *pool(void) {
    pthread_once(&pool_once, pool_init);
    return the_pool;
}

/* ---------------------------------------------------------------- the rules checked */

#define MAX_PINNED 256

static struct {
    const char *base;
    size_t bytes;
} pinned[MAX_PINNED];
static int live_streams;
/* Guards pinned[] and live_streams (ranks of a TP / KVP group run as threads). Captures are
 * per thread (emulated_capture.h). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int is_pinned(const void *p, size_t bytes) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_PINNED && !found; ++i)
        if (pinned[i].base && (const char *)p >= pinned[i].base &&
            (const char *)p + bytes <= pinned[i].base + pinned[i].bytes)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

static int spoil(int rc) {
    return emulated_capture_spoil(rc);
}

/* A synchronous call: refused while capturing. */
static int sync_call(const char *fn) {
    return emulated_capture_sync(fn);
}

/* An asynchronous call (launch or async copy) on `stream`. */
static int on_stream(const char *fn, void *stream) {
    pthread_mutex_lock(&lock);
    int streams = live_streams;
    pthread_mutex_unlock(&lock);
    if (!stream && streams > 0)
        return spoil(strata_set_error(STRATA_EDEVICE,
                                      "emulated %s: launched on the default stream while a "
                                      "backend stream exists",
                                      fn));
    return emulated_capture_enqueue(fn, stream);
}

#define ON_STREAM(stream)                                                                          \
    do {                                                                                           \
        int rc_ = on_stream(__func__, stream);                                                     \
        if (rc_) return rc_;                                                                       \
    } while (0)

#define SYNC_CALL()                                                                                \
    do {                                                                                           \
        int rc_ = sync_call(__func__);                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "host emulation of the kernels/ API");
    return 1;
}

int cuda_malloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    SYNC_CALL();
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
    SYNC_CALL();
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    SYNC_CALL();
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes) {
    SYNC_CALL();
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

int cuda_synchronize(void) {
    SYNC_CALL();
    return 0;
}

/* Eight devices sharing the host's memory, so TP / KVP ranks can each name their own
 * (NCCL takes one rank per device). */
#define EMULATED_DEVICES 8

int cuda_set_device(int index) {
    return index >= 0 && index < EMULATED_DEVICES
               ? 0
               : strata_set_error(STRATA_EDEVICE, "no CUDA device %d (emulation has %d)", index,
                                  EMULATED_DEVICES);
}

int cuda_device_describe(int index, char *buf, size_t cap) {
    snprintf(buf, cap, "emulated device %d", index);
    return 0;
}

/* "Device" memory is the host's: what the kernel says is available to allocate. */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES),
               total = sysconf(_SC_PHYS_PAGES);
    if (free_bytes) *free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    if (total_bytes) *total_bytes = page > 0 && total > 0 ? (size_t)page * (size_t)total : 0;
    return 0;
}

int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind) {
    (void)kind;
    SYNC_CALL();
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_memcpy_2d: width > pitch");
    for (size_t r = 0; r < height && width; ++r)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

int cuda_memset(void *dst, int value, size_t bytes) {
    SYNC_CALL();
    memset(dst, value, bytes);
    return 0;
}

int cuda_rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim,
                 void *stream) {
    ON_STREAM(stream);
    rmsnorm(out, x, weight, eps, n, dim);
    return 0;
}

int cuda_swiglu(float *out, const float *gate, const float *up, int n, void *stream) {
    ON_STREAM(stream);
    swiglu(out, gate, up, n);
    return 0;
}

int cuda_softmax(float *x, int n, void *stream) {
    ON_STREAM(stream);
    softmax(x, n);
    return 0;
}

int cuda_vec_add(float *x, const float *y, int n, void *stream) {
    ON_STREAM(stream);
    vec_add(x, y, n);
    return 0;
}

int cuda_matmul(float *out, const float *x, const struct ops_weight *w, int n, void *stream) {
    ON_STREAM(stream);
    if (n > 0 && (const void *)out == (const void *)x)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul: out aliases x");
    matmul(out, x, w, n, pool());
    return 0;
}

int cuda_matmul_split(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                      void *stream) {
    ON_STREAM(stream);
    if (n > 0 && (const void *)out == (const void *)x)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul_split: out aliases x");
    if (leaves < 1 || leaves > OPS_SPLIT_LEAVES || (leaves & (leaves - 1)))
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul_split: leaves %d", leaves);
    matmul_split(out, x, w, n, leaves, pool());
    return 0;
}

/* The reference's scratch (attention_scratch_floats per thread of the one-thread pool) is
 * not the twin's (scores and chunk parts per (query, head)): it gets its own. */
int cuda_attention(float *out, const float *q, const struct ops_kv *kv, float *scratch, int pos,
                   int n, int nh, int nkv, int head_dim, void *stream) {
    ON_STREAM(stream);
    (void)scratch;
    float *work = malloc((size_t)thread_pool_size(pool()) *
                         attention_scratch_floats(pos + n, nh, nkv, head_dim) * sizeof(float));
    if (!work) return strata_set_error(STRATA_ENOMEM, "emulated cuda_attention");
    attention(out, q, kv, work, pos, n, nh, nkv, head_dim, pool());
    free(work);
    return 0;
}

int cuda_attention_partial_max(float *max, float *scores, const float *q, const struct ops_kv *kv,
                               int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                               void *stream) {
    ON_STREAM(stream);
    attention_partial_max(max, scores, q, kv, pos, n, lo, held, nh, nkv, head_dim, pool());
    return 0;
}

int cuda_attention_group_max(float *max, const float *all, int ranks, size_t n, void *stream) {
    ON_STREAM(stream);
    attention_group_max(max, all, ranks, n);
    return 0;
}

int cuda_attention_partial(float *part, const float *scores, const float *m,
                           const struct ops_kv *kv, int pos, int n, int lo, int held, int nh,
                           int nkv, int head_dim, void *stream) {
    ON_STREAM(stream);
    attention_partial(part, scores, m, kv, pos, n, lo, held, nh, nkv, head_dim, pool());
    return 0;
}

int cuda_attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim,
                         void *stream) {
    ON_STREAM(stream);
    attention_merge(out, parts, ranks, n, nh, head_dim);
    return 0;
}

int cuda_rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim,
                    void *stream) {
    ON_STREAM(stream);
    rope_apply(x, cos_t, sin_t, n_heads, head_dim);
    return 0;
}

int cuda_rope_apply_rows(float *x, const float *cos_t, const float *sin_t, int n_rows,
                         int row_stride, int n_heads, int head_dim, void *stream) {
    ON_STREAM(stream);
    size_t half = (size_t)head_dim / 2;
    for (int t = 0; t < n_rows; ++t)
        rope_apply(x + (size_t)t * (size_t)row_stride, cos_t + t * half, sin_t + t * half, n_heads,
                   head_dim);
    return 0;
}

int cuda_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                      int pos_w, const int *mrope_section, int half, void *stream) {
    ON_STREAM(stream);
    rope_cos_sin(cos_out, sin_out, inv_freq, pos_t, pos_h, pos_w, mrope_section, half);
    return 0;
}

int cuda_moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
                   int num_experts, int top_k, void *stream) {
    ON_STREAM(stream);
    moe_route(experts, weights, router_logits, renormalize, num_experts, top_k);
    return 0;
}

int cuda_moe_combine(float *out, const float *y, const int32_t *rows, const float *weights,
                     int count, int dim, void *stream) {
    ON_STREAM(stream);
    for (int j = 0; j < count; ++j) {
        float *o = out + (size_t)rows[j] * (size_t)dim;
        for (int d = 0; d < dim; ++d)
            o[d] += y[(size_t)j * (size_t)dim + d] * weights[j];
    }
    return 0;
}

/* ---------------------------------------------------------------- MoE on the device */

int cuda_moe_route_rows(int *experts, float *weights, const float *router_logits, int renormalize,
                        int num_experts, int top_k, int n, void *stream) {
    ON_STREAM(stream);
    moe_route_rows(experts, weights, router_logits, renormalize, num_experts, top_k, n);
    return 0;
}

int cuda_moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos, const int *experts, int n,
                   int top_k, int num_experts, int experts_lo, int experts_hi, void *stream) {
    ON_STREAM(stream);
    if (experts_lo < 0 || experts_hi > num_experts || experts_lo > experts_hi)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_moe_group: experts [%d, %d)",
                                experts_lo, experts_hi);
    moe_group(offsets, rows, slot_pos, experts, n, top_k, num_experts, experts_lo, experts_hi);
    return 0;
}

/* One matmul (or matmul_split) per group, on the rows the device offsets give. */
int cuda_matmul_grouped(float *out, const float *x, const struct ops_weight *w,
                        const void *const *ptrs, const int32_t *offsets, int n_groups, int cap,
                        int leaves, void *stream) {
    ON_STREAM(stream);
    if (cap > 0 && (const void *)out == (const void *)x)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul_grouped: out aliases x");
    if (leaves < 1 || leaves > OPS_SPLIT_LEAVES || (leaves & (leaves - 1)) || n_groups < 1 ||
        n_groups > 8192) /* kernels/matmul.h */
        return strata_set_error(STRATA_EINVAL, "emulated cuda_matmul_grouped: leaves %d, %d groups",
                                leaves, n_groups);
    for (int g = 0; g < n_groups; ++g) {
        const int lo = offsets[g], hi = offsets[g + 1] < cap ? offsets[g + 1] : cap;
        if (hi <= lo) continue;
        if (!ptrs[g])
            return strata_set_error(STRATA_EINVAL,
                                    "emulated cuda_matmul_grouped: group %d has "
                                    "rows and no weight",
                                    g);
        const struct ops_weight wg = {ptrs[g], w->dtype, w->rows, w->cols};
        float *o = out + (size_t)lo * (size_t)w->rows;
        const float *xg = x + (size_t)lo * (size_t)w->cols;
        if (leaves == 1)
            matmul(o, xg, &wg, hi - lo, pool());
        else
            matmul_split(o, xg, &wg, hi - lo, leaves, pool());
    }
    return 0;
}

/* The reference's moe_expert_sum on a copy of y (its scratch; the device's y is const). */
int cuda_moe_expert_sum(float *out, const float *y, const int32_t *slot_pos, const int *experts,
                        const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                        int dim, void *stream) {
    ON_STREAM(stream);
    if (top_k < 1 || top_k > OPS_MOE_MAX_TOP_K)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_moe_expert_sum: top-k %d", top_k);
    int rows = 0; /* y's rows read: one past the largest held slot's position */
    for (size_t s = 0; s < (size_t)n * (size_t)top_k; ++s)
        if (experts[s] >= experts_lo && experts[s] < experts_hi && slot_pos[s] >= rows)
            rows = slot_pos[s] + 1;
    float *scratch = malloc(((size_t)rows + 1) * (size_t)dim * sizeof(float));
    if (!scratch) return strata_set_error(STRATA_ENOMEM, "emulated cuda_moe_expert_sum");
    memcpy(scratch, y, (size_t)rows * (size_t)dim * sizeof(float));
    moe_expert_sum(out, scratch, slot_pos, experts, weights, n, top_k, experts_lo, experts_hi, dim);
    free(scratch);
    return 0;
}

int cuda_ops_weight_row(float *out, const struct ops_weight *w, int row, void *stream) {
    ON_STREAM(stream);
    ops_weight_row(out, w, row);
    return 0;
}

int cuda_ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n,
                         void *stream) {
    ON_STREAM(stream);
    ops_weight_rows(out, w, rows, n);
    return 0;
}

/* kernels/ops_vision.h: the reference ops (the CUDA vision tower, runtime/stage/
 * vision_cuda.c, and the stage backend's bias add). */
int cuda_add_bias(float *x, const float *bias, int n, int dim, void *stream) {
    ON_STREAM(stream);
    add_bias(x, bias, n, dim);
    return 0;
}

int cuda_layernorm(float *out, const float *x, const float *weight, const float *bias, float eps,
                   int n, int dim, void *stream) {
    ON_STREAM(stream);
    layernorm(out, x, weight, bias, eps, n, dim);
    return 0;
}

int cuda_gelu_tanh(float *out, const float *x, int n, void *stream) {
    ON_STREAM(stream);
    gelu_tanh(out, x, n);
    return 0;
}

int cuda_gelu_erf(float *out, const float *x, int n, void *stream) {
    ON_STREAM(stream);
    gelu_erf(out, x, n);
    return 0;
}

/* The reference needs its own scratch (packed q / k / v), not the twin's scores. */
int cuda_vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                          int n_segments, int n, int nh, int head_dim, void *stream) {
    ON_STREAM(stream);
    (void)scratch;
    int longest = 0;
    for (int s = 0; s < n_segments; ++s)
        if (cu_seqlens[s + 1] - cu_seqlens[s] > longest)
            longest = cu_seqlens[s + 1] - cu_seqlens[s];
    float *work = malloc(vision_attention_scratch(n, longest, nh, head_dim, 1) * sizeof(float));
    if (!work) return strata_set_error(STRATA_ENOMEM, "emulated cuda_vision_attention");
    vision_attention(out, qkv, work, cu_seqlens, n_segments, n, nh, head_dim, pool());
    free(work);
    return 0;
}

int cuda_argmax(int32_t *out, const float *x, int n, void *stream) {
    ON_STREAM(stream);
    *out = argmax(x, n);
    return 0;
}

int cuda_argmax_rows(int32_t *out, const float *x, int n_rows, int n, void *stream) {
    ON_STREAM(stream);
    for (int r = 0; r < n_rows; ++r)
        out[r] = argmax(x + (size_t)r * (size_t)n, n);
    return 0;
}

int cuda_argmax_part_rows(float *pairs, const float *x, int n_rows, int n, int start,
                          void *stream) {
    ON_STREAM(stream);
    for (int r = 0; r < n_rows; ++r) {
        struct argmax_candidate c = argmax_part(x + (size_t)r * (size_t)n, n, start);
        pairs[2 * r] = c.value;
        pairs[2 * r + 1] = (float)c.index;
    }
    return 0;
}

int cuda_kv_store(const struct ops_kv *kv, const float *k, const float *v, int row_stride, int pos,
                  int n, int nkv, int head_dim, void *stream) {
    ON_STREAM(stream);
    if (n < 0 || pos < 0 || row_stride < nkv * head_dim)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_kv_store: bad arguments");
    kv_store(kv, k, v, row_stride, pos, n, nkv, head_dim);
    return 0;
}

/* Each row through the reference kv_store (its rounding for a 16-bit cache): a view whose
 * one block starts at the row's offset, so position 0 of it is the row. */
int cuda_kv_store_rows(void *k_cache, void *v_cache, enum ops_dtype dtype, const float *k,
                       const float *v, const int64_t *row_dst, size_t kv_head_stride,
                       int row_stride, int n_rows, int nkv, int head_dim, void *stream) {
    ON_STREAM(stream);
    if (dtype != OPS_F32 && dtype != OPS_BF16 && dtype != OPS_F16)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_kv_store_rows: kv dtype %d",
                                (int)dtype);
    const size_t es = ops_kv_elem_bytes(dtype);
    static const int32_t block0 = 0;
    for (int r = 0; r < n_rows; ++r) {
        const size_t at = (size_t)row_dst[r] * es;
        const struct ops_kv row = {.k = (char *)k_cache + at,
                                   .v = (char *)v_cache + at,
                                   .blocks = &block0,
                                   .head_stride = kv_head_stride,
                                   .dtype = dtype};
        kv_store(&row, k + (size_t)r * (size_t)row_stride, v + (size_t)r * (size_t)row_stride,
                 row_stride, 0, 1, nkv, head_dim);
    }
    return 0;
}

/* ---------------------------------------------------------------- streams, pinned, async */

int cuda_stream_create(void **stream) {
    SYNC_CALL();
    *stream = malloc(1);
    if (!*stream) return strata_set_error(STRATA_ENOMEM, "emulated cuda_stream_create");
    pthread_mutex_lock(&lock);
    live_streams++;
    pthread_mutex_unlock(&lock);
    return 0;
}

void cuda_stream_destroy(void *stream) {
    if (!stream) return;
    free(stream);
    pthread_mutex_lock(&lock);
    live_streams--;
    pthread_mutex_unlock(&lock);
}

int cuda_stream_synchronize(void *stream) {
    (void)stream;
    SYNC_CALL();
    return 0;
}

/* Work runs at once here, so an event only has to exist: a record before its first wait is
 * checked (a wait on a never-recorded event orders nothing on a device). */
struct emulated_event {
    int recorded;
};

int cuda_event_create(void **event) {
    SYNC_CALL();
    *event = calloc(1, sizeof(struct emulated_event));
    return *event ? 0 : strata_set_error(STRATA_ENOMEM, "emulated cuda_event_create");
}

void cuda_event_destroy(void *event) {
    free(event);
}

int cuda_event_record(void *event, void *stream) {
    ON_STREAM(stream);
    ((struct emulated_event *)event)->recorded = 1;
    return 0;
}

int cuda_stream_wait_event(void *stream, void *event) {
    ON_STREAM(stream);
    if (!((struct emulated_event *)event)->recorded)
        return spoil(strata_set_error(STRATA_EDEVICE,
                                      "emulated cuda_stream_wait_event: event never recorded"));
    return 0;
}

int cuda_host_alloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    SYNC_CALL();
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return strata_set_error(STRATA_ENOMEM, "emulated cuda_host_alloc %zu", bytes);
    memset(p, 0xff, bytes);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_PINNED; ++i)
        if (!pinned[i].base) {
            pinned[i].base = *ptr = p;
            pinned[i].bytes = bytes;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    free(p);
    return strata_set_error(STRATA_ENOMEM, "emulated cuda_host_alloc: more than %d blocks",
                            MAX_PINNED);
}

void cuda_host_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_PINNED; ++i)
        if (pinned[i].base == ptr) pinned[i].base = NULL;
    pthread_mutex_unlock(&lock);
    free(ptr);
}

/* The host side of an asynchronous copy must be pinned. */
static int host_side_pinned(const char *fn, void *dst, const void *src, size_t span,
                            enum cuda_copy_kind kind) {
    const void *host = kind == CUDA_COPY_TO_DEVICE ? src : kind == CUDA_COPY_TO_HOST ? dst : NULL;
    if (host && span && !is_pinned(host, span))
        return spoil(strata_set_error(STRATA_EDEVICE,
                                      "emulated %s: host memory %p (%zu bytes) is not pinned", fn,
                                      host, span));
    return 0;
}

int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                      void *stream) {
    ON_STREAM(stream);
    int rc = host_side_pinned(__func__, dst, src, bytes, kind);
    if (!rc && bytes) memmove(dst, src, bytes);
    return rc;
}

int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cuda_copy_kind kind, void *stream) {
    ON_STREAM(stream);
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_memcpy_2d_async: width > pitch");
    if (!width || !height) return 0;
    int rc = host_side_pinned(
        __func__, kind == CUDA_COPY_TO_HOST ? dst : NULL, kind == CUDA_COPY_TO_DEVICE ? src : NULL,
        (height - 1) * (kind == CUDA_COPY_TO_HOST ? dpitch : spitch) + width, kind);
    for (size_t r = 0; r < height && !rc; ++r)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return rc;
}

int cuda_memset_async(void *dst, int value, size_t bytes, void *stream) {
    ON_STREAM(stream);
    memset(dst, value, bytes);
    return 0;
}

/* ---------------------------------------------------------------- graphs */

struct emulated_graph {
    int nodes;
};

int cuda_graph_capture_begin(void *stream) {
    return emulated_capture_begin(stream);
}

void cuda_graph_capture_abort(void *stream) {
    emulated_capture_abort(stream);
}

int cuda_graph_capture_end(void *stream, void **exec, int *instantiated) {
    int captured_ops = 0;
    *instantiated = 0;
    int rc = emulated_capture_end(stream, &captured_ops);
    if (rc) return rc;
    struct emulated_graph *g = *exec;
    if (g && g->nodes == captured_ops) return 0; /* updated in place */
    free(g);
    *exec = g = malloc(sizeof *g);
    if (!g) return strata_set_error(STRATA_ENOMEM, "emulated capture_end");
    g->nodes = captured_ops;
    *instantiated = 1;
    return 0;
}

int cuda_graph_launch(void *exec, void *stream) {
    ON_STREAM(stream);
    if (!exec) return strata_set_error(STRATA_EINVAL, "emulated cuda_graph_launch: no graph");
    return 0; /* its work ran while it was captured */
}

void cuda_graph_exec_destroy(void *exec) {
    free(exec);
}
