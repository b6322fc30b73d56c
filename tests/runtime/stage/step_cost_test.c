/* runtime/stage/step_cost.h: the rows budget from measured decode steps.
 *   - nothing measured: the whole range (optimistic); a baseline is a step of at most the
 *     requests' own rows, and a larger step measured against it ends the budget below it;
 *   - a memory-bound curve (flat to 8 rows, then linear): the budget ends at the knee, and
 *     moves when the costs change (the moving average follows, old measurements expire);
 *   - the cheapest step's rows are always allowed; costs between measured row counts are
 *     interpolated; bad inputs are ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/stage/step_cost.h"

/* A step of r rows: 10 ms up to `knee` rows, then 10 ms x r / knee. */
static double curve(int r, int knee) {
    return r <= knee ? 0.010 : 0.010 * r / knee;
}

static void test_optimistic_and_baseline(void **state) {
    (void)state;
    struct step_cost c = {0};
    assert_int_equal(step_cost_budget(&c), STEP_COST_ROWS);
    assert_false(step_cost_has_baseline(&c, 8));
    step_cost_add(&c, 40, 0.040);
    assert_false(step_cost_has_baseline(&c, 8));
    assert_true(step_cost_has_baseline(&c, 40));
    for (int r = 1; r <= 6; r++)
        step_cost_add(&c, r, curve(r, 8));
    assert_true(step_cost_has_baseline(&c, 8));
    assert_int_equal(step_cost_budget(&c), 39); /* 40 rows measured at 4x: not flat */
}

static void test_knee(void **state) {
    (void)state;
    struct step_cost c = {0};
    for (int r = 1; r <= 24; r++)
        step_cost_add(&c, r, curve(r, 8));
    /* 10 rows cost 12.5 ms: not more than 1.25 x 10 ms; 11 rows do */
    assert_int_equal(step_cost_budget(&c), 10);
    /* The box gets busier: steps of 4 rows and more now cost twice as much per row beyond 2 */
    for (int i = 0; i < 40; i++)
        for (int r = 1; r <= 24; r++)
            step_cost_add(&c, r, curve(r, 2));
    assert_int_equal(step_cost_budget(&c), 2);
}

static void test_expiry_and_inputs(void **state) {
    (void)state;
    struct step_cost c = {0};
    step_cost_add(&c, 16, 0.050); /* one slow large step */
    step_cost_add(&c, 1, 0.010);
    assert_int_equal(step_cost_budget(&c), 15);
    for (unsigned i = 0; i <= STEP_COST_MAX_AGE; i++) /* many steps of one row later */
        step_cost_add(&c, 1, 0.010);
    assert_int_equal(step_cost_budget(&c), STEP_COST_ROWS); /* the slow step is forgotten */
    step_cost_add(&c, 0, 1.0);                              /* ignored */
    step_cost_add(&c, 3, -1.0);                             /* ignored */
    step_cost_add(&c, 1000, 0.5);                           /* counted as STEP_COST_ROWS rows */
    assert_int_equal(step_cost_budget(&c), STEP_COST_ROWS - 1);
    struct step_cost e = {0}; /* interpolation between measured row counts */
    assert_true(step_cost_sec(&e, 8) == 0);
    step_cost_add(&e, 8, 0.020);
    step_cost_add(&e, 40, 0.060);
    assert_true(step_cost_sec(&e, 8) == 0.020 && step_cost_sec(&e, 2) == 0.020);
    assert_true(step_cost_sec(&e, 24) > 0.0399 && step_cost_sec(&e, 24) < 0.0401);
    assert_true(step_cost_sec(&e, 64) == 0.060);
    struct step_cost d = {0};
    step_cost_add(&d, 8, 0.010); /* the cheapest step is 8 rows; 1 row measured slower */
    step_cost_add(&d, 1, 0.020);
    assert_int_equal(step_cost_budget(&d), 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimistic_and_baseline),
        cmocka_unit_test(test_knee),
        cmocka_unit_test(test_expiry_and_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
