/* strata-bench-matmul: the CUDA matmul's tuning variants side by side on one GPU, for the
 * device run (tools/gpu_run.sh). Each variant is kernels/matmul.cu built again with other
 * STRATA_MATMUL_* knobs (BUILD.bazel: matmul_variants): the same arithmetic, so every variant
 * must give the default's bits, only another schedule of the loads or occupancy. Per shape
 * (the 8B and 0.6B decode projections, plain and split) and batch (1, 8): microseconds per
 * call from a CUDA graph of back-to-back calls (as a decode step runs them), the weight bytes
 * streamed per second, their share of the device's copy bandwidth, and whether the output
 * equals the default variant's bit for bit; then the matrices that share an input (q / k / v,
 * gate / up) as one cuda_matmul_multi launch against one launch each. Not a test: it judges nothing
 * but the bits (exit 1 when a variant differs). Usage: strata-bench-matmul [--quick]. Exit 77
 * without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "reference/ops.h"
#include "runtime/base/cli.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

#define PROG "strata-bench-matmul"

/* The variants (BUILD.bazel's MATMUL_VARIANTS, renamed by -D at their build). */
#define VARIANT(v)                                                                                 \
    int cuda_matmul_split_##v(float *out, const float *x, const struct ops_weight *w, int n,       \
                              int leaves, void *stream);
VARIANT(s4b4)
VARIANT(s8b2)
VARIANT(s8b3)
VARIANT(tile4)
VARIANT(cs)
VARIANT(r2)
VARIANT(r2s2)

typedef int (*split_fn)(float *, const float *, const struct ops_weight *, int, int, void *);

static const struct {
    const char *name, *about;
    split_fn fn;
} variants[] = {
    {"default", "16-byte loads, 4 chunks a round, >= 3 blocks / SM", cuda_matmul_split},
    {"s4b4", "4 chunks a round, >= 4 blocks / SM", cuda_matmul_split_s4b4},
    {"s8b2", "8 chunks a round, >= 2 blocks / SM", cuda_matmul_split_s8b2},
    {"s8b3", "8 chunks a round, >= 3 blocks / SM", cuda_matmul_split_s8b3},
    {"tile4", "one token on the 4-token tile's kernel (before the one-token kernel)",
     cuda_matmul_split_tile4},
    {"cs", "the default with evict-first weight loads (__ldcs)", cuda_matmul_split_cs},
    {"r2", "2 rows a half-warp (one load of x for both), 4 chunks, >= 3 blocks / SM",
     cuda_matmul_split_r2},
    {"r2s2", "2 rows a half-warp, 2 chunks a round, >= 3 blocks / SM", cuda_matmul_split_r2s2},
};
enum { N_VARIANTS = sizeof variants / sizeof variants[0], CALLS = 32 };

static const struct {
    const char *name;
    int rows, cols, leaves;
} shapes[] = {
    {"8B q_proj", 4096, 4096, 1},   {"8B k/v_proj", 1024, 4096, 1}, {"8B o_proj", 4096, 4096, 8},
    {"8B gate/up", 12288, 4096, 1}, {"8B down", 4096, 12288, 8},    {"8B lm_head", 151936, 4096, 1},
    {"0.6B q_proj", 2048, 1024, 1}, {"0.6B down", 1024, 3072, 8},
};

/* One call: a variant's matmul, or a group of matrices as one cuda_matmul_multi or as one
 * cuda_matmul each (multi < 0: the variant). */
struct call {
    split_fn fn;
    float *out;
    float *const *outs;
    const float *x;
    const struct ops_weight *w;
    const struct ops_weight *const *ws;
    int n, leaves, count, multi;
};

static int call_run(const struct call *c, void *stream) {
    int rc = 0;
    if (c->multi < 0) return c->fn(c->out, c->x, c->w, c->n, c->leaves, stream);
    if (c->multi) return cuda_matmul_multi(c->outs, c->ws, c->count, c->x, c->n, stream);
    for (int m = 0; !rc && m < c->count; ++m)
        rc = cuda_matmul(c->outs[m], c->x, c->ws[m], c->n, stream);
    return rc;
}

/* Seconds per call, from a graph of CALLS calls launched `launches` times. */
static int time_call(double *sec, const struct call *call, void *stream, int launches) {
    void *exec = NULL;
    int inst = 0, rc = cuda_graph_capture_begin(stream);
    for (int c = 0; !rc && c < CALLS; ++c)
        rc = call_run(call, stream);
    if (rc) cuda_graph_capture_abort(stream);
    if (!rc) rc = cuda_graph_capture_end(stream, &exec, &inst);
    if (!rc) rc = cuda_graph_launch(exec, stream); /* warm-up */
    if (!rc) rc = cuda_stream_synchronize(stream);
    double t0 = cli_now_sec();
    for (int l = 0; !rc && l < launches; ++l)
        rc = cuda_graph_launch(exec, stream);
    if (!rc) rc = cuda_stream_synchronize(stream);
    *sec = (cli_now_sec() - t0) / ((double)launches * CALLS);
    cuda_graph_exec_destroy(exec);
    return rc;
}

static int bench_shape(int s, int n, double bw, void *stream, int quick, int *differ) {
    const int rows = shapes[s].rows, cols = shapes[s].cols, leaves = shapes[s].leaves;
    const size_t wbytes = (size_t)rows * cols * 2;
    uint16_t *hw = malloc(wbytes);
    float *hx = malloc(sizeof(float) * (size_t)n * cols);
    float *want = malloc(sizeof(float) * (size_t)n * rows);
    float *got = malloc(sizeof(float) * (size_t)n * rows);
    void *dw = NULL;
    float *dx = NULL, *dout = NULL;
    int rc = hw && hx && want && got ? 0 : strata_set_error(STRATA_ENOMEM, "no host memory");
    for (size_t i = 0; !rc && i < (size_t)rows * cols; ++i)
        hw[i] = f32_to_bf16((float)((i * 2654435761u >> 8) % 2001u) / 1000.0f - 1.0f);
    for (size_t i = 0; !rc && i < (size_t)n * cols; ++i)
        hx[i] = (float)((i * 40503u >> 4) % 1001u) / 500.0f - 1.0f;
    if (!rc) rc = cuda_malloc(&dw, wbytes);
    if (!rc) rc = cuda_malloc((void **)&dx, sizeof(float) * (size_t)n * cols);
    if (!rc) rc = cuda_malloc((void **)&dout, sizeof(float) * (size_t)n * rows);
    if (!rc) rc = cuda_memcpy_to_device(dw, hw, wbytes);
    if (!rc) rc = cuda_memcpy_to_device(dx, hx, sizeof(float) * (size_t)n * cols);
    struct ops_weight w = {dw, OPS_BF16, rows, cols};
    /* Enough launches for ~8 GB streamed (2 ms at 4 TB/s), at least 3. */
    int launches = (int)(8e9 / ((double)wbytes * CALLS)) + 3;
    if (quick) launches = 2;
    for (int v = 0; !rc && v < N_VARIANTS; ++v) {
        double sec = 0;
        rc = variants[v].fn(dout, dx, &w, n, leaves, stream);
        if (!rc) rc = cuda_stream_synchronize(stream);
        if (!rc) rc = cuda_memcpy_to_host(v ? got : want, dout, sizeof(float) * (size_t)n * rows);
        int same = v == 0 || memcmp(got, want, sizeof(float) * (size_t)n * rows) == 0;
        *differ += !same;
        const struct call c = {variants[v].fn, dout, NULL, dx, &w, NULL, n, leaves, 1, -1};
        if (!rc) rc = time_call(&sec, &c, stream, launches);
        if (!rc)
            printf("%-12s %5d x %-6d %2d %3d  %-8s %9.2f %9.1f %6.1f%%  %s\n", shapes[s].name, rows,
                   cols, leaves, n, variants[v].name, sec * 1e6, (double)wbytes / sec / 1e9,
                   100.0 * (double)wbytes / sec / bw, same ? "yes" : "NO");
    }
    cuda_free(dw);
    cuda_free(dx);
    cuda_free(dout);
    free(hw);
    free(hx);
    free(want);
    free(got);
    return rc;
}

/* The matrices that share their input (q / k / v, gate / up) as one cuda_matmul_multi launch
 * against one cuda_matmul each, at n rows: us per group, GB/s, the outputs' bits equal. */
static const struct {
    const char *name;
    int count, rows[3], cols;
} groups[] = {{"8B q/k/v", 3, {4096, 1024, 1024}, 4096},
              {"8B gate/up", 2, {12288, 12288, 0}, 4096},
              {"0.6B q/k/v", 3, {2048, 1024, 1024}, 1024}};

static int bench_group(int g, int n, double bw, void *stream, int quick, int *differ) {
    const int count = groups[g].count, cols = groups[g].cols;
    float *dout[2][3] = {{0}}, *dx = NULL, *host[2] = {0};
    void *dw[3] = {0};
    struct ops_weight w[3];
    const struct ops_weight *ws[3] = {&w[0], &w[1], &w[2]};
    size_t wbytes = 0, outs = 0;
    int rc = cuda_malloc((void **)&dx, sizeof(float) * (size_t)n * cols);
    for (int m = 0; !rc && m < count; ++m) {
        const int rows = groups[g].rows[m];
        const size_t bytes = (size_t)rows * cols * 2;
        uint16_t *hw = malloc(bytes);
        rc = hw ? 0 : strata_set_error(STRATA_ENOMEM, "no host memory");
        for (size_t i = 0; !rc && i < (size_t)rows * cols; ++i)
            hw[i] =
                f32_to_bf16((float)(((i + 977u * m) * 2654435761u >> 8) % 2001u) / 1000.0f - 1.0f);
        if (!rc) rc = cuda_malloc(&dw[m], bytes);
        if (!rc) rc = cuda_memcpy_to_device(dw[m], hw, bytes);
        for (int k = 0; !rc && k < 2; ++k)
            rc = cuda_malloc((void **)&dout[k][m], sizeof(float) * (size_t)n * rows);
        free(hw);
        w[m] = (struct ops_weight){dw[m], OPS_BF16, rows, cols};
        wbytes += bytes;
        outs += (size_t)n * rows;
    }
    float *hx = malloc(sizeof(float) * (size_t)n * cols);
    host[0] = malloc(sizeof(float) * outs);
    host[1] = malloc(sizeof(float) * outs);
    if (!rc && !(hx && host[0] && host[1])) rc = strata_set_error(STRATA_ENOMEM, "no host memory");
    for (size_t i = 0; !rc && i < (size_t)n * cols; ++i)
        hx[i] = (float)((i * 40503u >> 4) % 1001u) / 500.0f - 1.0f;
    if (!rc) rc = cuda_memcpy_to_device(dx, hx, sizeof(float) * (size_t)n * cols);
    int launches = quick ? 2 : (int)(8e9 / ((double)wbytes * CALLS)) + 3;
    double sec[2] = {0, 0};
    for (int k = 0; !rc && k < 2; ++k) { /* 0: one call each, 1: multi */
        const struct call c = {NULL, NULL, dout[k], dx, NULL, ws, n, 1, count, k};
        rc = call_run(&c, stream);
        if (!rc) rc = cuda_stream_synchronize(stream);
        size_t at = 0;
        for (int m = 0; !rc && m < count; at += (size_t)n * w[m].rows, ++m)
            rc = cuda_memcpy_to_host(host[k] + at, dout[k][m],
                                     sizeof(float) * (size_t)n * w[m].rows);
        if (!rc) rc = time_call(&sec[k], &c, stream, launches);
    }
    const int same = !rc && memcmp(host[0], host[1], sizeof(float) * outs) == 0;
    *differ += !rc && !same;
    for (int k = 0; !rc && k < 2; ++k)
        printf("%-12s %-14d %3d  %-8s %9.2f %9.1f %6.1f%%  %s\n", groups[g].name, count, n,
               k ? "multi" : "separate", sec[k] * 1e6, (double)wbytes / sec[k] / 1e9,
               100.0 * (double)wbytes / sec[k] / bw, k ? (same ? "yes" : "NO") : "-");
    for (int m = 0; m < count; ++m) {
        cuda_free(dw[m]);
        cuda_free(dout[0][m]);
        cuda_free(dout[1][m]);
    }
    cuda_free(dx);
    free(hx);
    free(host[0]);
    free(host[1]);
    return rc;
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: " PROG " [--quick]\n\nThe CUDA matmul's tuning variants (kernels/"
                   "matmul.cu's STRATA_MATMUL_* knobs)\nside by side: us per call, GB/s, share of "
                   "the copy bandwidth, bits equal to the default's.\n  --quick  2 launches a "
                   "shape (a smoke run)\nExit codes: 0 ok, 1 failure or a variant's bits differ, "
                   "2 usage, 77 no GPU.\n");
            return 0;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (--help)\n", argv[i]);
            return 2;
        }
    }
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        printf("skipped: %s\n", reason);
        return 77;
    }
    void *stream = NULL;
    double bw = 0;
    int differ = 0, rc = cuda_stream_create(&stream);
    if (!rc) rc = cuda_copy_bandwidth(&bw, (size_t)1 << 30, 5);
    if (!rc)
        printf("%s; device copy %.1f GB/s (read + write); %d calls a graph\n", reason, bw / 1e9,
               CALLS);
    for (int v = 0; !rc && v < N_VARIANTS; ++v)
        printf("  %-8s %s\n", variants[v].name, variants[v].about);
    if (!rc)
        printf("%-12s %-14s %2s %3s  %-8s %9s %9s %7s  %s\n", "shape", "rows x cols", "L", "n",
               "variant", "us/call", "GB/s", "of copy", "bits = default");
    for (size_t s = 0; !rc && s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int n = 1; !rc && n <= 8; n += 7)
            rc = bench_shape((int)s, n, bw, stream, quick, &differ);
    if (!rc)
        printf("\n%-12s %-14s %3s  %-8s %9s %9s %7s  %s\n", "group", "matrices", "n", "launches",
               "us/group", "GB/s", "of copy", "bits = separate");
    for (size_t g = 0; !rc && g < sizeof groups / sizeof groups[0]; ++g)
        for (int n = 1; !rc && n <= 8; n += 7)
            rc = bench_group((int)g, n, bw, stream, quick, &differ);
    cuda_stream_destroy(stream);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return 1;
    }
    if (differ)
        fprintf(stderr, PROG ": %d variant run(s) gave other bits than the default\n", differ);
    return differ ? 1 : 0;
}
