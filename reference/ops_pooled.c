/* The row-wise and element-wise ops on a thread pool (see ops.h): each output element is
 * computed whole by one call of the plain op, so the bits are the op's for any thread count. */
#include "reference/ops.h"

struct pooled_job {
    float *out;
    const float *x, *w, *up, *cos_t, *sin_t;
    float eps;
    int dim, row_floats, heads, head_dim;
};

/* task over [0, count): on the pool, or on the caller where there is one item or none (no
 * dispatch for a decode row). */
static void run_tasks(struct thread_pool *pool, void (*task)(void *, int, int, int),
                      struct pooled_job *j, int count) {
    if (count < 2)
        task(j, 0, count, 0);
    else
        thread_pool_run(pool, task, j, count);
}

/* The job's dim floats in slices of OPS_ELEMENTWISE_SLICE. */
static int slices_of(const struct pooled_job *j) {
    return (j->dim + OPS_ELEMENTWISE_SLICE - 1) / OPS_ELEMENTWISE_SLICE;
}

static void rmsnorm_task(void *ctx, int begin, int end, int worker) {
    const struct pooled_job *j = ctx;
    (void)worker;
    const size_t d = (size_t)j->dim;
    rmsnorm(j->out + (size_t)begin * d, j->x + (size_t)begin * d, j->w, j->eps, end - begin,
            j->dim);
}

static void rope_task(void *ctx, int begin, int end, int worker) {
    const struct pooled_job *j = ctx;
    (void)worker;
    const size_t half = (size_t)j->head_dim / 2;
    for (int i = begin; i < end; ++i)
        rope_apply(j->out + (size_t)i * (size_t)j->row_floats, j->cos_t + (size_t)i * half,
                   j->sin_t + (size_t)i * half, j->heads, j->head_dim);
}

/* Slices [begin, end) of OPS_ELEMENTWISE_SLICE floats of the job's dim: their first float
 * (*a) and count. */
static int slice_of(const struct pooled_job *j, int begin, int end, size_t *a) {
    *a = (size_t)begin * OPS_ELEMENTWISE_SLICE;
    size_t b = (size_t)end * OPS_ELEMENTWISE_SLICE;
    if (b > (size_t)j->dim) b = (size_t)j->dim;
    return (int)(b - *a);
}

static void swiglu_task(void *ctx, int begin, int end, int worker) {
    const struct pooled_job *j = ctx;
    (void)worker;
    size_t a;
    const int n = slice_of(j, begin, end, &a);
    swiglu(j->out + a, j->x + a, j->up + a, n);
}

static void vec_add_task(void *ctx, int begin, int end, int worker) {
    const struct pooled_job *j = ctx;
    (void)worker;
    size_t a;
    const int n = slice_of(j, begin, end, &a);
    vec_add(j->out + a, j->x + a, n);
}

void rmsnorm_pooled(float *out, const float *x, const float *weight, float eps, int n, int dim,
                    struct thread_pool *pool) {
    struct pooled_job j = {.out = out, .x = x, .w = weight, .eps = eps, .dim = dim};
    run_tasks(pool, rmsnorm_task, &j, n);
}

void rope_rows_pooled(float *x, const float *cos_t, const float *sin_t, int rows, int row_floats,
                      int heads, int head_dim, struct thread_pool *pool) {
    struct pooled_job j = {.out = x,
                           .cos_t = cos_t,
                           .sin_t = sin_t,
                           .row_floats = row_floats,
                           .heads = heads,
                           .head_dim = head_dim};
    run_tasks(pool, rope_task, &j, rows);
}

void qk_norm_rope_pooled(float *q, float *k, const float *q_norm, const float *k_norm, float eps,
                         const float *cos_t, const float *sin_t, int rows, int heads, int kv_heads,
                         int head_dim, struct thread_pool *pool) {
    rmsnorm_pooled(q, q, q_norm, eps, rows * heads, head_dim, pool);
    rmsnorm_pooled(k, k, k_norm, eps, rows * kv_heads, head_dim, pool);
    rope_rows_pooled(q, cos_t, sin_t, rows, heads * head_dim, heads, head_dim, pool);
    rope_rows_pooled(k, cos_t, sin_t, rows, kv_heads * head_dim, kv_heads, head_dim, pool);
}

void vec_add_pooled(float *x, const float *y, int n, struct thread_pool *pool) {
    struct pooled_job j = {.out = x, .x = y, .dim = n};
    run_tasks(pool, vec_add_task, &j, slices_of(&j));
}

void add_rmsnorm_pooled(float *out, float *h, const float *y, const float *weight, float eps, int n,
                        int dim, struct thread_pool *pool) {
    vec_add_pooled(h, y, n * dim, pool);
    rmsnorm_pooled(out, h, weight, eps, n, dim, pool);
}

void swiglu_pooled(float *out, const float *gate, const float *up, int n,
                   struct thread_pool *pool) {
    struct pooled_job j = {.out = out, .x = gate, .up = up, .dim = n};
    run_tasks(pool, swiglu_task, &j, slices_of(&j));
}
