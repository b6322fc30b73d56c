/* See test_group.h. */
#include "tests/reference/test_group.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

int test_group_sum(void *ctx, float *data, size_t n) {
    struct test_rank *r = ctx;
    if (n > r->cap) {
        free(r->tmp);
        r->tmp = malloc(n * sizeof(float));
        r->cap = r->tmp ? n : 0;
    }
    r->g->slot[r->rank] = data;
    pthread_barrier_wait(&r->g->barrier);
    for (size_t i = 0; i < n && r->tmp; ++i) {
        float s = r->g->slot[0][i];
        for (int k = 1; k < r->g->size; ++k)
            s += r->g->slot[k][i];
        r->tmp[i] = s;
    }
    /* Every rank passes both barriers, scratch or not, so no peer waits forever. */
    pthread_barrier_wait(&r->g->barrier);
    if (!r->tmp) return strata_set_error(STRATA_ENOMEM, "test all-reduce: out of memory");
    memcpy(data, r->tmp, n * sizeof(float));
    return 0;
}

int test_group_gather(void *ctx, float *out, const float *in, size_t n) {
    struct test_rank *r = ctx;
    r->g->slot[r->rank] = in;
    pthread_barrier_wait(&r->g->barrier);
    for (int k = 0; k < r->g->size; ++k)
        memcpy(out + (size_t)k * n, r->g->slot[k], n * sizeof(float));
    pthread_barrier_wait(&r->g->barrier);
    return 0;
}
