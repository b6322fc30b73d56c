/* The CUDA backend of the harness: device memory from kernels/cuda_device.h and one row per
 * kernels/ twin (a build without the toolkit has backend_cuda_absent.c instead). */
#include <stddef.h>

#include "kernels/add_rmsnorm.h"
#include "kernels/attention.h"
#include "kernels/attention_kvp.h"
#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_route.h"
#include "kernels/ops_weight_row.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_apply.h"
#include "kernels/softmax.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "tests/backend_ops/backend_ops.h"

/* Adapters: the reference call of op_cases.c with cuda_ in front and the stream last. */
static int run_rmsnorm(const struct bo_call *c, void *stream) {
    return cuda_rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->s->eps, c->s->n, c->s->dim, stream);
}

static int run_add_rmsnorm(const struct bo_call *c, void *stream) {
    return cuda_add_rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->s->eps, c->s->n,
                            c->s->dim, stream);
}

static int run_swiglu(const struct bo_call *c, void *stream) {
    return cuda_swiglu(c->buf[0], c->buf[1], c->buf[2], c->s->n, stream);
}

static int run_softmax(const struct bo_call *c, void *stream) {
    return cuda_softmax(c->buf[0], c->s->n, stream);
}

static int run_vec_add(const struct bo_call *c, void *stream) {
    return cuda_vec_add(c->buf[0], c->buf[1], c->s->n, stream);
}

static int run_rope_apply(const struct bo_call *c, void *stream) {
    return cuda_rope_apply(c->buf[0], c->buf[1], c->buf[2], c->s->heads, c->s->dim, stream);
}

static int run_qk_norm_rope(const struct bo_call *c, void *stream) {
    return cuda_qk_norm_rope(c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->s->eps, c->buf[4],
                             c->buf[5], c->s->n, c->s->heads, c->s->kv_heads, c->s->dim, stream);
}

static int run_matmul(const struct bo_call *c, void *stream) {
    struct ops_weight w = {c->buf[2], c->s->wtype, c->s->rows, c->s->dim};
    return cuda_matmul(c->buf[0], c->buf[1], &w, c->s->n, stream);
}

/* leaves = pos (op_cases.c). */
static int run_matmul_split(const struct bo_call *c, void *stream) {
    struct ops_weight w = {c->buf[2], c->s->wtype, c->s->rows, c->s->dim};
    return cuda_matmul_split(c->buf[0], c->buf[1], &w, c->s->n, c->s->pos, stream);
}

/* The twin's scratch: cuda_attention_scratch_floats device floats (kernels/attention.h); the
 * view (op_cases.c bo_kv_view) of the paged pools and table already on the device. */
static int run_attention(const struct bo_call *c, void *stream) {
    const struct bo_shape *s = c->s;
    const struct ops_kv kv = bo_kv_view(s, c->buf[2], c->buf[3], c->buf[4]);
    float *scratch = NULL;
    int rc =
        cuda_malloc((void **)&scratch,
                    cuda_attention_scratch_floats(s->pos, s->n, s->heads, s->dim) * sizeof(float));
    if (!rc)
        rc = cuda_attention(c->buf[0], c->buf[1], &kv, scratch, s->pos, s->n, s->heads, s->kv_heads,
                            s->dim, stream);
    if (!rc) rc = cuda_synchronize();
    cuda_free(scratch);
    return rc;
}

/* The view of KVP rank k of the case: global positions [lo, lo + held) at its positions 0..,
 * i.e. the request's table from block lo / 16 on (lo is whole blocks). */
static struct ops_kv rank_view(const struct bo_call *c, int lo) {
    struct ops_kv kv = bo_kv_view(c->s, c->buf[2], c->buf[3], c->buf[4]);
    kv.blocks += lo / OPS_ATTN_BLOCK;
    return kv;
}

/* The KVP group run rank after rank on one device: rank k's keys are the request's
 * positions [k·tokens, k·tokens + held) (its blocks of the same table), its scores, maxima
 * and partials its own; the "all-gathers" are the ranks' buffers side by side. */
static int run_attention_kvp(const struct bo_call *c, void *stream) {
    const struct bo_shape *s = c->s;
    const int K = s->rows, tokens = bo_kvp_tokens(s), D = s->dim, ctx = s->pos + s->n;
    const size_t rows_nh = (size_t)s->n * (size_t)s->heads;
    const size_t part = rows_nh * (size_t)(D + 2), per_scores = rows_nh * (size_t)tokens;
    const float *q = c->buf[1];
    float *scores = NULL, *max = NULL, *max_all = NULL, *parts = NULL;
    int rc = cuda_malloc((void **)&scores, (size_t)K * per_scores * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&max, rows_nh * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&max_all, (size_t)K * rows_nh * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&parts, (size_t)K * part * sizeof(float));
    for (int k = 0; k < K && !rc; ++k) { /* step 1 */
        const int lo = k * tokens, held = ctx - lo < tokens ? ctx - lo : tokens;
        const struct ops_kv kv = rank_view(c, lo);
        rc = cuda_attention_partial_max(max_all + (size_t)k * rows_nh,
                                        scores + (size_t)k * per_scores, q, &kv, s->pos, s->n, lo,
                                        held, s->heads, s->kv_heads, D, stream);
    }
    for (int k = 0; k < K && !rc; ++k) { /* rank k: the group's max from its own, step 2 */
        const int lo = k * tokens, held = ctx - lo < tokens ? ctx - lo : tokens;
        const struct ops_kv kv = rank_view(c, lo);
        if (!(rc = cuda_memcpy_async(max, max_all + (size_t)k * rows_nh, rows_nh * sizeof(float),
                                     CUDA_COPY_ON_DEVICE, stream)) &&
            !(rc = cuda_attention_group_max(max, max_all, K, rows_nh, stream)))
            rc = cuda_attention_partial(parts + (size_t)k * part, scores + (size_t)k * per_scores,
                                        max, &kv, s->pos, s->n, lo, held, s->heads, s->kv_heads, D,
                                        stream);
    }
    if (!rc) rc = cuda_attention_merge(c->buf[0], parts, K, s->n, s->heads, D, stream);
    if (!rc) rc = cuda_synchronize();
    cuda_free(scores);
    cuda_free(max);
    cuda_free(max_all);
    cuda_free(parts);
    return rc;
}

static int run_moe_route(const struct bo_call *c, void *stream) {
    return cuda_moe_route(c->buf[0], c->buf[1], c->buf[2], c->s->pos, c->s->n, c->s->rows, stream);
}

/* tokens = heads (op_cases.c). */
static int run_moe_route_rows(const struct bo_call *c, void *stream) {
    return cuda_moe_route_rows(c->buf[0], c->buf[1], c->buf[2], c->s->pos, c->s->n, c->s->rows,
                               c->s->heads, stream);
}

static int run_ops_weight_row(const struct bo_call *c, void *stream) {
    struct ops_weight w = {c->buf[1], c->s->wtype, c->s->rows, c->s->dim};
    return cuda_ops_weight_row(c->buf[0], &w, c->s->pos, stream);
}

static const struct bo_backend_op cuda_ops[] = {
    {"rmsnorm", run_rmsnorm},
    {"add_rmsnorm", run_add_rmsnorm},
    {"swiglu", run_swiglu},
    {"softmax", run_softmax},
    {"vec_add", run_vec_add},
    {"rope_apply", run_rope_apply},
    {"qk_norm_rope", run_qk_norm_rope},
    {"matmul", run_matmul},
    {"matmul_split", run_matmul_split},
    {"attention", run_attention},
    {"attention_kvp", run_attention_kvp},
    {"moe_route", run_moe_route},
    {"moe_route_rows", run_moe_route_rows},
    {"ops_weight_row", run_ops_weight_row},
};

const struct bo_backend bo_backend_cuda = {
    .name = "cuda",
    .available = cuda_device_available,
    .alloc = cuda_malloc,
    .free = cuda_free,
    .upload = cuda_memcpy_to_device,
    .download = cuda_memcpy_to_host,
    .synchronize = cuda_synchronize,
    .ops = cuda_ops,
    .n_ops = sizeof cuda_ops / sizeof cuda_ops[0],
};
