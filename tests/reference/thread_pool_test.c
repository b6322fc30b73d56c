/* thread_pool: every index in [0, n) is visited exactly once, in non-empty chunks of the
 * documented size (about 4 per thread) run by valid workers, for many sizes and thread counts
 * and across many rapid jobs, with the pool parked between them or not; bad thread counts are
 * refused. */
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "reference/thread_pool.h"
#include "runtime/base/status.h"

struct visit {
    int count[1000];
    int owner[1000];
    atomic_int calls, bad; /* bad: an empty range or one off the chunk grid */
    int chunk, n;
};

static void mark(void *ctx, int begin, int end, int worker) {
    struct visit *v = ctx;
    atomic_fetch_add(&v->calls, 1);
    if (begin >= end || begin % v->chunk || (end - begin != v->chunk && end != v->n))
        atomic_fetch_add(&v->bad, 1);
    for (int i = begin; i < end; ++i) {
        v->count[i]++;
        v->owner[i] = worker;
    }
}

static void test_ranges_cover_once(void **state) {
    (void)state;
    for (int threads = 1; threads <= 5; ++threads) {
        struct thread_pool *pool;
        assert_int_equal(thread_pool_init(&pool, threads), 0);
        assert_int_equal(thread_pool_size(pool), threads);
        for (int n = 0; n <= 1000; n += (n < 20 ? 1 : 97)) {
            static struct visit v;
            memset(&v, 0, sizeof v);
            const int chunk = n ? (n + 4 * threads - 1) / (4 * threads) : 1;
            v.chunk = threads == 1 || n == 1 ? (n ? n : 1) : chunk; /* one call over all */
            v.n = n;
            thread_pool_run(pool, mark, &v, n);
            for (int i = 0; i < n; ++i) {
                assert_int_equal(v.count[i], 1);
                assert_true(v.owner[i] >= 0 && v.owner[i] < threads);
            }
            assert_int_equal(atomic_load(&v.bad), 0);
            if (n > 0) assert_int_equal(atomic_load(&v.calls), (n + v.chunk - 1) / v.chunk);
        }
        thread_pool_free(pool);
    }
}

static void add_one(void *ctx, int begin, int end, int worker) {
    (void)worker;
    int *x = ctx;
    for (int i = begin; i < end; ++i)
        x[i]++;
}

static void test_many_rapid_jobs(void **state) {
    (void)state;
    struct thread_pool *pool;
    assert_int_equal(thread_pool_init(&pool, 3), 0);
    static int x[64];
    for (int job = 0; job < 20000; ++job)
        thread_pool_run(pool, add_one, x, 64);
    for (int i = 0; i < 64; ++i)
        assert_int_equal(x[i], 20000);
    thread_pool_free(pool);
    thread_pool_free(NULL);
}

/* Parking between jobs (a pipeline stage between microbatches): the next jobs still cover
 * every index once, whether the workers were still spinning when parked, had gone to sleep,
 * or the pool was parked twice; on a pool of one thread it does nothing. */
static void test_park_between_jobs(void **state) {
    (void)state;
    for (int threads = 1; threads <= 4; threads += 3) {
        struct thread_pool *pool;
        assert_int_equal(thread_pool_init(&pool, threads), 0);
        static int x[97];
        memset(x, 0, sizeof x);
        for (int job = 0; job < 3000; ++job) {
            thread_pool_run(pool, add_one, x, 97);
            if (job % 3 == 0) thread_pool_park(pool);
            if (job % 7 == 0) thread_pool_park(pool);
            if (job % 500 == 0) {
                struct timespec ts = {0, 2000000}; /* the workers fall asleep meanwhile */
                nanosleep(&ts, NULL);
            }
        }
        for (int i = 0; i < 97; ++i)
            assert_int_equal(x[i], 3000);
        thread_pool_free(pool);
    }
    thread_pool_park(NULL);
}

static void test_bad_sizes(void **state) {
    (void)state;
    struct thread_pool *pool = (struct thread_pool *)&pool;
    assert_int_equal(thread_pool_init(&pool, 0), STRATA_EINVAL);
    assert_null(pool);
    assert_int_equal(thread_pool_init(&pool, THREAD_POOL_MAX_THREADS + 1), STRATA_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_cover_once),
        cmocka_unit_test(test_many_rapid_jobs),
        cmocka_unit_test(test_park_between_jobs),
        cmocka_unit_test(test_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
