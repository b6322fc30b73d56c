/* Host memory bandwidth; see bandwidth.h. */
#include "reference/tools/bandwidth.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reference/weight_arena.h"
#include "runtime/base/cli.h"

struct copy_part {
    char *dst;
    const char *src;
    size_t n;
};

static void *copy_main(void *p) {
    struct copy_part *c = p;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

/* Best of several copies of `bytes` split over `threads` threads; bytes copied per second. */
double host_memcpy_bandwidth(size_t bytes, int threads) {
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {
        pthread_t tid[64];
        struct copy_part part[64];
        size_t chunk = bytes / (size_t)threads;
        double t0 = cli_now_sec();
        for (int i = 0; i < threads; ++i) {
            part[i] = (struct copy_part){dst + (size_t)i * chunk, src + (size_t)i * chunk,
                                         i == threads - 1 ? bytes - (size_t)i * chunk : chunk};
            if (i) pthread_create(&tid[i], NULL, copy_main, &part[i]);
        }
        copy_main(&part[0]);
        for (int i = 1; i < threads; ++i)
            pthread_join(tid[i], NULL);
        double dt = cli_now_sec() - t0;
        if (dt < best) best = dt;
    }
    free(src);
    free(dst);
    return (double)bytes / best;
}

/* Read-only bandwidth (what decode does to weights): each thread sums its share of a
 * buffer. The buffer lives where the weights live (a weight_arena: anonymous memory advised
 * for huge pages) and is read with the widest loads the matmuls use (32 bytes on AVX2), since
 * both change what one thread can stream: on the test host 12.3 GB/s with 16-byte loads from
 * 4 KiB pages, 15 GB/s from huge pages, 19-20 GB/s with 32-byte loads from huge pages. */
typedef uint64_t u64x4 __attribute__((vector_size(32)));

struct read_part {
    const u64x4 *p;
    size_t n;
    uint64_t sum;
};

#define READ_LOOP                                                                                  \
    u64x4 a = {0}, b = {0}, c = {0}, d = {0};                                                      \
    size_t i = 0;                                                                                  \
    for (; i + 4 <= r->n; i += 4) {                                                                \
        a += r->p[i];                                                                              \
        b += r->p[i + 1];                                                                          \
        c += r->p[i + 2];                                                                          \
        d += r->p[i + 3];                                                                          \
    }                                                                                              \
    for (; i < r->n; ++i)                                                                          \
        a += r->p[i];                                                                              \
    a += b + c + d;                                                                                \
    r->sum = a[0] + a[1] + a[2] + a[3];

__attribute__((target("avx2"))) static void read_avx2(struct read_part *r) {
    READ_LOOP
}

static void read_portable(struct read_part *r) {
    READ_LOOP
}

static int have_avx2;

static void *read_main(void *arg) {
    if (have_avx2)
        read_avx2(arg);
    else
        read_portable(arg);
    return NULL;
}

double host_read_bandwidth(size_t bytes, int threads) {
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
    size_t vecs = bytes / sizeof(u64x4);
    struct weight_arena arena;
    if (weight_arena_init(&arena, vecs * sizeof(u64x4))) return 0.0;
    u64x4 *buf = weight_arena_alloc(&arena, vecs * sizeof(u64x4));
    if (!buf) {
        weight_arena_free(&arena);
        return 0.0;
    }
    memset(buf, 1, vecs * sizeof(u64x4));
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 6; ++rep) {
        pthread_t tid[64];
        struct read_part part[64];
        size_t chunk = vecs / (size_t)threads;
        double t0 = cli_now_sec();
        for (int i = 0; i < threads; ++i) {
            part[i] = (struct read_part){buf + (size_t)i * chunk,
                                         i == threads - 1 ? vecs - (size_t)i * chunk : chunk, 0};
            if (i) pthread_create(&tid[i], NULL, read_main, &part[i]);
        }
        read_main(&part[0]);
        for (int i = 1; i < threads; ++i)
            pthread_join(tid[i], NULL);
        double dt = cli_now_sec() - t0;
        for (int i = 0; i < threads; ++i)
            sink += part[i].sum;
        if (dt < best) best = dt;
    }
    (void)sink;
    weight_arena_free(&arena);
    return (double)(vecs * sizeof(u64x4)) / best;
}
