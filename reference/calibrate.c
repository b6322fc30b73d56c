/* Calibration of the CPU backend for the performance model (see calibrate.h). */
#include "reference/calibrate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "reference/tools/bandwidth.h"
#include "runtime/base/cli.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

enum { CAL_ROWS = 8192, CAL_COLS = 4096, CAL_BATCH = 64, CAL_MAX_K = 8192 };

/* "model name" of /proc/cpuinfo, or "cpu". */
static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v += 1 + (v[1] == ' ');
        snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    if (f) fclose(f);
}

/* x holds CAL_BATCH rows of up to CAL_MAX_K values (what they are does not change the time). */
static double best_of(int runs, float *out, const float *x, const struct ops_weight *w, int n,
                      struct thread_pool *pool) {
    double best = 1e30;
    matmul(out, x, w, n, pool); /* warm: pages, caches of the activations */
    for (int r = 0; r < runs; r++) {
        double t0 = cli_now_sec();
        matmul(out, x, w, n, pool);
        double t = cli_now_sec() - t0;
        if (t < best) best = t;
    }
    return best;
}

int reference_calibrate(struct perf_device *out, int threads) {
    memset(out, 0, sizeof *out);
    if (threads < 1 || threads > 1024)
        return strata_set_error(STRATA_EINVAL, "calibrate: %d threads", threads);
    struct thread_pool *pool = NULL;
    uint16_t *wdata = malloc((size_t)CAL_ROWS * CAL_COLS * sizeof *wdata);
    float *x = malloc((size_t)CAL_BATCH * CAL_MAX_K * sizeof *x);
    float *y = malloc((size_t)CAL_BATCH * CAL_ROWS * sizeof *y);
    int rc = wdata && x && y ? thread_pool_init(&pool, threads)
                             : strata_set_error(STRATA_ENOMEM, "calibrate: out of memory");
    if (rc == 0) {
        uint64_t s = 0x243F6A8885A308D3ull;
        for (size_t i = 0; i < (size_t)CAL_ROWS * CAL_COLS; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            wdata[i] = f32_to_bf16((float)((int)(s >> 41) - (1 << 22)) / (float)(1 << 26));
        }
        for (size_t i = 0; i < (size_t)CAL_BATCH * CAL_MAX_K; i++)
            x[i] = (float)((int)(i % 97) - 48) / 64.0f;
        struct ops_weight w = {wdata, OPS_BF16, CAL_ROWS, CAL_COLS};
        double gemv = best_of(7, y, x, &w, 1, pool);
        double gemm = best_of(3, y, x, &w, CAL_BATCH, pool);
        out->gemv_gbps = (double)CAL_ROWS * CAL_COLS * 2 / gemv / 1e9;
        out->gemm_gflops = 2.0 * CAL_BATCH * CAL_ROWS * CAL_COLS / gemm / 1e9;
        /* by K: 2048 rows of K columns over the same 64 rows */
        static const int ks[] = {1024, 2048, 4096, 8192};
        for (int i = 0; i < 4; i++) {
            struct ops_weight wk = {wdata, OPS_BF16, 2048, ks[i]};
            double t = best_of(3, y, x, &wk, CAL_BATCH, pool);
            out->k[out->n_k] = ks[i];
            out->k_gflops[out->n_k++] = 2.0 * CAL_BATCH * 2048 * ks[i] / t / 1e9;
        }
        out->read_gbps = host_read_bandwidth((size_t)256 << 20, threads) / 1e9;
        if (!(out->read_gbps > 0)) rc = strata_set_error(STRATA_ENOMEM, "calibrate: bandwidth");
    }
    if (rc == 0) {
        char name[48];
        cpu_name(name, sizeof name);
        snprintf(out->name, sizeof out->name, "%s, %d thread%s", name, threads,
                 threads > 1 ? "s" : "");
        snprintf(out->source, sizeof out->source, "measured");
        snprintf(out->device, sizeof out->device, "cpu");
        out->threads = threads;
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        out->mem_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    }
    thread_pool_free(pool);
    free(wdata);
    free(x);
    free(y);
    return rc;
}
