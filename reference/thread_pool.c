/* Thread pool with a spin before sleeping whose length follows the host's load; see
 * thread_pool.h.
 *
 * A job is published by writing fn/ctx/n and then bumping an atomic generation counter
 * (release); workers spin on the counter (acquire) and fall back to a condition variable,
 * so back-to-back matmuls in a decode step pay ~1 µs per dispatch instead of a futex
 * wake-up. Completion is an atomic count of workers still running, with the same
 * spin-then-sleep wait on the caller's side.
 *
 * How long to spin depends on the host. On a quiet host the gaps between a decode step's
 * dispatches (norms, RoPE, the KV copy, one side finishing its share late) often last
 * 5-50 µs, longer than SPIN_LIMIT pauses, and a thread that fell asleep costs a futex
 * wake-up (30-100 µs on a VM) per dispatch: a long spin gave +26% decode tok/s at 2 threads.
 * On a busy host (more runnable threads than cores) the same spin made decode 2-4x slower:
 * a spinning thread burns the time slice the thread with real work needs, and it loses the
 * scheduler's sleeper credit. So the caller samples how long it waited for a CPU while it
 * had jobs to run (the kernel's schedstat; its involuntary context switches where there is
 * none) every SPIN_WINDOW_NS: a quiet window allows the long, time-bounded spin
 * (SPIN_LONG_NS, yielding every SPIN_YIELD_EVERY pauses); a busy one falls back to
 * SPIN_LIMIT pauses. A caller with no job for a while (a pipeline stage between its
 * microbatches) parks the pool: the workers sleep at once instead of spinning into the
 * cores another stage computes on. Every check that precedes a sleep happens under
 * the mutex that the waker takes before signalling, so no wake-up is lost. Ranges depend
 * only on (n, size), never on timing. */
#include "reference/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/status.h"

/* Spin iterations before sleeping (each a pause instruction, ~10-40 ns) on a busy host. */
#define SPIN_LIMIT 256
/* On a quiet host: how long a waiting thread spins before it sleeps, and how often (in
 * pauses) it checks the clock and yields the core meanwhile. */
#define SPIN_LONG_NS 200000L
#define SPIN_YIELD_EVERY 128
/* Chunks per thread a job is cut into (run_share). */
#define CHUNKS_PER_THREAD 4
/* How often the caller looks at its involuntary context switches. */
#define SPIN_WINDOW_NS 20000000L

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
    atomic_ulong generation;
    atomic_int pending; /* workers 1..size-1 still running the current job */
    atomic_int quit;
    atomic_long spin_ns; /* the long spin's budget now: SPIN_LONG_NS or 0 (busy host) */
    atomic_int parked;   /* thread_pool_park: no job soon, sleep rather than spin */
    long window_start;   /* caller only: the current sampling window; in it, the caller's time */
    long acc_run;        /* on a CPU and waiting for one (schedstat) while not parked, */
    long acc_wait;
    long seg_run, seg_wait; /* at the start of the segment now open (-1: parked) */
    long window_nivcsw;     /* or its involuntary context switches where there is no schedstat */
    thread_pool_fn fn;
    void *ctx;
    int n;
    int chunk;             /* tasks per chunk of the current job */
    atomic_int next_chunk; /* the current job's next chunk to take */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Worker w's part of the job: contiguous chunks of about n / (CHUNKS_PER_THREAD * size)
 * tasks, taken in turn from a shared counter until none is left. A thread that runs late (the
 * host preempted it, or its chunk was slower) does fewer chunks instead of holding the others
 * at the barrier, as a fixed n / size share would; where each chunk runs changes no result. */
static void run_share(struct thread_pool *pool, thread_pool_fn fn, void *ctx, int n, int w) {
    const int chunk = pool->chunk;
    for (;;) {
        const int c = atomic_fetch_add_explicit(&pool->next_chunk, 1, memory_order_relaxed);
        if (c >= (n + chunk - 1) / chunk) return;
        const int begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
        fn(ctx, begin, end, w);
    }
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* One step of a wait's spin: a pause; past SPIN_LIMIT pauses, while the pool allows the
 * long spin, a clock check and a yield every SPIN_YIELD_EVERY pauses. Returns 0 when the
 * thread should sleep instead. */
static int spin_step(struct thread_pool *pool, int *spin, long *start) {
    if (atomic_load_explicit(&pool->parked, memory_order_relaxed)) return 0;
    cpu_relax();
    if (++*spin < SPIN_LIMIT || *spin % SPIN_YIELD_EVERY) return 1;
    long budget = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
    if (budget <= 0) return 0;
    long t = now_ns();
    if (*start == 0) *start = t;
    if (t - *start >= budget) return 0;
    sched_yield();
    return 1;
}

/* The calling thread's time on a CPU and time runnable but waiting for one (ns), from the
 * scheduler's own accounting; 0 when the kernel keeps none (no /proc, no schedstats). */
static int caller_schedstat(long *run_ns, long *wait_ns) {
    char buf[96];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return sscanf(buf, "%ld %ld", run_ns, wait_ns) == 2;
}

/* Caller only: the scheduler's accounting of the caller from the last segment_open on is
 * added to the window's; parked time stays out of it (see sample_load). */
static void segment_close(struct thread_pool *pool) {
    long run, wait;
    if (pool->seg_run >= 0 && caller_schedstat(&run, &wait)) {
        pool->acc_run += run - pool->seg_run;
        pool->acc_wait += wait - pool->seg_wait;
    }
    pool->seg_run = -1;
}

static void segment_open(struct thread_pool *pool) {
    long run, wait;
    if (caller_schedstat(&run, &wait)) {
        pool->seg_run = run;
        pool->seg_wait = wait;
    }
}

/* Caller only: once per SPIN_WINDOW_NS, judges the window that ended. The host is busy when
 * the caller, while it had jobs to run, waited for a CPU more than a tenth of the time it
 * ran: threads outnumber cores, and a spinning worker would take a slice from one with work.
 * Only the time between thread_pool_park calls counts: a parked caller waits for frames, and
 * its wake-up then (an idle virtual CPU to start again, the sender still on the other one)
 * says nothing of the load the spin would meet. Brief wake-ups of other processes cost the
 * caller microseconds and keep the long spin; counting them as preemptions, as the fallback
 * without schedstats does (involuntary context switches), would not. */
static void sample_load(struct thread_pool *pool) {
    long t = now_ns();
    if (t - pool->window_start < SPIN_WINDOW_NS) return;
    int quiet;
    long probe_run, probe_wait;
    if (caller_schedstat(&probe_run, &probe_wait)) {
        segment_close(pool);
        quiet = pool->window_start != 0 && pool->acc_run > 0 && pool->acc_wait * 10 < pool->acc_run;
        pool->acc_run = pool->acc_wait = 0;
        segment_open(pool);
    } else {
        struct rusage ru;
        long nivcsw = getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : -1;
        quiet = pool->window_start != 0 && nivcsw >= 0 && nivcsw == pool->window_nivcsw;
        pool->window_nivcsw = nivcsw;
    }
    atomic_store_explicit(&pool->spin_ns, quiet ? SPIN_LONG_NS : 0, memory_order_relaxed);
    pool->window_start = t;
}

/* Waits until the generation differs from `seen` (returns it) or the pool quits (returns seen). */
static unsigned long wait_for_job(struct thread_pool *pool, unsigned long seen) {
    int spin = 0;
    long start = 0;
    do {
        unsigned long g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&pool->quit, memory_order_acquire)) return g;
    } while (spin_step(pool, &spin, &start));
    pthread_mutex_lock(&pool->mutex);
    unsigned long g;
    while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
           !atomic_load_explicit(&pool->quit, memory_order_acquire))
        pthread_cond_wait(&pool->wake, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

static void *worker_main(void *p) {
    struct worker_arg *arg = p;
    struct thread_pool *pool = arg->pool;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = wait_for_job(pool, seen);
        if (atomic_load_explicit(&pool->quit, memory_order_acquire)) return NULL;
        seen = g;
        run_share(pool, pool->fn, pool->ctx, pool->n, arg->index);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mutex);
        }
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
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->quit, 0);
    atomic_init(&pool->spin_ns, 0); /* short until a quiet window has been seen */
    atomic_init(&pool->parked, 0);
    pool->seg_run = -1;
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
        atomic_store_explicit(&pool->quit, 1, memory_order_release);
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

void thread_pool_park(struct thread_pool *pool) {
    if (!pool || pool->size == 1 || atomic_load_explicit(&pool->parked, memory_order_relaxed))
        return;
    segment_close(pool);
    atomic_store_explicit(&pool->parked, 1, memory_order_relaxed);
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
    if (atomic_load_explicit(&pool->parked, memory_order_relaxed)) {
        segment_open(pool);
        /* Before the job is published: a worker that still sees the flag goes to the
         * mutex-guarded sleep path, which finds the new generation and returns. */
        atomic_store_explicit(&pool->parked, 0, memory_order_relaxed);
    }
    sample_load(pool);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n = n;
    pool->chunk = (n + CHUNKS_PER_THREAD * pool->size - 1) / (CHUNKS_PER_THREAD * pool->size);
    atomic_store_explicit(&pool->next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->pending, pool->size - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_mutex_lock(&pool->mutex); /* wakes workers that went to sleep */
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);

    run_share(pool, fn, ctx, n, 0);

    int spin = 0;
    long start = 0;
    do {
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return;
    } while (spin_step(pool, &spin, &start));
    pthread_mutex_lock(&pool->mutex);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0)
        pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
