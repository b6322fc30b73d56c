/* strata-bench-wire: throughput of build + verify + read of one activation frame against a
 * plain memcpy of the same payload.
 *
 * The builder copies the payload once into the arena and the reader only points into the
 * frame (zero copy), so the whole round should cost about one memcpy; the ratio printed
 * at the end is wire GB/s / memcpy GB/s (goal >= 0.8). Buffers are touched before timing
 * and the best of several repetitions is reported, to keep page faults and noise out. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/base/status.h"
#include "wire/wire.h"

/* Reads results so the compiler cannot drop the timed work. */
static volatile float sink;

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-bench-wire [--tokens T] [--hidden H] [--repeats R]\n"
            "Times build + verify + read of a [1, T, H] f32 Activation frame (default\n"
            "[1, 2048, 4096]) next to memcpy of the same bytes and prints GB/s and the ratio.\n"
            "Exit codes: 0 ok, 1 failure, 2 usage.\n");
}

int main(int argc, char **argv) {
    int tokens = 2048, hidden = 4096, repeats = 20;
    static const struct option longopts[] = {{"tokens", required_argument, 0, 't'},
                                             {"hidden", required_argument, 0, 'H'},
                                             {"repeats", required_argument, 0, 'r'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 't': tokens = atoi(optarg); break;
        case 'H': hidden = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind != argc || tokens <= 0 || hidden <= 0 || repeats <= 0 ||
        (size_t)tokens * (size_t)hidden > ((size_t)1 << 28)) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    size_t n = (size_t)tokens * (size_t)hidden, bytes = n * sizeof(float);
    float *src = aligned_alloc(64, bytes);
    float *dst = aligned_alloc(64, bytes);
    struct wire_arena arena = {0};
    int rc = STRATA_EXIT_FAILURE;
    if (!src || !dst || wire_arena_init(&arena, bytes + 4096)) {
        fprintf(stderr, "strata-bench-wire: out of memory\n");
        goto fail;
    }
    for (size_t i = 0; i < n; ++i)
        src[i] = (float)(i % 1000) * 0.001f;
    memset(dst, 0, bytes);

    struct wire_activation msg, got;
    memset(&msg, 0, sizeof msg);
    msg.hidden.defined = 1;
    msg.hidden.dtype = WIRE_DTYPE_F32;
    msg.hidden.ndim = 3;
    msg.hidden.shape[0] = 1;
    msg.hidden.shape[1] = tokens;
    msg.hidden.shape[2] = hidden;
    msg.hidden.nbytes = bytes;
    msg.hidden.data = src;
    if (wire_build_activation(&arena, &msg)) goto fail_msg; /* warm-up: touches the arena */

    double best_memcpy = 1e30, best_wire = 1e30;
    for (int r = 0; r < repeats; ++r) {
        double t0 = seconds_now();
        memcpy(dst, src, bytes);
        double t1 = seconds_now();
        sink += dst[n / 2];
        if (wire_build_activation(&arena, &msg) ||
            wire_read_activation(&got, wire_arena_frame(&arena), wire_arena_frame_len(&arena)))
            goto fail_msg;
        double t2 = seconds_now();
        sink += ((const float *)got.hidden.data)[n / 2];
        if (t1 - t0 < best_memcpy) best_memcpy = t1 - t0;
        if (t2 - t1 < best_wire) best_wire = t2 - t1;
    }
    if (memcmp(got.hidden.data, src, bytes) != 0) {
        fprintf(stderr, "strata-bench-wire: payload read back differs\n");
        goto fail;
    }
    double gbs_memcpy = (double)bytes / best_memcpy / 1e9,
           gbs_wire = (double)bytes / best_wire / 1e9;
    printf("activation [1, %d, %d] f32: %.1f MiB, frame %zu bytes, best of %d\n", tokens, hidden,
           (double)bytes / (1 << 20), wire_arena_frame_len(&arena), repeats);
    printf("memcpy                 %8.2f GB/s  (%.3f ms)\n", gbs_memcpy, best_memcpy * 1e3);
    printf("build + verify + read  %8.2f GB/s  (%.3f ms)\n", gbs_wire, best_wire * 1e3);
    printf("ratio wire / memcpy    %8.2f  (goal >= 0.80: %s)\n", gbs_wire / gbs_memcpy,
           gbs_wire / gbs_memcpy >= 0.8 ? "met" : "NOT met");
    rc = STRATA_EXIT_OK;
    goto done;
fail_msg:
    fprintf(stderr, "strata-bench-wire: %s\n", strata_last_error());
fail:
done:
    wire_arena_free(&arena);
    free(src);
    free(dst);
    return rc;
}
