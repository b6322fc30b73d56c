/* Host memory bandwidth; see bandwidth.h. */
#include "reference/tools/bandwidth.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Read-only bandwidth (what decode does to weights): each thread sums its share of a buffer. */
struct read_part {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *read_main(void *arg) {
    struct read_part *r = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= r->n; i += 4) {
        a += r->p[i];
        b += r->p[i + 1];
        c += r->p[i + 2];
        d += r->p[i + 3];
    }
    for (; i < r->n; ++i)
        a += r->p[i];
    r->sum = a + b + c + d;
    return NULL;
}

double host_read_bandwidth(size_t bytes, int threads) {
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    size_t words = bytes / 8;
    uint64_t *buf = malloc(words * 8);
    if (!buf) return 0.0;
    for (size_t i = 0; i < words; ++i)
        buf[i] = i;
    double best = 1e30;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 6; ++rep) {
        pthread_t tid[64];
        struct read_part part[64];
        size_t chunk = words / (size_t)threads;
        double t0 = cli_now_sec();
        for (int i = 0; i < threads; ++i) {
            part[i] = (struct read_part){buf + (size_t)i * chunk,
                                         i == threads - 1 ? words - (size_t)i * chunk : chunk, 0};
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
    free(buf);
    return (double)(words * 8) / best;
}
