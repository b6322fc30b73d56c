/* The simulated link: serialisation + latency arithmetic, queueing behind a busy line,
 * in-order delivery under jitter, seeded determinism, loss with backoff, partitions that
 * make a peer unreachable, and closed links. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "sim/link.h"

static void latency_plus_serialisation(void **state) {
    (void)state;
    struct sim_link_params p;
    sim_link_params_default(&p);
    p.latency_ns = 50000;
    p.bandwidth_gbps = 8.0; /* 1 byte per ns */
    struct sim_link link;
    assert_int_equal(sim_link_init(&link, &p, 1), 0);
    int64_t arrival;
    assert_int_equal(sim_link_send(&link, &arrival, 1000, 4000), 0);
    assert_int_equal(arrival, 1000 + 4000 + 50000);
    /* A second frame sent while the line is still busy waits for it. */
    assert_int_equal(sim_link_send(&link, &arrival, 2000, 1000), 0);
    assert_int_equal(arrival, 5000 + 1000 + 50000);
    /* Once the line is idle, a frame starts at its send time. */
    assert_int_equal(sim_link_send(&link, &arrival, 100000, 8), 0);
    assert_int_equal(arrival, 100000 + 8 + 50000);
    assert_int_equal(link.frames, 3);
    assert_int_equal(link.bytes, 5008);
    assert_int_equal(link.busy_ns, 5008);
    assert_int_equal(sim_link_serialisation_ns(&p, 3), 3);
    p.bandwidth_gbps = 0.0;
    assert_int_equal(sim_link_serialisation_ns(&p, 1 << 20), 0);
}

static void jitter_is_bounded_in_order_and_seeded(void **state) {
    (void)state;
    struct sim_link_params p;
    sim_link_params_default(&p);
    p.latency_ns = 1000;
    p.jitter_ns = 500;
    struct sim_link a, b, c;
    assert_int_equal(sim_link_init(&a, &p, 42), 0);
    assert_int_equal(sim_link_init(&b, &p, 42), 0);
    assert_int_equal(sim_link_init(&c, &p, 43), 0);
    int64_t prev = 0;
    int differs = 0, varied = 0;
    int64_t first_delay = -1;
    for (int i = 0; i < 200; i++) {
        int64_t now = (int64_t)i * 10000, ta, tb, tc;
        assert_int_equal(sim_link_send(&a, &ta, now, 100), 0);
        assert_int_equal(sim_link_send(&b, &tb, now, 100), 0);
        assert_int_equal(sim_link_send(&c, &tc, now, 100), 0);
        assert_int_equal(ta, tb);
        differs |= ta != tc;
        assert_true(ta - now >= 1000 && ta - now <= 1500);
        assert_true(ta >= prev);
        prev = ta;
        if (first_delay < 0) first_delay = ta - now;
        varied |= (ta - now) != first_delay;
    }
    assert_true(differs);
    assert_true(varied);
    /* Frames sent back to back: jitter may not reorder them. */
    prev = 0;
    for (int i = 0; i < 100; i++) {
        int64_t t;
        assert_int_equal(sim_link_send(&a, &t, 3000000 + i, 10), 0);
        assert_true(t >= prev);
        prev = t;
    }
}

static void loss_retransmits_with_backoff(void **state) {
    (void)state;
    struct sim_link_params p;
    sim_link_params_default(&p);
    p.latency_ns = 100;
    p.loss = 0.5;
    p.retransmit_timeout_ns = 1000;
    p.max_retransmits = 30;
    struct sim_link link;
    assert_int_equal(sim_link_init(&link, &p, 7), 0);
    int64_t now = 0;
    for (int i = 0; i < 400; i++) {
        int64_t t;
        assert_int_equal(sim_link_send(&link, &t, now, 10), 0);
        int64_t delay = t - now;
        /* delay = latency + sum of backoffs 1000 * (2^k - 1) for k retries. */
        int64_t extra = delay - 100;
        assert_true(extra >= 0);
        assert_int_equal(extra % 1000, 0);
        int64_t units = extra / 1000 + 1;
        assert_int_equal(units & (units - 1), 0); /* a power of two */
        now = t + 1;
    }
    /* Half the attempts are lost: about 400 retries for 400 frames. */
    assert_true(link.retransmits > 300 && link.retransmits < 500);
}

static void partition_makes_peer_unreachable_then_heals(void **state) {
    (void)state;
    struct sim_link_params p;
    sim_link_params_default(&p);
    p.latency_ns = 100;
    p.retransmit_timeout_ns = 1000;
    p.max_retransmits = 3;
    struct sim_link link;
    assert_int_equal(sim_link_init(&link, &p, 9), 0);
    sim_link_partition(&link, 5000, 5000 + 2500);
    int64_t t;
    /* Sent at 5000: lost at 5000, 6000; retried at 8000 (after the partition ends). */
    assert_int_equal(sim_link_send(&link, &t, 5000, 0), 0);
    assert_int_equal(t, 8000 + 100);
    assert_int_equal(link.retransmits, 2);

    sim_link_partition(&link, 20000, INT64_MAX);
    int rc = sim_link_send(&link, &t, 20000, 0);
    assert_int_equal(rc, STRATA_ETIMEOUT);
    assert_non_null(strstr(strata_last_error(), "unreachable"));
    /* Attempts at 20000, 21000, 23000, 27000; gives up one backoff (8000) later. */
    assert_int_equal(t, 35000);
}

static void closed_link_refuses_sends(void **state) {
    (void)state;
    struct sim_link_params p;
    sim_link_params_default(&p);
    struct sim_link link;
    assert_int_equal(sim_link_init(&link, &p, 1), 0);
    sim_link_close(&link, 1000);
    int64_t t;
    assert_int_equal(sim_link_send(&link, &t, 999, 10), 0);
    assert_int_equal(sim_link_send(&link, &t, 1000, 10), STRATA_ECLOSED);
    assert_int_equal(t, 1000);
    assert_non_null(strstr(strata_last_error(), "closed"));
}

static void bad_parameters_are_named(void **state) {
    (void)state;
    struct sim_link_params p;
    struct sim_link link;
    sim_link_params_default(&p);
    p.loss = 1.5;
    assert_int_equal(sim_link_init(&link, &p, 1), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "loss"));
    sim_link_params_default(&p);
    p.latency_ns = -1;
    assert_int_equal(sim_link_init(&link, &p, 1), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "latency"));
    sim_link_params_default(&p);
    p.retransmit_timeout_ns = 0;
    assert_int_equal(sim_link_init(&link, &p, 1), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "retransmit"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(latency_plus_serialisation),
        cmocka_unit_test(jitter_is_bounded_in_order_and_seeded),
        cmocka_unit_test(loss_retransmits_with_backoff),
        cmocka_unit_test(partition_makes_peer_unreachable_then_heals),
        cmocka_unit_test(closed_link_refuses_sends),
        cmocka_unit_test(bad_parameters_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
