/* Stage worker threads of the simulator (see stage_thread.h): a mutex + condition
 * variable handoff of one call at a time, timed with CLOCK_MONOTONIC and
 * CLOCK_THREAD_CPUTIME_ID on the worker. */
#include "sim/stage_thread.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime/base/status.h"

static int64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *stage_thread_main(void *opaque) {
    struct stage_thread *t = opaque;
    pthread_mutex_lock(&t->mutex);
    for (;;) {
        while (!t->quit && !(t->has_job && t->fn))
            pthread_cond_wait(&t->cond, &t->mutex);
        if (t->quit) break;
        stage_thread_fn fn = t->fn;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mutex);

        int64_t wall0 = clock_ns(CLOCK_MONOTONIC), cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        int result = fn(arg);
        int64_t cpu1 = clock_ns(CLOCK_THREAD_CPUTIME_ID), wall1 = clock_ns(CLOCK_MONOTONIC);

        pthread_mutex_lock(&t->mutex);
        t->result = result;
        t->error[0] = '\0';
        if (result < 0) snprintf(t->error, sizeof t->error, "%s", strata_last_error());
        t->wall_ns = wall1 - wall0;
        t->cpu_ns = cpu1 - cpu0;
        t->fn = NULL; /* done; has_job stays set until the waiter collects it */
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->mutex);
    return NULL;
}

int stage_thread_start(struct stage_thread *t) {
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mutex, NULL) != 0)
        return strata_set_error(STRATA_ENOMEM, "stage thread: pthread_mutex_init failed");
    if (pthread_cond_init(&t->cond, NULL) != 0) {
        pthread_mutex_destroy(&t->mutex);
        return strata_set_error(STRATA_ENOMEM, "stage thread: pthread_cond_init failed");
    }
    int err = pthread_create(&t->thread, NULL, stage_thread_main, t);
    if (err != 0) {
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->mutex);
        return strata_set_error(STRATA_ENOMEM, "stage thread: pthread_create: %s", strerror(err));
    }
    t->started = 1;
    return 0;
}

void stage_thread_stop(struct stage_thread *t) {
    if (!t || !t->started) return;
    pthread_mutex_lock(&t->mutex);
    t->quit = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mutex);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->mutex);
    t->started = 0;
}

int stage_thread_submit(struct stage_thread *t, stage_thread_fn fn, void *arg) {
    if (!t->started) return strata_set_error(STRATA_EINVAL, "stage thread: not started");
    pthread_mutex_lock(&t->mutex);
    if (t->has_job) {
        pthread_mutex_unlock(&t->mutex);
        return strata_set_error(STRATA_EBUSY, "stage thread: a call is already running");
    }
    t->has_job = 1;
    t->fn = fn;
    t->arg = arg;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mutex);
    return 0;
}

int stage_thread_wait(struct stage_thread *t) {
    if (!t->started) return strata_set_error(STRATA_EINVAL, "stage thread: not started");
    pthread_mutex_lock(&t->mutex);
    if (!t->has_job) {
        pthread_mutex_unlock(&t->mutex);
        return strata_set_error(STRATA_EINVAL, "stage thread: nothing submitted");
    }
    while (t->fn)
        pthread_cond_wait(&t->cond, &t->mutex);
    t->has_job = 0;
    int result = t->result;
    char error[sizeof t->error];
    memcpy(error, t->error, sizeof error);
    pthread_mutex_unlock(&t->mutex);
    if (result < 0) return strata_set_error(result, "%s", error);
    return result;
}

int stage_thread_call(struct stage_thread *t, stage_thread_fn fn, void *arg) {
    int rc = stage_thread_submit(t, fn, arg);
    if (rc < 0) return rc;
    return stage_thread_wait(t);
}
