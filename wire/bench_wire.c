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

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/wire.h"

/* Reads results so the compiler cannot drop the timed work. */
static volatile float sink;

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-bench-wire [--tokens T] [--hidden H] [--repeats R]\n"
            "Times build + verify + read of a [1, T, H] f32 Activation frame (default\n"
            "[1, 2048, 4096]) next to memcpy of the same bytes and prints GB/s and the ratio.\n"
            "Exit codes: 0 ok, 1 failure, 2 usage.\n");
}

struct bench_args {
    int tokens, hidden, repeats;
};

/* Returns -1 to go on, else the exit code (--help or a bad command line). */
static int parse_args(struct bench_args *a, int argc, char **argv) {
    static const struct option longopts[] = {{"tokens", required_argument, 0, 't'},
                                             {"hidden", required_argument, 0, 'H'},
                                             {"repeats", required_argument, 0, 'r'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    a->tokens = 2048;
    a->hidden = 4096;
    a->repeats = 20;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 't': a->tokens = atoi(optarg); break;
        case 'H': a->hidden = atoi(optarg); break;
        case 'r': a->repeats = atoi(optarg); break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind != argc || a->tokens <= 0 || a->hidden <= 0 || a->repeats <= 0 ||
        (size_t)a->tokens * (size_t)a->hidden > ((size_t)1 << 28)) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

static void print_results(const struct bench_args *a, size_t bytes, size_t frame_len,
                          double best_memcpy, double best_wire) {
    double gbs_memcpy = (double)bytes / best_memcpy / 1e9,
           gbs_wire = (double)bytes / best_wire / 1e9;
    printf("activation [1, %d, %d] f32: %.1f MiB, frame %zu bytes, best of %d\n", a->tokens,
           a->hidden, (double)bytes / (1 << 20), frame_len, a->repeats);
    printf("memcpy                 %8.2f GB/s  (%.3f ms)\n", gbs_memcpy, best_memcpy * 1e3);
    printf("build + verify + read  %8.2f GB/s  (%.3f ms)\n", gbs_wire, best_wire * 1e3);
    printf("ratio wire / memcpy    %8.2f  (goal >= 0.80: %s)\n", gbs_wire / gbs_memcpy,
           gbs_wire / gbs_memcpy >= 0.8 ? "met" : "NOT met");
}

/* Times memcpy against build + verify + read of the same payload; returns the exit code. */
static int run(const struct bench_args *a, float *src, float *dst, struct wire_arena *arena) {
    size_t n = (size_t)a->tokens * (size_t)a->hidden, bytes = n * sizeof(float);
    for (size_t i = 0; i < n; ++i)
        src[i] = (float)(i % 1000) * 0.001f;
    memset(dst, 0, bytes);

    struct wire_activation msg, got;
    memset(&msg, 0, sizeof msg);
    msg.hidden.defined = 1;
    msg.hidden.dtype = WIRE_DTYPE_F32;
    msg.hidden.ndim = 3;
    msg.hidden.shape[0] = 1;
    msg.hidden.shape[1] = a->tokens;
    msg.hidden.shape[2] = a->hidden;
    msg.hidden.nbytes = bytes;
    msg.hidden.data = src;
    if (wire_build_activation(arena, &msg)) goto fail_msg; /* warm-up: touches the arena */

    double best_memcpy = 1e30, best_wire = 1e30;
    for (int r = 0; r < a->repeats; ++r) {
        double t0 = cli_now_sec();
        memcpy(dst, src, bytes);
        double t1 = cli_now_sec();
        sink += dst[n / 2];
        if (wire_build_activation(arena, &msg) ||
            wire_read_activation(&got, wire_arena_frame(arena), wire_arena_frame_len(arena)))
            goto fail_msg;
        double t2 = cli_now_sec();
        sink += ((const float *)got.hidden.data)[n / 2];
        if (t1 - t0 < best_memcpy) best_memcpy = t1 - t0;
        if (t2 - t1 < best_wire) best_wire = t2 - t1;
    }
    if (memcmp(got.hidden.data, src, bytes) != 0) {
        fprintf(stderr, "strata-bench-wire: payload read back differs\n");
        return STRATA_EXIT_FAILURE;
    }
    print_results(a, bytes, wire_arena_frame_len(arena), best_memcpy, best_wire);
    return STRATA_EXIT_OK;
fail_msg:
    fprintf(stderr, "strata-bench-wire: %s\n", strata_last_error());
    return STRATA_EXIT_FAILURE;
}

int main(int argc, char **argv) {
    struct bench_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    size_t bytes = (size_t)a.tokens * (size_t)a.hidden * sizeof(float);
    float *src = aligned_alloc(64, bytes);
    float *dst = aligned_alloc(64, bytes);
    struct wire_arena arena = {0};
    if (!src || !dst || wire_arena_init(&arena, bytes + 4096)) {
        fprintf(stderr, "strata-bench-wire: out of memory\n");
        rc = STRATA_EXIT_FAILURE;
    } else {
        rc = run(&a, src, dst, &arena);
    }
    wire_arena_free(&arena);
    free(src);
    free(dst);
    return rc;
}
