/* The GPU's profile from the CUDA kernels (calibrate_cuda.h). Each figure is the best of
 * `rounds`, every round ended by synchronising the stream and timed on the host clock. */
#include "runtime/stage/calibrate_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "runtime/base/cli.h"
#include "runtime/base/op_contract.h"
#include "runtime/base/status.h"

enum { CC_ROWS = 4096, CC_BATCH = 64, CC_MAX_K = 8192 };

struct cal {
    void *stream;
    uint8_t *w;     /* weight_bytes of bf16 matrices (zeros: the time does not depend on them) */
    size_t w_bytes; /* a multiple of one CC_ROWS x CC_MAX_K matrix */
    float *x, *out; /* [CC_BATCH, CC_MAX_K], [CC_BATCH, CC_ROWS] */
    int rounds;
};

/* Seconds of one round of `distinct` x `repeats` matmuls of `rows` x x, cycling through the
 * buffer's first `distinct` CC_ROWS x K matrices (the working set), best of c->rounds (one
 * unmeasured round first). */
static int time_matmuls(double *best, struct cal *c, int K, int rows, int leaves, int distinct,
                        int repeats) {
    const size_t mat = (size_t)CC_ROWS * (size_t)K * 2;
    int rc = 0;
    *best = 1e30;
    for (int r = 0; r <= c->rounds && rc == 0; r++) {
        const double t0 = cli_now_sec();
        for (int i = 0; i < distinct * repeats && rc == 0; i++) {
            const struct ops_weight w = {c->w + (size_t)(i % distinct) * mat, OPS_BF16, CC_ROWS, K};
            rc = leaves > 1 ? cuda_matmul_split(c->out, c->x, &w, rows, leaves, c->stream)
                            : cuda_matmul(c->out, c->x, &w, rows, c->stream);
        }
        if (rc == 0) rc = cuda_stream_synchronize(c->stream);
        const double t = cli_now_sec() - t0;
        if (r > 0 && t < *best) *best = t;
    }
    return rc;
}

static int measure(struct perf_device *d, struct cal *c) {
    int rc = 0;
    /* Copy bandwidth: half the weight buffer onto the other half. */
    double best = 1e30;
    const size_t half = c->w_bytes / 2;
    for (int r = 0; r <= c->rounds && rc == 0; r++) {
        const double t0 = cli_now_sec();
        rc = cuda_memcpy_on_device(c->w + half, c->w, half); /* done when it returns */
        const double t = cli_now_sec() - t0;
        if (r > 0 && t < best) best = t;
    }
    if (rc) return rc;
    d->read_gbps = 2.0 * (double)half / best / 1e9;
    /* Decode: one row through matrices of CC_ROWS x 4096, over growing working sets. */
    const size_t mat = (size_t)CC_ROWS * 4096 * 2;
    int points = 0;
    for (size_t ws = mat; ws <= c->w_bytes && points < PERF_MAX_K_POINTS && rc == 0; ws *= 4) {
        const int distinct = (int)(ws / mat); /* each 4 times a round */
        if ((rc = time_matmuls(&best, c, 4096, 1, 1, distinct, 4)) == 0) {
            d->gemv_by_bytes.key[points] = (double)ws;
            d->gemv_by_bytes.value[points++] = 4.0 * distinct * (double)mat / best / 1e9;
        }
    }
    if (rc) return rc;
    d->gemv_by_bytes.n = points;
    d->gemv_gbps = d->gemv_by_bytes.value[points - 1]; /* the largest: past the L2 */
    /* Prefill: 64 rows by K, plain and split into 8 leaves (o_proj, down). */
    points = 0;
    for (int K = 1024; K <= CC_MAX_K && rc == 0; K *= 2) {
        const size_t kmat = (size_t)CC_ROWS * (size_t)K * 2;
        const int count = (int)(c->w_bytes / kmat < 8 ? c->w_bytes / kmat : 8);
        const double flops = 2.0 * CC_BATCH * (double)K * CC_ROWS * count;
        double plain, split;
        if ((rc = time_matmuls(&plain, c, K, CC_BATCH, 1, count, 1)) == 0 &&
            (rc = time_matmuls(&split, c, K, CC_BATCH, OPS_SPLIT_LEAVES, count, 1)) == 0) {
            d->gemm_by_k.key[points] = d->gemm_split_by_k.key[points] = K;
            d->gemm_by_k.value[points] = flops / plain / 1e9;
            d->gemm_split_by_k.value[points++] = flops / split / 1e9;
        }
    }
    d->gemm_by_k.n = d->gemm_split_by_k.n = points;
    for (int i = 0; i < points; i++)
        if (d->gemm_by_k.key[i] == 4096) d->gemm_gflops = d->gemm_by_k.value[i];
    return rc;
}

int stage_calibrate_cuda(struct perf_device *out, int device,
                         const struct stage_calibrate_cuda_options *opt) {
    struct cal c = {.rounds = opt && opt->rounds > 0 ? opt->rounds : 5};
    const size_t one = (size_t)CC_ROWS * CC_MAX_K * 2;
    size_t want = opt && opt->weight_bytes ? opt->weight_bytes : (size_t)512 << 20;
    size_t free_b = 0, total = 0;
    char desc[256];
    memset(out, 0, sizeof *out);
    int rc = cuda_set_device(device);
    if (rc == 0) rc = cuda_mem_info(&free_b, &total);
    if (rc == 0) rc = cuda_device_describe(device, desc, sizeof desc);
    if (rc) return rc;
    if (want > free_b / 2) want = free_b / 2;
    c.w_bytes = want / one * one;
    if (c.w_bytes < 2 * one)
        return strata_set_error(STRATA_ENOMEM, "cuda:%d: %zu bytes free, calibration needs %zu",
                                device, free_b, 4 * one);
    rc = cuda_stream_create(&c.stream);
    if (rc == 0) rc = cuda_malloc((void **)&c.w, c.w_bytes);
    if (rc == 0) rc = cuda_malloc((void **)&c.x, sizeof(float) * CC_BATCH * CC_MAX_K);
    if (rc == 0) rc = cuda_malloc((void **)&c.out, sizeof(float) * CC_BATCH * CC_ROWS);
    if (rc == 0) rc = cuda_memset(c.w, 0, c.w_bytes);
    if (rc == 0) rc = cuda_memset(c.x, 0, sizeof(float) * CC_BATCH * CC_MAX_K);
    if (rc == 0) rc = measure(out, &c);
    cuda_free(c.w);
    cuda_free(c.x);
    cuda_free(c.out);
    cuda_stream_destroy(c.stream);
    if (rc) return rc;
    /* "NVIDIA H200 (sm_90), 139.8 GiB, ...": the name before the compute capability */
    snprintf(out->name, sizeof out->name, "%.*s", (int)strcspn(desc, "("), desc);
    for (size_t n = strlen(out->name); n > 0 && out->name[n - 1] == ' '; n--)
        out->name[n - 1] = 0;
    snprintf(out->source, sizeof out->source, "measured");
    snprintf(out->device, sizeof out->device, "cuda");
    out->threads = 1;
    out->mem_bytes = total;
    return STRATA_OK;
}
