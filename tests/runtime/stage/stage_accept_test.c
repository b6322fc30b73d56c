/* The per-address accounting of the accept path (runtime/stage/stage_accept.h): one entry
 * per source address whatever the port, a token bucket of failed handshakes (a burst, then
 * a steady rate), and entries recycled stalest-first but never while a handshake from
 * that address is in progress. The acceptor itself is exercised against attacks in
 * stage_server_test (in process) and tests/pipeline/pipeline_attack_test.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/stage/stage_accept.h"

static void test_one_entry_per_address(void **state) {
    struct stage_addr_table t;
    (void)state;
    assert_int_equal(stage_addr_table_init(&t, 4, 3, 1.0), 0);
    struct stage_addr_entry *a = stage_addr_lookup(&t, "127.0.0.2:4000", 0);
    assert_non_null(a);
    assert_string_equal(a->addr, "127.0.0.2");
    assert_ptr_equal(stage_addr_lookup(&t, "127.0.0.2:4001", 5), a);
    assert_ptr_not_equal(stage_addr_lookup(&t, "127.0.0.3:4000", 5), a);
    /* IPv6 peers are "addr:port" without brackets: the last colon is the port's. */
    struct stage_addr_entry *v6 = stage_addr_lookup(&t, "::1:5000", 6);
    assert_string_equal(v6->addr, "::1");
    assert_ptr_equal(stage_addr_lookup(&t, "::1:5001", 7), v6);
    stage_addr_table_free(&t);
}

static void test_failures_burst_then_rate(void **state) {
    struct stage_addr_table t;
    (void)state;
    assert_int_equal(stage_addr_table_init(&t, 4, 3, 2.0), 0); /* burst 3, 2 per second */
    struct stage_addr_entry *e = stage_addr_lookup(&t, "10.0.0.1:1", 1000);
    for (int i = 0; i < 3; i++) {
        assert_true(stage_addr_allowed(&t, e, 1000));
        stage_addr_failed(&t, e, 1000);
    }
    assert_false(stage_addr_allowed(&t, e, 1000));
    assert_false(stage_addr_allowed(&t, e, 1400)); /* 0.8 of a token */
    assert_true(stage_addr_allowed(&t, e, 1500));  /* one back after 500 ms */
    stage_addr_failed(&t, e, 1500);
    assert_false(stage_addr_allowed(&t, e, 1500));
    assert_true(e->failed == 4);
    /* The bucket refills to the burst, not beyond. */
    assert_true(stage_addr_allowed(&t, e, 100000));
    for (int i = 0; i < 3; i++)
        stage_addr_failed(&t, e, 100000);
    assert_false(stage_addr_allowed(&t, e, 100000));
    /* Another address has its own bucket. */
    assert_true(stage_addr_allowed(&t, stage_addr_lookup(&t, "10.0.0.2:1", 100000), 100000));
    stage_addr_table_free(&t);
}

static void test_recycling_spares_busy_entries(void **state) {
    struct stage_addr_table t;
    char peer[32];
    (void)state;
    assert_int_equal(stage_addr_table_init(&t, 2, 3, 1.0), 0);
    struct stage_addr_entry *busy = stage_addr_lookup(&t, "10.0.0.1:1", 1);
    busy->handshaking = 1;
    struct stage_addr_entry *idle = stage_addr_lookup(&t, "10.0.0.2:1", 2);
    stage_addr_failed(&t, idle, 2);
    /* A third address takes the idle entry (fresh bucket), never the busy one. */
    struct stage_addr_entry *third = stage_addr_lookup(&t, "10.0.0.3:1", 3);
    assert_ptr_equal(third, idle);
    assert_string_equal(third->addr, "10.0.0.3");
    assert_true(third->failed == 0);
    assert_string_equal(busy->addr, "10.0.0.1");
    /* With every entry busy there is none to give. */
    third->handshaking = 1;
    snprintf(peer, sizeof peer, "10.0.0.4:1");
    assert_null(stage_addr_lookup(&t, peer, 4));
    stage_addr_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_entry_per_address),
        cmocka_unit_test(test_failures_burst_then_rate),
        cmocka_unit_test(test_recycling_spares_busy_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
