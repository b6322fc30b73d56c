/* A fixed pool of worker threads for the reference decoder's row-parallel ops.
 *
 * `thread_pool_run(pool, fn, ctx, n)` calls fn(ctx, begin, end, worker) on contiguous ranges
 * that together cover [0, n) exactly once, and returns when all are done. The range is cut
 * into about 4 chunks per thread, which the threads take in turn (a thread may run several,
 * or none), and every op computes each output element entirely inside one call with a fixed
 * reduction order, so results do not depend on the thread count or on who ran what. A pool of one
 * thread runs everything inline on the caller; otherwise the caller acts as worker 0 and
 * threads 1..T-1 wait on a condition variable between jobs. One job at a time: the pool is not
 * re-entrant. */
#ifndef STRATA_REFERENCE_THREAD_POOL_H
#define STRATA_REFERENCE_THREAD_POOL_H

#define THREAD_POOL_MAX_THREADS 256

struct thread_pool;

typedef void (*thread_pool_fn)(void *ctx, int begin, int end, int worker);

/* num_threads in [1, THREAD_POOL_MAX_THREADS]. */
int thread_pool_init(struct thread_pool **out, int num_threads);
void thread_pool_free(struct thread_pool *pool); /* accepts NULL */
int thread_pool_size(const struct thread_pool *pool);

/* Runs fn over [0, n) in contiguous chunks (never empty) shared out among the threads. */
void thread_pool_run(struct thread_pool *pool, thread_pool_fn fn, void *ctx, int n);

/* The caller has no job for a while (a pipeline stage between its microbatches waits for a
 * whole step of another stage): the workers stop spinning for the next job and sleep now,
 * leaving the cores to the processes that have work. The next thread_pool_run wakes them
 * (one futex wake-up each) and its later jobs spin again. Caller only, between jobs. */
void thread_pool_park(struct thread_pool *pool);

#endif
