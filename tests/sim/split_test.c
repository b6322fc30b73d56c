/* Layer splits: even splits, seeded random splits (valid, varied, repeatable), and the
 * text form round trip with clear errors for malformed or impossible splits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "sim/split.h"

static void even_split_gives_extra_layers_first(void **state) {
    (void)state;
    struct sim_split split;
    char text[128];
    assert_int_equal(sim_split_even(&split, 7, 3), 0);
    sim_split_format(&split, text, sizeof text);
    assert_string_equal(text, "0-3|3-5|5-7");
    assert_int_equal(sim_split_even(&split, 4, 1), 0);
    sim_split_format(&split, text, sizeof text);
    assert_string_equal(text, "0-4");
    assert_int_equal(sim_split_even(&split, 4, 5), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "5 stages for 4 layers"));
    assert_int_equal(sim_split_even(&split, 4, 0), STRATA_ERANGE);
}

static void random_splits_are_valid_varied_and_seeded(void **state) {
    (void)state;
    uint64_t rng_a = 99, rng_b = 99;
    int seen_first_cut[8] = {0};
    for (int i = 0; i < 300; i++) {
        struct sim_split a, b;
        assert_int_equal(sim_split_random(&a, 8, 3, &rng_a), 0);
        assert_int_equal(sim_split_random(&b, 8, 3, &rng_b), 0);
        assert_true(sim_split_equal(&a, &b));
        assert_int_equal(sim_split_check(&a), 0);
        assert_int_equal(a.num_stages, 3);
        seen_first_cut[a.bounds[1]]++;
    }
    /* The first cut of 3 stages over 8 layers can be 1 .. 6; all should occur. */
    for (int cut = 1; cut <= 6; cut++)
        assert_true(seen_first_cut[cut] > 0);
    /* S == L has exactly one split. */
    struct sim_split full;
    assert_int_equal(sim_split_random(&full, 5, 5, &rng_a), 0);
    for (int s = 0; s <= 5; s++)
        assert_int_equal(full.bounds[s], s);
}

static void parse_and_format_round_trip(void **state) {
    (void)state;
    struct sim_split a, b;
    char text[128];
    assert_int_equal(sim_split_parse(&a, "0-1|1-3|3-6", 6), 0);
    assert_int_equal(a.num_stages, 3);
    sim_split_format(&a, text, sizeof text);
    assert_string_equal(text, "0-1|1-3|3-6");
    assert_int_equal(sim_split_parse(&b, "1,3", 6), 0);
    assert_true(sim_split_equal(&a, &b));
    assert_int_equal(sim_split_parse(&b, "", 6), 0);
    assert_int_equal(b.num_stages, 1);
    assert_int_equal(b.bounds[1], 6);
}

static void parse_rejects_bad_splits(void **state) {
    (void)state;
    struct sim_split s;
    assert_int_equal(sim_split_parse(&s, "0-2|3-6", 6), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "does not start"));
    assert_int_equal(sim_split_parse(&s, "0-2|2-5", 6), STRATA_ERANGE);
    assert_int_equal(sim_split_parse(&s, "3,2", 6), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "empty or reversed"));
    assert_int_equal(sim_split_parse(&s, "2,x", 6), STRATA_EINVAL);
    assert_int_equal(sim_split_parse(&s, "0-6", 6), 0);
    assert_int_equal(sim_split_parse(&s, "6", 6), STRATA_ERANGE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(even_split_gives_extra_layers_first),
        cmocka_unit_test(random_splits_are_valid_varied_and_seeded),
        cmocka_unit_test(parse_and_format_round_trip),
        cmocka_unit_test(parse_rejects_bad_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
