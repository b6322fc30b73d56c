/* The virtual clock pops events in (time, stage, sequence) order, advances its time only
 * forward, rejects events in the past, cancels a killed stage's events and frees payloads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "sim/virtual_clock.h"

static void pops_by_time_then_stage_then_sequence(void **state) {
    (void)state;
    struct virtual_clock clock;
    assert_int_equal(vclock_init(&clock), 0);
    /* kind records the expected pop position. */
    assert_int_equal(vclock_schedule(&clock, 50, 1, 3, 0, NULL, 0, NULL), 0);
    assert_int_equal(vclock_schedule(&clock, 50, 0, 2, 0, NULL, 0, NULL), 0);
    assert_int_equal(vclock_schedule(&clock, 10, 5, 0, 0, NULL, 0, NULL), 0);
    assert_int_equal(vclock_schedule(&clock, 50, 1, 4, 0, NULL, 0, NULL), 0);
    assert_int_equal(vclock_schedule(&clock, 20, 9, 1, 0, NULL, 0, NULL), 0);
    struct sim_event ev;
    for (int want = 0; want < 5; want++) {
        assert_int_equal(vclock_pop(&clock, &ev), 1);
        assert_int_equal(ev.kind, want);
        assert_int_equal(clock.now_ns, ev.time_ns);
    }
    assert_int_equal(vclock_pop(&clock, &ev), 0);
    assert_int_equal(clock.now_ns, 50);
    vclock_free(&clock);
}

static void rejects_events_in_the_past(void **state) {
    (void)state;
    struct virtual_clock clock;
    struct sim_event ev;
    assert_int_equal(vclock_init(&clock), 0);
    assert_int_equal(vclock_schedule(&clock, 100, 0, 0, 0, NULL, 0, NULL), 0);
    assert_int_equal(vclock_pop(&clock, &ev), 1);
    assert_int_equal(vclock_schedule(&clock, 99, 0, 0, 0, NULL, 0, NULL), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "before now"));
    assert_int_equal(vclock_schedule(&clock, 100, 0, 0, 0, NULL, 0, NULL), 0);
    vclock_free(&clock);
}

/* Many random events: the pop order is non-decreasing in the key and the same for two
 * clocks fed identically (the heap's order does not depend on how it grew). */
static void large_random_schedule_is_sorted_and_repeatable(void **state) {
    (void)state;
    struct virtual_clock a, b;
    assert_int_equal(vclock_init(&a), 0);
    assert_int_equal(vclock_init(&b), 0);
    uint64_t rng = 12345;
    for (int i = 0; i < 5000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int64_t t = (int64_t)((rng >> 33) % 1000);
        int stage = (int)((rng >> 20) % 4);
        assert_int_equal(vclock_schedule(&a, t, stage, i, 0, NULL, 0, NULL), 0);
        assert_int_equal(vclock_schedule(&b, t, stage, i, 0, NULL, 0, NULL), 0);
    }
    struct sim_event prev, ea, eb;
    int n = 0;
    while (vclock_pop(&a, &ea)) {
        assert_int_equal(vclock_pop(&b, &eb), 1);
        assert_int_equal(ea.kind, eb.kind);
        if (n > 0) {
            assert_true(prev.time_ns <= ea.time_ns);
            if (prev.time_ns == ea.time_ns) {
                assert_true(prev.stage <= ea.stage);
                if (prev.stage == ea.stage) assert_true(prev.seq < ea.seq);
            }
        }
        prev = ea;
        n++;
    }
    assert_int_equal(n, 5000);
    vclock_free(&a);
    vclock_free(&b);
}

static void cancel_removes_one_stage_and_frees_payloads(void **state) {
    (void)state;
    struct virtual_clock clock;
    assert_int_equal(vclock_init(&clock), 0);
    for (int i = 0; i < 10; i++) {
        void *payload = malloc(16);
        assert_non_null(payload);
        assert_int_equal(vclock_schedule(&clock, 10 * i, i % 3, i % 2, i, payload, 16, NULL), 0);
    }
    /* Stage 1 has events i = 1, 4, 7; of kind 1: i = 1, 7. */
    assert_int_equal(vclock_cancel(&clock, 1, 1), 2);
    assert_int_equal(vclock_cancel(&clock, 1, -1), 1);
    struct sim_event ev;
    int64_t last = -1;
    int popped = 0;
    while (vclock_pop(&clock, &ev)) {
        assert_int_not_equal(ev.stage, 1);
        assert_true(ev.time_ns >= last);
        last = ev.time_ns;
        free(ev.data);
        popped++;
    }
    assert_int_equal(popped, 7);
    /* Payloads still queued at free time are released by vclock_free (ASan checks it). */
    assert_int_equal(vclock_schedule(&clock, last, 0, 0, 0, malloc(8), 8, NULL), 0);
    vclock_free(&clock);
    vclock_free(&clock);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pops_by_time_then_stage_then_sequence),
        cmocka_unit_test(rejects_events_in_the_past),
        cmocka_unit_test(large_random_schedule_is_sorted_and_repeatable),
        cmocka_unit_test(cancel_removes_one_stage_and_frees_payloads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
