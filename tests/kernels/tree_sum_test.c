/* cuda_ops_tree_sum (kernels/nccl.h): bit for bit reference/ops.h ops_tree_sum, the top of
 * matmul_split's tree that the CUDA TP group adds its ranks' partials with, for every count
 * (1, 2, 4, 8), in place and not, on values whose sum depends on the order; and a
 * one-rank NCCL communicator's all-gather copies exactly. Prints "skipped: <reason>" without
 * a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/nccl.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

#define N 100003 /* not a multiple of the block: the grid's tail */

static float value(size_t i) { /* magnitudes 2^-20 .. 2^20 (the order changes the bits) */
    uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    float v = (float)(h & 0xffffff) / (float)0x1000000 - 0.5f;
    for (int e = (int)((h >> 24) % 41) - 20; e != 0; e += e > 0 ? -1 : 1)
        v = e > 0 ? v * 2.0f : v * 0.5f;
    return v;
}

static int check_count(int count, int in_place) {
    const size_t total = (size_t)count * N;
    float *parts = malloc(total * 4), *want = malloc(N * 4), *got = malloc(N * 4);
    float *d_parts = NULL, *d_out = NULL;
    int rc = parts && want && got ? 0 : STRATA_ENOMEM;
    for (size_t i = 0; !rc && i < total; ++i)
        parts[i] = value(i);
    if (!rc) ops_tree_sum(want, parts, count, N);
    if (!rc) rc = cuda_malloc((void **)&d_parts, total * 4);
    if (!rc && !in_place) rc = cuda_malloc((void **)&d_out, N * 4);
    if (!rc) rc = cuda_memcpy_to_device(d_parts, parts, total * 4);
    if (!rc) rc = cuda_ops_tree_sum(in_place ? d_parts : d_out, d_parts, count, N, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, in_place ? d_parts : d_out, N * 4);
    const int bad = !rc && memcmp(got, want, N * 4);
    printf("%s count %d%s%s%s\n", rc || bad ? "FAIL" : "ok  ", count, in_place ? " in place" : "",
           rc ? ": " : "", rc ? strata_last_error() : "");
    cuda_free(d_parts);
    cuda_free(d_out);
    free(parts), free(want), free(got);
    return rc || bad;
}

/* A communicator of one rank: all-gather is a copy, waits end, the sum of two is refused. */
static int check_solo_comm(void) {
    uint8_t id[CUDA_NCCL_ID_BYTES];
    struct cuda_nccl_comm *c = NULL;
    float x[64], y[64];
    float *d_x = NULL, *d_y = NULL;
    for (int i = 0; i < 64; ++i)
        x[i] = value((size_t)i);
    int rc = cuda_nccl_unique_id(id);
    if (!rc) rc = cuda_nccl_comm_init(&c, id, 1, 0, 20000, "solo");
    if (!rc) rc = cuda_malloc((void **)&d_x, sizeof x);
    if (!rc) rc = cuda_malloc((void **)&d_y, sizeof y);
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof x);
    if (!rc) rc = cuda_nccl_allgather(c, d_y, d_x, 64, NULL);
    if (!rc) rc = cuda_nccl_stream_wait(c, NULL, 20000);
    /* A launch right after each wait: the wait polls the stream, and a "not ready" left
     * behind as the thread's last error would fail the next launch's check (on a GPU; the
     * host emulation keeps no such state). Polled at once after the enqueue, the first poll
     * is almost always "not ready". */
    for (int i = 0; i < 20 && !rc; ++i) {
        rc = cuda_nccl_allgather(c, d_y, d_x, 64, NULL);
        if (!rc) rc = cuda_nccl_stream_wait(c, NULL, 20000);
        if (!rc) rc = cuda_ops_tree_sum(d_y, d_x, 1, 64, NULL);
    }
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(y, d_y, sizeof y);
    int bad = !rc && memcmp(x, y, sizeof x);
    if (!rc && cuda_nccl_allreduce_sum2(c, d_x, 64, NULL) != STRATA_EINVAL) bad = 1;
    printf("%s one-rank communicator%s%s\n", rc || bad ? "FAIL" : "ok  ", rc ? ": " : "",
           rc ? strata_last_error() : "");
    cuda_free(d_x);
    cuda_free(d_y);
    cuda_nccl_comm_destroy(c);
    return rc || bad;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = 0;
    for (int count = 1; count <= OPS_SPLIT_LEAVES; count *= 2) {
        failures += check_count(count, 0);
        failures += check_count(count, 1);
    }
    failures += cuda_ops_tree_sum(NULL, NULL, 3, 1, NULL) != STRATA_EINVAL;
    char reason[256];
    if (!cuda_nccl_available(reason, sizeof reason)) {
        printf("skipped: one-rank NCCL communicator: %s\n", reason);
    } else {
        printf("%s\n", reason);
        failures += check_solo_comm();
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
