/* The CUDA backend's device MoE path (runtime/stage/backend_cuda_moe.c) kernel by kernel
 * against the reference: cuda_moe_route_rows against moe_route row by row (ids equal,
 * weights within CUDA expf's ulps), cuda_moe_group against the reference's moe_group
 * (exact), cuda_matmul_grouped against matmul / matmul_split per expert (bitwise),
 * cuda_moe_expert_sum against the reference's moe_expert_sum (bitwise); then
 * the chain captured once in a CUDA graph and launched again on new router logits without
 * a new capture, equal to an eager run on them (the experts' row counts are device data).
 * A TP rank's node of experts too. Prints "skipped: <reason>" without a device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/moe_group.h"
#include "kernels/moe_route.h"
#include "kernels/ops_weight_row.h"
#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

struct shape {
    int n, E, K, H, I, lo, hi, renorm;
};

static float value(unsigned i) {
    i = i * 2654435761u + 12345u;
    return (float)((i >> 8) % 2001u) / 1000.0f - 1.0f;
}

/* Device buffers of one shape. */
struct dev {
    float *logits, *w, *x, *gx, *g, *y, *out;
    int *ex;
    int32_t *off, *rows, *pos;
    uint16_t *gate, *down;
    const void **gptrs, **dptrs;
};

static int alloc_all(struct dev *d, const struct shape *s) {
    const size_t n = (size_t)s->n, cap = n * (size_t)s->K, E = (size_t)s->E;
    const size_t H = (size_t)s->H, I = (size_t)s->I;
    struct {
        void **p;
        size_t bytes;
    } a[] = {{(void **)&d->logits, n * E * 4},
             {(void **)&d->w, cap * 4},
             {(void **)&d->x, n * H * 4},
             {(void **)&d->gx, cap * H * 4},
             {(void **)&d->g, cap * I * 4},
             {(void **)&d->y, cap * H * 4},
             {(void **)&d->out, n * H * 4},
             {(void **)&d->ex, cap * 4},
             {(void **)&d->off, (E + 1) * 4},
             {(void **)&d->rows, cap * 4},
             {(void **)&d->pos, cap * 4},
             {(void **)&d->gate, E * I * H * 2},
             {(void **)&d->down, E * H * I * 2},
             {(void **)&d->gptrs, E * sizeof(void *)},
             {(void **)&d->dptrs, E * sizeof(void *)}};
    int rc = 0;
    for (size_t i = 0; i < sizeof a / sizeof a[0] && !rc; ++i)
        rc = cuda_malloc(a[i].p, a[i].bytes);
    return rc;
}

static void free_all(struct dev *d) {
    void *p[] = {d->logits, d->w,    d->x,   d->gx,   d->g,    d->y,     d->out,  d->ex,
                 d->off,    d->rows, d->pos, d->gate, d->down, d->gptrs, d->dptrs};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i)
        cuda_free(p[i]);
}

/* route -> group -> gather -> grouped gate (1 leaf) -> grouped down (8 leaves) -> sum, as
 * backend_cuda_moe.c queues it (up and SwiGLU left out: elementwise). */
static int run_chain(const struct dev *d, const struct shape *s, void *stream) {
    const int cap = s->n * s->K;
    const struct ops_weight xs = {d->x, OPS_F32, s->n, s->H};
    const struct ops_weight gw = {NULL, OPS_BF16, s->I, s->H}, dw = {NULL, OPS_BF16, s->H, s->I};
    int rc;
    if ((rc = cuda_moe_route_rows(d->ex, d->w, d->logits, s->renorm, s->E, s->K, s->n, stream)) ||
        (rc = cuda_moe_group(d->off, d->rows, d->pos, d->ex, s->n, s->K, s->E, s->lo, s->hi,
                             stream)) ||
        (rc = cuda_ops_weight_rows(d->gx, &xs, d->rows, cap, stream)) ||
        (rc = cuda_matmul_grouped(d->g, d->gx, &gw, d->gptrs, d->off, s->E, cap, 1, stream)) ||
        (rc = cuda_matmul_grouped(d->y, d->g, &dw, d->dptrs, d->off, s->E, cap, OPS_SPLIT_LEAVES,
                                  stream)))
        return rc;
    return cuda_moe_expert_sum(d->out, d->y, d->pos, d->ex, d->w, s->n, s->K, s->lo, s->hi, s->H,
                               stream);
}

/* Host arrays of one shape's check. */
struct host {
    float *logits, *x, *w, *dw, *gx, *g, *dg, *y, *dy, *slots, *out, *dout;
    int *ex, *dex;
    int32_t *off, *rows, *pos, *doff, *drows, *dpos;
    uint16_t *gate, *down;
};

/* The reference's routing, grouping, expert matmuls and sum on the device's routing (so
 * CUDA's expf cannot move an id), each compared with the device's. Failures counted. */
static int check_against_reference(const struct host *h, const struct shape *s,
                                   struct thread_pool *pool) {
    const int n = s->n, K = s->K, E = s->E, H = s->H, I = s->I, cap = n * K;
    int bad_ids = 0, bad_w = 0, at = 0;
    for (int i = 0; i < n; ++i) {
        moe_route(h->ex + i * K, h->w + i * K, h->logits + (size_t)i * E, s->renorm, E, K);
        for (int t = 0; t < K; ++t) {
            const float a = h->w[i * K + t], b = h->dw[i * K + t];
            bad_ids += h->ex[i * K + t] != h->dex[i * K + t];
            bad_w += fabsf(a - b) > 1e-6f * fabsf(a);
        }
    }
    moe_group(h->off, h->rows, h->pos, h->dex, n, K, E, s->lo, s->hi);
    at = h->off[E];
    const int bad_group = memcmp(h->off, h->doff, sizeof(int32_t) * (size_t)(E + 1)) ||
                          memcmp(h->rows, h->drows, sizeof(int32_t) * (size_t)cap) ||
                          memcmp(h->pos, h->dpos, sizeof(int32_t) * (size_t)cap);
    const struct ops_weight xs = {h->x, OPS_F32, n, H};
    ops_weight_rows(h->gx, &xs, h->rows, at);
    for (int e = s->lo; e < s->hi; ++e) {
        const int c = h->off[e + 1] - h->off[e], o = h->off[e];
        const struct ops_weight gw = {h->gate + (size_t)e * I * H, OPS_BF16, I, H};
        const struct ops_weight dw = {h->down + (size_t)e * H * I, OPS_BF16, H, I};
        if (!c) continue;
        matmul(h->g + (size_t)o * I, h->gx + (size_t)o * H, &gw, c, pool);
        matmul_split(h->y + (size_t)o * H, h->g + (size_t)o * I, &dw, c, OPS_SPLIT_LEAVES, pool);
    }
    const int bad_gate = memcmp(h->g, h->dg, sizeof(float) * (size_t)at * I) != 0;
    const int bad_down = memcmp(h->y, h->dy, sizeof(float) * (size_t)at * H) != 0;
    /* The reference's weighting and sum on the device's outputs and weights (its scratch
     * a copy of them). */
    memcpy(h->slots, h->dy, sizeof(float) * (size_t)at * H);
    moe_expert_sum(h->out, h->slots, h->dpos, h->dex, h->dw, n, K, s->lo, s->hi, H);
    const int bad_sum = memcmp(h->out, h->dout, sizeof(float) * (size_t)n * H) != 0;
    printf("%s n=%d E=%d K=%d H=%d I=%d experts [%d, %d): ids %s, weights %s, grouping %s, "
           "gate %s, down %s, sum %s\n",
           bad_ids || bad_w || bad_group || bad_gate || bad_down || bad_sum ? "FAIL" : "ok  ", n, E,
           K, H, I, s->lo, s->hi, bad_ids ? "DIFFER" : "equal", bad_w ? "OFF" : "within 1e-6",
           bad_group ? "DIFFERS" : "exact", bad_gate ? "DIFFERS" : "bitwise",
           bad_down ? "DIFFERS" : "bitwise", bad_sum ? "DIFFERS" : "bitwise");
    return (bad_ids > 0) + (bad_w > 0) + bad_group + bad_gate + bad_down + bad_sum;
}

/* Downloads the device's results into h->d*. */
static int download(struct host *h, const struct dev *d, const struct shape *s) {
    const size_t n = (size_t)s->n, cap = n * (size_t)s->K;
    int rc;
    if ((rc = cuda_memcpy_to_host(h->dex, d->ex, cap * 4)) ||
        (rc = cuda_memcpy_to_host(h->dw, d->w, cap * 4)) ||
        (rc = cuda_memcpy_to_host(h->doff, d->off, ((size_t)s->E + 1) * 4)) ||
        (rc = cuda_memcpy_to_host(h->drows, d->rows, cap * 4)) ||
        (rc = cuda_memcpy_to_host(h->dpos, d->pos, cap * 4)) ||
        (rc = cuda_memcpy_to_host(h->dg, d->g, cap * (size_t)s->I * 4)) ||
        (rc = cuda_memcpy_to_host(h->dy, d->y, cap * (size_t)s->H * 4)))
        return rc;
    return cuda_memcpy_to_host(h->dout, d->out, n * (size_t)s->H * 4);
}

/* Captures the chain once, launches it on the same logits (must equal the eager result
 * `eager`) and on new logits (must equal an eager run on them). Failures counted. */
static int check_graph(const struct dev *d, const struct shape *s, struct host *h,
                       const float *eager) {
    const size_t out_bytes = sizeof(float) * (size_t)s->n * s->H;
    void *stream = NULL, *exec = NULL;
    int inst = 0, same = 0, moved = 0, rc = cuda_stream_create(&stream);
    float *first = malloc(out_bytes), *replay = malloc(out_bytes);
    if (!rc && (!first || !replay)) rc = STRATA_ENOMEM;
    if (!rc && !(rc = cuda_graph_capture_begin(stream))) {
        if ((rc = run_chain(d, s, stream)))
            cuda_graph_capture_abort(stream);
        else
            rc = cuda_graph_capture_end(stream, &exec, &inst);
    }
    if (!rc && !(rc = cuda_graph_launch(exec, stream)) && !(rc = cuda_stream_synchronize(stream)))
        rc = cuda_memcpy_to_host(first, d->out, out_bytes);
    same = !rc && !memcmp(first, eager, out_bytes);
    for (size_t i = 0; i < (size_t)s->n * s->E; ++i) /* new routing */
        h->logits[i] = 4.0f * value((unsigned)i + 99991u);
    if (!rc) rc = cuda_memcpy_to_device(d->logits, h->logits, sizeof(float) * s->n * s->E);
    if (!rc && !(rc = cuda_graph_launch(exec, stream)) && !(rc = cuda_stream_synchronize(stream)))
        rc = cuda_memcpy_to_host(replay, d->out, out_bytes);
    if (!rc && !(rc = run_chain(d, s, stream)) && !(rc = cuda_stream_synchronize(stream)))
        rc = cuda_memcpy_to_host(first, d->out, out_bytes);
    moved = !rc && !memcmp(first, replay, out_bytes);
    if (rc)
        printf("FAIL graph n=%d E=%d: %s\n", s->n, s->E, strata_last_error());
    else
        printf("%s graph n=%d E=%d: first launch %s the eager run, relaunch on new logits %s "
               "an eager run on them\n",
               same && moved ? "ok  " : "FAIL", s->n, s->E, same ? "equals" : "DIFFERS FROM",
               moved ? "equals" : "DIFFERS FROM");
    cuda_graph_exec_destroy(exec);
    cuda_stream_destroy(stream);
    free(first);
    free(replay);
    return rc ? 1 : !same + !moved;
}

/* One shape: inputs, the eager chain, the reference checks, the graph. */
static int check_shape(const struct shape *s, struct thread_pool *pool) {
    const size_t n = (size_t)s->n, cap = n * (size_t)s->K, E = (size_t)s->E;
    const size_t H = (size_t)s->H, I = (size_t)s->I;
    struct host h = {0};
    struct dev d = {0};
    void *fp[] = {
        h.logits = malloc(n * E * 4),  h.x = malloc(n * H * 4),    h.w = malloc(cap * 4),
        h.dw = malloc(cap * 4),        h.gx = malloc(cap * H * 4), h.g = malloc(cap * I * 4),
        h.dg = malloc(cap * I * 4),    h.y = malloc(cap * H * 4),  h.dy = malloc(cap * H * 4),
        h.slots = malloc(cap * H * 4), h.out = malloc(n * H * 4),  h.dout = malloc(n * H * 4),
        h.ex = malloc(cap * 4),        h.dex = malloc(cap * 4),    h.off = malloc((E + 1) * 4),
        h.rows = malloc(cap * 4),      h.pos = malloc(cap * 4),    h.doff = malloc((E + 1) * 4),
        h.drows = malloc(cap * 4),     h.dpos = malloc(cap * 4),   h.gate = malloc(E * I * H * 2),
        h.down = malloc(E * H * I * 2)};
    const void **gp = calloc(E, sizeof *gp), **dp = calloc(E, sizeof *dp);
    int rc = gp && dp ? 0 : STRATA_ENOMEM, failures = 0;
    for (size_t i = 0; i < sizeof fp / sizeof fp[0]; ++i)
        if (!fp[i]) rc = STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < n * E; ++i)
        h.logits[i] = 4.0f * value((unsigned)i);
    for (size_t i = 0; !rc && i < n * H; ++i)
        h.x[i] = value((unsigned)i + 31337u);
    for (size_t i = 0; !rc && i < E * I * H; ++i) {
        h.gate[i] = f32_to_bf16(value((unsigned)i + 7u));
        h.down[i] = f32_to_bf16(value((unsigned)i + 77777u));
    }
    if (!rc) rc = alloc_all(&d, s);
    for (int e = s->lo; !rc && e < s->hi; ++e) { /* NULL: another rank's expert */
        gp[e] = d.gate + (size_t)e * I * H;
        dp[e] = d.down + (size_t)e * H * I;
    }
    if (!rc) rc = cuda_memcpy_to_device(d.logits, h.logits, n * E * 4);
    if (!rc) rc = cuda_memcpy_to_device(d.x, h.x, n * H * 4);
    if (!rc) rc = cuda_memcpy_to_device(d.gate, h.gate, E * I * H * 2);
    if (!rc) rc = cuda_memcpy_to_device(d.down, h.down, E * H * I * 2);
    if (!rc) rc = cuda_memcpy_to_device(d.gptrs, gp, E * sizeof(void *));
    if (!rc) rc = cuda_memcpy_to_device(d.dptrs, dp, E * sizeof(void *));
    if (!rc) rc = run_chain(&d, s, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = download(&h, &d, s);
    if (rc) {
        printf("FAIL n=%d E=%d K=%d: %s\n", s->n, s->E, s->K, strata_last_error());
        failures = 1;
    } else {
        failures += check_against_reference(&h, s, pool);
        failures += check_graph(&d, s, &h, h.dout);
    }
    free_all(&d);
    for (size_t i = 0; i < sizeof fp / sizeof fp[0]; ++i)
        free(fp[i]);
    free(gp);
    free(dp);
    return failures;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    struct thread_pool *pool = NULL;
    if (thread_pool_init(&pool, 2)) {
        printf("FAIL: %s\n", strata_last_error());
        return 1;
    }
    /* n, E, K, H, I, experts [lo, hi), renormalise: a decode row, odd widths with a K % 16
     * tail, 128 experts top-8, a TP rank's node (experts [4, 8) of 8), many rows per expert. */
    const struct shape shapes[] = {
        {1, 8, 2, 64, 32, 0, 8, 1},       {7, 6, 3, 40, 24, 0, 6, 0},
        {33, 128, 8, 128, 48, 0, 128, 1}, {20, 8, 2, 64, 32, 4, 8, 1},
        {300, 16, 4, 96, 80, 0, 16, 1},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
        failures += check_shape(&shapes[i], pool);
    const struct ops_weight w = {NULL, OPS_BF16, 4, 4};
    failures += cuda_matmul_grouped(NULL, NULL, &w, NULL, NULL, 0, 4, 1, NULL) != STRATA_EINVAL;
    failures += cuda_moe_group(NULL, NULL, NULL, NULL, 1, 2, 8, 4, 2, NULL) != STRATA_EINVAL;
    failures +=
        cuda_moe_expert_sum(NULL, NULL, NULL, NULL, NULL, 1, 65, 0, 8, 4, NULL) != STRATA_EINVAL;
    thread_pool_free(pool);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
