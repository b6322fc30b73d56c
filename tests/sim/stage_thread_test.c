/* Stage threads: a call runs on the worker and returns its value, a failure carries its
 * message back to the caller's thread, the worker's CPU time is measured, two workers run
 * at once, and stopping a never-started worker is harmless. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "sim/stage_thread.h"

struct job {
    pthread_t ran_on;
    int value;
    volatile uint64_t sink;
};

static int return_value(void *arg) {
    struct job *job = arg;
    job->ran_on = pthread_self();
    return job->value;
}

static int fail_with_message(void *arg) {
    (void)arg;
    return strata_set_error(STRATA_ERANGE, "layer %d is outside the stage", 7);
}

static int spin(void *arg) {
    struct job *job = arg;
    uint64_t x = 1;
    for (int i = 0; i < 20000000; i++)
        x = x * 6364136223846793005ull + 1;
    job->sink = x;
    return 0;
}

static void call_runs_on_the_worker(void **state) {
    (void)state;
    struct stage_thread t;
    assert_int_equal(stage_thread_start(&t), 0);
    struct job job = {.value = 42};
    assert_int_equal(stage_thread_call(&t, return_value, &job), 42);
    assert_false(pthread_equal(job.ran_on, pthread_self()));
    job.value = 3;
    assert_int_equal(stage_thread_call(&t, return_value, &job), 3);
    stage_thread_stop(&t);
}

static void failure_message_reaches_the_caller(void **state) {
    (void)state;
    struct stage_thread t;
    assert_int_equal(stage_thread_start(&t), 0);
    strata_set_error(STRATA_EINVAL, "stale");
    assert_int_equal(stage_thread_call(&t, fail_with_message, NULL), STRATA_ERANGE);
    assert_string_equal(strata_last_error(), "layer 7 is outside the stage");
    stage_thread_stop(&t);
}

static void measures_time_and_runs_in_parallel(void **state) {
    (void)state;
    struct stage_thread a, b;
    struct job ja, jb;
    memset(&ja, 0, sizeof ja);
    memset(&jb, 0, sizeof jb);
    assert_int_equal(stage_thread_start(&a), 0);
    assert_int_equal(stage_thread_start(&b), 0);
    assert_int_equal(stage_thread_submit(&a, spin, &ja), 0);
    assert_int_equal(stage_thread_submit(&b, spin, &jb), 0);
    /* One call at a time per worker. */
    assert_int_equal(stage_thread_submit(&a, spin, &ja), STRATA_EBUSY);
    assert_int_equal(stage_thread_wait(&a), 0);
    assert_int_equal(stage_thread_wait(&b), 0);
    assert_true(a.cpu_ns > 0 && a.wall_ns > 0);
    assert_true(b.cpu_ns > 0 && b.wall_ns > 0);
    assert_int_equal(ja.sink, jb.sink);
    assert_int_equal(stage_thread_wait(&a), STRATA_EINVAL); /* nothing submitted */
    stage_thread_stop(&a);
    stage_thread_stop(&b);
}

static void stop_accepts_unstarted(void **state) {
    (void)state;
    struct stage_thread t;
    memset(&t, 0, sizeof t);
    stage_thread_stop(&t);
    assert_int_equal(stage_thread_call(&t, spin, NULL), STRATA_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(call_runs_on_the_worker),
        cmocka_unit_test(failure_message_reaches_the_caller),
        cmocka_unit_test(measures_time_and_runs_in_parallel),
        cmocka_unit_test(stop_accepts_unstarted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
