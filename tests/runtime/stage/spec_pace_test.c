/* runtime/stage/spec_pace.h: a request's drafts per step from how they fared.
 *   - full hits double k up to the most, partial hits keep what landed plus one, a total miss
 *     halves it;
 *   - a miss at one draft waits SPEC_PACE_BACKOFF steps, doubling per further miss up to
 *     SPEC_PACE_BACKOFF_MAX, and a hit resets the wait;
 *   - k 0 never drafts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/stage/spec_pace.h"

static void test_hits_and_misses(void **state) {
    (void)state;
    struct spec_pace p;
    spec_pace_start(&p, 4);
    assert_int_equal(spec_pace_next(&p), 4);
    spec_pace_after(&p, 4, 4); /* full hit: stays at the most */
    assert_int_equal(spec_pace_next(&p), 4);
    spec_pace_after(&p, 4, 2); /* partial: what landed plus one */
    assert_int_equal(spec_pace_next(&p), 3);
    spec_pace_after(&p, 3, 3); /* full hit: twice as many, up to the most */
    assert_int_equal(spec_pace_next(&p), 4);
    spec_pace_after(&p, 4, 0); /* total miss: half */
    assert_int_equal(spec_pace_next(&p), 2);
    spec_pace_after(&p, 2, 0);
    assert_int_equal(spec_pace_next(&p), 1);
    spec_pace_start(&p, 16);
    spec_pace_after(&p, 16, 0); /* 8 */
    spec_pace_after(&p, 8, 0);  /* 4 */
    spec_pace_after(&p, 4, 0);  /* 2 */
    spec_pace_after(&p, 2, 0);  /* 1 */
    assert_int_equal(spec_pace_next(&p), 1);
    for (int want = 2; want <= 16; want *= 2) { /* full hits: 2, 4, 8, 16 */
        spec_pace_after(&p, want / 2, want / 2);
        assert_int_equal(spec_pace_next(&p), want);
    }
    spec_pace_after(&p, 16, 16); /* no more than the most */
    assert_int_equal(spec_pace_next(&p), 16);
}

static void test_backoff(void **state) {
    (void)state;
    struct spec_pace p;
    spec_pace_start(&p, 1);
    int wait = SPEC_PACE_BACKOFF;
    for (int miss = 0; miss < 8; miss++) {
        assert_int_equal(spec_pace_next(&p), 1);
        spec_pace_after(&p, 1, 0); /* a miss at one draft: wait, twice as long each time */
        for (int i = 0; i < wait; i++)
            assert_int_equal(spec_pace_next(&p), 0);
        if (wait < SPEC_PACE_BACKOFF_MAX) wait *= 2;
    }
    assert_int_equal(spec_pace_next(&p), 1);
    spec_pace_after(&p, 1, 1); /* a hit: the next miss waits the first wait again */
    assert_int_equal(spec_pace_next(&p), 1);
    spec_pace_after(&p, 1, 0);
    for (int i = 0; i < SPEC_PACE_BACKOFF; i++)
        assert_int_equal(spec_pace_next(&p), 0);
    assert_int_equal(spec_pace_next(&p), 1);
}

static void test_off(void **state) {
    (void)state;
    struct spec_pace p;
    spec_pace_start(&p, 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(spec_pace_next(&p), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hits_and_misses),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
