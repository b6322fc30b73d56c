/* One simulated stage's own thread: the coordinator hands it a call, the thread runs it
 * and the coordinator waits for it (or for several threads at once, e.g. while loading).
 *
 * Each stage's compute (model load, stage core steps) runs on the stage's thread, like a
 * stage process would, but the coordinator decides *when*: a step runs only when the
 * virtual clock says the stage may start it. The thread measures the wall-clock and
 * thread-CPU time of each call, which the simulator charges to the virtual timeline.
 * A failing call's error message (thread-local in runtime/base/status.h) is carried back to
 * the waiting thread. */
#ifndef STRATA_SIM_STAGE_THREAD_H
#define STRATA_SIM_STAGE_THREAD_H

#include <pthread.h>
#include <stdint.h>

typedef int (*stage_thread_fn)(void *arg);

struct stage_thread {
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int started; /* thread and sync objects exist */
    int quit;    /* ask the thread to exit */
    int has_job; /* a call is queued or running */
    stage_thread_fn fn;
    void *arg;
    int result;      /* return value of the last call */
    char error[512]; /* its strata_last_error() when result < 0 */
    int64_t wall_ns; /* wall-clock time of the last call */
    int64_t cpu_ns;  /* CPU time of the stage thread during the last call */
};

int stage_thread_start(struct stage_thread *t);
/* Stops and joins the thread; accepts a zeroed or never-started struct. */
void stage_thread_stop(struct stage_thread *t);

/* Hands `fn(arg)` to the thread without waiting (one call at a time per thread). */
int stage_thread_submit(struct stage_thread *t, stage_thread_fn fn, void *arg);
/* Waits for the submitted call and returns its result; on failure the call's message is
 * recorded as this thread's strata error. */
int stage_thread_wait(struct stage_thread *t);
/* submit + wait. */
int stage_thread_call(struct stage_thread *t, stage_thread_fn fn, void *arg);

#endif
