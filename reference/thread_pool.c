/* Condition-variable thread pool; see thread_pool.h. A job is published under the mutex
 * with a generation counter; each worker runs its own fixed range and the last one to finish
 * signals the caller. Ranges depend only on (n, size), never on timing. */
#include "reference/thread_pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "runtime/status.h"

struct worker_arg {
    struct thread_pool *pool;
    int index;
};

struct thread_pool {
    int size;
    int started; /* threads created (for a half-built free) */
    pthread_t *threads;
    struct worker_arg *args;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    pthread_cond_t done;
    int sync_ready; /* mutex and condvars initialised */
    unsigned long generation;
    int pending; /* workers 1..size-1 still running the current job */
    int quit;
    thread_pool_fn fn;
    void *ctx;
    int n;
};

static void run_share(struct thread_pool *pool, thread_pool_fn fn, void *ctx, int n, int w) {
    int chunk = (n + pool->size - 1) / pool->size;
    int begin = w * chunk;
    int end = begin + chunk < n ? begin + chunk : n;
    if (begin < end) fn(ctx, begin, end, w);
}

static void *worker_main(void *p) {
    struct worker_arg *arg = p;
    struct thread_pool *pool = arg->pool;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mutex);
        while (!pool->quit && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->mutex);
        if (pool->quit) {
            pthread_mutex_unlock(&pool->mutex);
            return NULL;
        }
        seen = pool->generation;
        thread_pool_fn fn = pool->fn;
        void *ctx = pool->ctx;
        int n = pool->n;
        pthread_mutex_unlock(&pool->mutex);

        run_share(pool, fn, ctx, n, arg->index);

        pthread_mutex_lock(&pool->mutex);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

int thread_pool_init(struct thread_pool **out, int num_threads) {
    *out = NULL;
    if (num_threads < 1 || num_threads > THREAD_POOL_MAX_THREADS)
        return strata_set_error(STRATA_EINVAL, "thread_pool: %d threads (want 1..%d)", num_threads,
                                THREAD_POOL_MAX_THREADS);
    struct thread_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return strata_set_error(STRATA_ENOMEM, "thread_pool: out of memory");
    pool->size = num_threads;
    if (num_threads == 1) {
        *out = pool;
        return STRATA_OK;
    }
    pool->threads = calloc((size_t)num_threads, sizeof *pool->threads);
    pool->args = calloc((size_t)num_threads, sizeof *pool->args);
    if (!pool->threads || !pool->args) goto fail_nomem;
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) goto fail_nomem;
    if (pthread_cond_init(&pool->wake, NULL) != 0) {
        pthread_mutex_destroy(&pool->mutex);
        goto fail_nomem;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->wake);
        pthread_mutex_destroy(&pool->mutex);
        goto fail_nomem;
    }
    pool->sync_ready = 1;
    for (int w = 1; w < num_threads; ++w) {
        pool->args[w].pool = pool;
        pool->args[w].index = w;
        if (pthread_create(&pool->threads[w], NULL, worker_main, &pool->args[w]) != 0) {
            thread_pool_free(pool);
            return strata_set_error(STRATA_ENOMEM, "thread_pool: cannot start thread %d of %d", w,
                                    num_threads);
        }
        pool->started = w;
    }
    *out = pool;
    return STRATA_OK;

fail_nomem:
    thread_pool_free(pool);
    return strata_set_error(STRATA_ENOMEM, "thread_pool: out of memory");
}

void thread_pool_free(struct thread_pool *pool) {
    if (!pool) return;
    if (pool->sync_ready) {
        pthread_mutex_lock(&pool->mutex);
        pool->quit = 1;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
        for (int w = 1; w <= pool->started; ++w)
            pthread_join(pool->threads[w], NULL);
        pthread_cond_destroy(&pool->done);
        pthread_cond_destroy(&pool->wake);
        pthread_mutex_destroy(&pool->mutex);
    }
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int thread_pool_size(const struct thread_pool *pool) {
    return pool->size;
}

void thread_pool_run(struct thread_pool *pool, thread_pool_fn fn, void *ctx, int n) {
    if (n <= 0) return;
    if (pool->size == 1 || n == 1) {
        /* Same result as the split: each element is computed whole wherever it runs. */
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n = n;
    pool->pending = pool->size - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);

    run_share(pool, fn, ctx, n, 0);

    pthread_mutex_lock(&pool->mutex);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
