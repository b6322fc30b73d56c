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
#include "reference/weight_arena.h"
#include "runtime/base/cli.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

enum { CAL_ROWS = 8192, CAL_COLS = 4096, CAL_BATCH = 64, CAL_MAX_K = 8192 };

/* Weights and KV measured where a stage keeps them: a huge-page-advised arena (weight_arena.h;
 * the KV cache is advised likewise). From malloc'ed 4 KiB pages one thread streamed an 8192 x
 * 4096 one-row matmul at 4.5-4.8 GB/s against 5.1 in huge pages (a Xeon test host), and on a
 * 16-core Xeon every stage decoded 2-16% faster than its malloc-measured profile predicted. */
static void *arena_buffer(struct weight_arena *a, size_t bytes) {
    return weight_arena_init(a, weight_arena_round(bytes)) ? NULL : weight_arena_alloc(a, bytes);
}

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
static double best_of_split(int runs, float *out, const float *x, const struct ops_weight *w, int n,
                            int leaves, struct thread_pool *pool) {
    double best = 1e30;
    matmul_split(out, x, w, n, leaves, pool); /* warm: pages, caches of the activations */
    for (int r = 0; r < runs; r++) {
        double t0 = cli_now_sec();
        matmul_split(out, x, w, n, leaves, pool);
        double t = cli_now_sec() - t0;
        if (t < best) best = t;
    }
    return best;
}

static double best_of(int runs, float *out, const float *x, const struct ops_weight *w, int n,
                      struct thread_pool *pool) {
    return best_of_split(runs, out, x, w, n, 1, pool);
}

/* The time of one rows x K matmul (split into `leaves`) as a stage's forward meets it: every
 * matrix of the stage is read between two uses of one, so each comes from beyond the caches
 * closest to the cores. The distinct rows x K matrices that the weight buffer [CAL_ROWS *
 * CAL_COLS] holds are taken in turn (64 MiB); the best of `runs` rounds, per matrix. Timing
 * one small matrix again and again measured it hot: 2048 x 1024, 64 tokens, 1 thread, 118
 * GFLOP/s against 105 cycled over 64 MiB or more, which a model of a real stage then missed. */
static double best_of_cycled(int runs, float *out, const float *x, const uint16_t *wdata, int rows,
                             int k, int n, int leaves, struct thread_pool *pool) {
    const size_t each = (size_t)rows * (size_t)k;
    const int count = (int)((size_t)CAL_ROWS * CAL_COLS / each);
    double best = 1e30;
    for (int r = 0; r <= runs; r++) { /* round 0 warms: pages, the activations */
        double t0 = cli_now_sec();
        for (int m = 0; m < count; m++) {
            const struct ops_weight w = {wdata + (size_t)m * each, OPS_BF16, rows, k};
            matmul_split(out, x, &w, n, leaves, pool);
        }
        double t = (cli_now_sec() - t0) / count;
        if (r && t < best) best = t;
    }
    return best;
}

/* G elements per second (out and gate: CAL_BATCH x CAL_MAX_K floats of scratch). */
static double calibrate_swiglu(float *out, const float *gate, struct thread_pool *pool) {
    const int n = CAL_BATCH * 4096 / 2;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = cli_now_sec();
        swiglu_pooled(out, gate, gate + n, n, pool);
        double t = cli_now_sec() - t0;
        if (r && t < best) best = t;
    }
    return (double)n / best / 1e9;
}

/* Attention as a stage runs it over an f16 cache (16 query heads, 8 KV heads, head_dim 128):
 * 64 query rows after 448 cached positions (a prefill chunk: its GFLOP/s), and one row over
 * 4096 positions (a decode step: the cache bytes it streams per second); then the row ops
 * around it over the same cache. */
enum { ATT_NH = 16, ATT_NKV = 8, ATT_D = 128, ATT_SEQ = 4096 };

/* A layer's row ops beyond its matmuls, attention and SwiGLU, as forward_layer runs them on
 * 64 rows of the attention figures' shape (H = 16 x 128): the input RMSNorm, the per-head q
 * and k norms, RoPE on q and k, the KV store into kv (an f16 cache), the residual add, the
 * post-attention RMSNorm, the second residual add. G elements per second, elements being
 * PERF_ROW_OPS_ELEMS(H, 16, 8, 128) per row (perf_model.h): by perf, 3% of a 128-token prefill
 * of an H 1024 x 8 layer model on one Xeon thread, which first tokens were short by. */
static int row_ops_gelems(double *gelems, const struct ops_kv *kv, int pos,
                          struct thread_pool *pool) {
    enum { N = 64, H = ATT_NH * ATT_D, QD = ATT_NH * ATT_D, KD = ATT_NKV * ATT_D };
    float *buf = malloc(((size_t)N * (3 * H + QD + 2 * KD + ATT_D) + H + 2 * ATT_D) * sizeof *buf);
    if (!buf) return strata_set_error(STRATA_ENOMEM, "calibrate: out of memory for row ops");
    float *hidden = buf, *norm = hidden + N * H, *proj = norm + N * H, *q = proj + N * H,
          *k = q + N * QD, *v = k + N * KD, *cos_t = v + N * KD, *sin_t = cos_t + N * ATT_D / 2,
          *w = sin_t + N * ATT_D / 2, *qk_w = w + H;
    for (size_t i = 0; i < (size_t)N * (3 * H + QD + 2 * KD); i++)
        buf[i] = (float)((int)(i % 29) - 14) / 16.0f;
    for (int i = 0; i < N * ATT_D / 2; i++) {
        cos_t[i] = (float)((i % 7) - 3) / 4.0f;
        sin_t[i] = (float)((i % 5) - 2) / 4.0f;
    }
    for (int i = 0; i < H + 2 * ATT_D; i++)
        w[i] = 1.0f + (float)(i % 3) / 8.0f;
    double best = 1e30;
    for (int r = 0; r < 9; r++) { /* round 0 warms */
        double t0 = cli_now_sec();
        rmsnorm_pooled(norm, hidden, w, 1e-6f, N, H, pool);
        rmsnorm_pooled(q, q, qk_w, 1e-6f, N * ATT_NH, ATT_D, pool);
        rmsnorm_pooled(k, k, qk_w + ATT_D, 1e-6f, N * ATT_NKV, ATT_D, pool);
        rope_rows_pooled(q, cos_t, sin_t, N, QD, ATT_NH, ATT_D, pool);
        rope_rows_pooled(k, cos_t, sin_t, N, KD, ATT_NKV, ATT_D, pool);
        kv_store(kv, k, v, KD, pos, N, ATT_NKV, ATT_D);
        vec_add_pooled(hidden, proj, N * H, pool);
        rmsnorm_pooled(norm, hidden, w, 1e-6f, N, H, pool);
        vec_add_pooled(hidden, proj, N * H, pool);
        double t = cli_now_sec() - t0;
        if (r && t < best) best = t;
    }
    *gelems = (double)N * PERF_ROW_OPS_ELEMS(H, ATT_NH, ATT_NKV, ATT_D) / best / 1e9;
    free(buf);
    return 0;
}

static int calibrate_attention(struct perf_device *out, struct thread_pool *pool, int threads) {
    const size_t elems = (size_t)ATT_NKV * ATT_SEQ * ATT_D;
    struct weight_arena ka, va;
    uint16_t *k = arena_buffer(&ka, elems * 2), *v = arena_buffer(&va, elems * 2);
    int32_t *blocks = malloc(ATT_SEQ / OPS_ATTN_BLOCK * sizeof *blocks);
    float *q = malloc((size_t)64 * ATT_NH * ATT_D * sizeof *q);
    float *o = malloc((size_t)64 * ATT_NH * ATT_D * sizeof *o);
    size_t scratch_n = attention_scratch_floats(ATT_SEQ, ATT_NH, ATT_NKV, ATT_D) * (size_t)threads;
    float *scratch = malloc(scratch_n * sizeof *scratch);
    int rc = k && v && blocks && q && o && scratch
                 ? 0
                 : strata_set_error(STRATA_ENOMEM, "calibrate: out of memory for attention");
    if (rc == 0) {
        for (size_t i = 0; i < elems; i++)
            k[i] = v[i] = f32_to_f16((float)((int)(i % 61) - 30) / 32.0f);
        for (int b = 0; b < ATT_SEQ / OPS_ATTN_BLOCK; b++)
            blocks[b] = b;
        for (size_t i = 0; i < (size_t)64 * ATT_NH * ATT_D; i++)
            q[i] = (float)((int)(i % 53) - 26) / 64.0f;
        struct ops_kv kv = {
            k, v, blocks, (size_t)OPS_ATTN_BLOCK * ATT_D, (size_t)ATT_SEQ * ATT_D, OPS_F16};
        double best_p = 1e30, best_d = 1e30;
        for (int r = 0; r < 4; r++) {
            double t0 = cli_now_sec();
            attention(o, q, &kv, scratch, 448, 64, ATT_NH, ATT_NKV, ATT_D, pool);
            double t1 = cli_now_sec();
            attention(o, q, &kv, scratch, ATT_SEQ - 1, 1, ATT_NH, ATT_NKV, ATT_D, pool);
            double t2 = cli_now_sec();
            if (r && t1 - t0 < best_p) best_p = t1 - t0; /* the first call warms */
            if (r && t2 - t1 < best_d) best_d = t2 - t1;
        }
        out->attn_gflops = 2.0 * 2 * 64 * (448 + 32.5) * ATT_NH * ATT_D / best_p / 1e9;
        out->attn_gbps = 2.0 * ATT_NKV * ATT_SEQ * ATT_D * 2 / best_d / 1e9;
        /* The prefill rate by the rows' average context: a chunk of 64 rows after 0, 448 and
         * 1984 positions (a short context pays the blocks' widening and tree more per pair) */
        static const int before[] = {0, 448, 1984};
        for (int i = 0; i < 3; i++) {
            double best = 1e30;
            for (int r = 0; r < 4; r++) {
                double t0 = cli_now_sec();
                attention(o, q, &kv, scratch, before[i], 64, ATT_NH, ATT_NKV, ATT_D, pool);
                double t = cli_now_sec() - t0;
                if (r && t < best) best = t;
            }
            struct perf_points *p = &out->attn_by_ctx;
            p->key[p->n] = before[i] + 32; /* the average row's context: c + (64 + 1) / 2 */
            p->value[p->n++] = 2.0 * 2 * 64 * (before[i] + 32.5) * ATT_NH * ATT_D / best / 1e9;
        }
        rc = row_ops_gelems(&out->row_ops_gelems, &kv, 448, pool);
    }
    weight_arena_free(&ka);
    weight_arena_free(&va);
    free(blocks);
    free(q);
    free(o);
    free(scratch);
    return rc;
}

/* The streaming rate of a one-row matmul by the weights' size, each hot from the call before
 * (a stage reads the same weights every step): 4 MiB .. 512 MiB. */
static int calibrate_gemv_sizes(struct perf_device *out, struct thread_pool *pool) {
    static const int mib[] = {4, 32, 128, 512};
    const size_t big = (size_t)512 << 20;
    struct weight_arena wa;
    uint16_t *w = arena_buffer(&wa, big);
    float *x = malloc(CAL_COLS * sizeof *x), *y = malloc((big / 2 / CAL_COLS) * sizeof *y);
    int rc = w && x && y ? 0 : strata_set_error(STRATA_ENOMEM, "calibrate: out of memory");
    if (rc == 0) {
        for (size_t i = 0; i < big / 2; i++)
            w[i] = f32_to_bf16((float)((int)(i % 89) - 44) / 256.0f);
        for (int i = 0; i < CAL_COLS; i++)
            x[i] = (float)((i % 13) - 6) / 8.0f;
        for (int i = 0; i < 4; i++) {
            int rows = (int)(((size_t)mib[i] << 20) / 2 / CAL_COLS);
            struct ops_weight wk = {w, OPS_BF16, rows, CAL_COLS};
            double t = best_of(5, y, x, &wk, 1, pool);
            struct perf_points *p = &out->gemv_by_bytes;
            p->key[p->n] = (double)((size_t)mib[i] << 20);
            p->value[p->n++] = (double)((size_t)mib[i] << 20) / t / 1e9;
        }
    }
    weight_arena_free(&wa);
    free(x);
    free(y);
    return rc;
}

int reference_calibrate(struct perf_device *out, int threads) {
    memset(out, 0, sizeof *out);
    if (threads < 1 || threads > 1024)
        return strata_set_error(STRATA_EINVAL, "calibrate: %d threads", threads);
    struct thread_pool *pool = NULL;
    struct weight_arena wa;
    uint16_t *wdata = arena_buffer(&wa, (size_t)CAL_ROWS * CAL_COLS * sizeof *wdata);
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
        /* by K: 2048 rows of K columns over the same 64 rows, the matrices cycled */
        static const int ks[] = {1024, 2048, 4096, 8192};
        for (int i = 0; i < 4; i++) {
            double t = best_of_cycled(3, y, x, wdata, 2048, ks[i], CAL_BATCH, 1, pool);
            struct perf_points *p = &out->gemm_by_k;
            p->key[p->n] = ks[i];
            p->value[p->n++] = 2.0 * CAL_BATCH * 2048 * ks[i] / t / 1e9;
            /* the row-parallel matrices' trees of leaves (o_proj, down) */
            t = best_of_cycled(3, y, x, wdata, 2048, ks[i], CAL_BATCH, OPS_SPLIT_LEAVES, pool);
            p = &out->gemm_split_by_k;
            p->key[p->n] = ks[i];
            p->value[p->n++] = 2.0 * CAL_BATCH * 2048 * ks[i] / t / 1e9;
        }
        /* by rows: a 2048 x 2048 matmul of 4 .. 64 rows, cycled (a 32-row prefill chunk, a
         * batch's decode step) */
        for (int rows = 4; rows <= PERF_GEMM_ROWS; rows *= 2) {
            double t = best_of_cycled(5, y, x, wdata, 2048, 2048, rows, 1, pool);
            struct perf_points *p = &out->gemm_by_rows;
            p->key[p->n] = rows;
            p->value[p->n++] = 2.0 * rows * 2048 * 2048 / t / 1e9;
        }
        out->read_gbps = host_read_bandwidth((size_t)256 << 20, threads) / 1e9;
        rc = calibrate_attention(out, pool, threads);
        /* SwiGLU over 64 rows of a 4096-wide MLP, sliced over the pool as the CPU backend
         * runs it: its expf is most of what a row costs a layer beyond matmuls and attention */
        if (rc == 0) out->elementwise_gelems = calibrate_swiglu(y, x, pool);
        if (rc == 0) rc = calibrate_gemv_sizes(out, pool);
        if (rc == 0 && !(out->read_gbps > 0))
            rc = strata_set_error(STRATA_ENOMEM, "calibrate: bandwidth");
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
    weight_arena_free(&wa);
    free(x);
    free(y);
    return rc;
}
