/* strata-bench-matmul: the CUDA matmul's tuning variants side by side on one GPU, for the
 * device run (tools/gpu_run.sh). Each variant is kernels/matmul.cu built again with other
 * STRATA_MATMUL_* knobs (BUILD.bazel: matmul_variants): the same arithmetic, so every variant
 * must give the default's bits, only another schedule of the loads or occupancy. Per shape
 * (the 8B and 0.6B decode projections, plain and split) and batch (1, 8): microseconds per
 * call from a CUDA graph of back-to-back calls (as a decode step runs them), the weight bytes
 * streamed per second, their share of the device's copy bandwidth, and whether the output
 * equals the default variant's bit for bit. Not a test: it judges nothing but the bits (exit
 * 1 when a variant differs). Usage: strata-bench-matmul [--quick]. Exit 77 without a GPU. */
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
VARIANT(narrow)
VARIANT(s2b3)
VARIANT(s4b2)
VARIANT(s4b4)
VARIANT(s8b2)
VARIANT(s8b3)

typedef int (*split_fn)(float *, const float *, const struct ops_weight *, int, int, void *);

static const struct {
    const char *name, *about;
    split_fn fn;
} variants[] = {
    {"default", "16-byte loads, 4 chunks a round, >= 3 blocks / SM", cuda_matmul_split},
    {"narrow", "2-byte loads (the first GPU run's loads)", cuda_matmul_split_narrow},
    {"s2b3", "2 chunks a round, >= 3 blocks / SM", cuda_matmul_split_s2b3},
    {"s4b2", "4 chunks a round, >= 2 blocks / SM", cuda_matmul_split_s4b2},
    {"s4b4", "4 chunks a round, >= 4 blocks / SM", cuda_matmul_split_s4b4},
    {"s8b2", "8 chunks a round, >= 2 blocks / SM", cuda_matmul_split_s8b2},
    {"s8b3", "8 chunks a round, >= 3 blocks / SM", cuda_matmul_split_s8b3},
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

/* Seconds per call of fn, from a graph of CALLS calls launched `launches` times. */
static int time_variant(double *sec, split_fn fn, float *out, const float *x,
                        const struct ops_weight *w, int n, int leaves, void *stream, int launches) {
    void *exec = NULL;
    int inst = 0, rc = cuda_graph_capture_begin(stream);
    for (int c = 0; !rc && c < CALLS; ++c)
        rc = fn(out, x, w, n, leaves, stream);
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
        if (!rc) rc = time_variant(&sec, variants[v].fn, dout, dx, &w, n, leaves, stream, launches);
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
    cuda_stream_destroy(stream);
    if (rc) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return 1;
    }
    if (differ)
        fprintf(stderr, PROG ": %d variant run(s) gave other bits than the default\n", differ);
    return differ ? 1 : 0;
}
