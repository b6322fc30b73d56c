/* An in-process collective group for reference-model tests (grid_test, tp_argmax_test):
 * ranks are threads that publish a pointer, meet at a barrier and read each other's. The
 * all-reduce sums in rank order (what a two-rank group or the embedding's one-real-row sum
 * needs); the all-gather concatenates in rank order. Plugs into reference_load_options'
 * `coll` (ctx = a struct test_rank). */
#ifndef STRATA_TESTS_REFERENCE_TEST_GROUP_H
#define STRATA_TESTS_REFERENCE_TEST_GROUP_H

#include <pthread.h>
#include <stddef.h>

#define TEST_GROUP_MAX 8

struct test_group {
    int size;
    pthread_barrier_t barrier;
    const float *slot[TEST_GROUP_MAX];
};

/* One rank's handle; tmp/cap are its scratch (free(tmp) when done). */
struct test_rank {
    struct test_group *g;
    int rank;
    float *tmp;
    size_t cap;
};

/* data [n] = Σ over ranks in rank order; STRATA_ENOMEM (after the barriers) without scratch. */
int test_group_sum(void *ctx, float *data, size_t n);
/* out [size * n] = every rank's in [n], in rank order. */
int test_group_gather(void *ctx, float *out, const float *in, size_t n);

#endif
