/* wire/link_probe.h's fit: bandwidth from the medians' slope, latency from the smallest frame's
 * mean less its bytes; where larger frames were no slower, the largest frame's bytes over its
 * median time (a hosts file refuses "gbps": 0). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wire/link_probe.h"

static struct wire_probe_result points(const double *bytes, const double *mean, const double *p50,
                                       int n) {
    struct wire_probe_result r = {.n = n};
    for (int i = 0; i < n; i++)
        r.pt[i] = (struct wire_probe_point){1, bytes[i], mean[i], p50[i], p50[i], 100};
    return r;
}

/* 1 GB/s and 50 us: the medians on a line, the small frame's mean 10 us over its median. */
static void test_slope(void **state) {
    (void)state;
    const double bytes[] = {1000, 100000, 1000000}, p50[] = {51, 150, 1050},
                 mean[] = {61, 160, 1060};
    struct wire_probe_result r = points(bytes, mean, p50, 3);
    wire_probe_fit(&r);
    assert_true(fabs(r.gbps - 1.0) < 1e-9);
    assert_true(fabs(r.latency_us - 60.0) < 1e-9);
}

/* Larger frames faster at the median (loopback's wake-ups): the largest frame's rate. */
static void test_flat(void **state) {
    (void)state;
    const double bytes[] = {448, 2240, 16576, 65728}, p50[] = {10.5, 15.2, 4.9, 9.6},
                 mean[] = {11.5, 14.9, 6.4, 11.5};
    struct wire_probe_result r = points(bytes, mean, p50, 4);
    wire_probe_fit(&r);
    assert_true(fabs(r.gbps - 65728 / 9.6 * 1e-3) < 1e-9); /* 6.85 GB/s */
    assert_true(r.latency_us > 11.4 && r.latency_us < 11.5);
}

/* Row lists: 0 (the token-sized frame) to 65536 rows, 2 to WIRE_PROBE_MAX_SIZES sizes. */
static void test_parse_rows(void **state) {
    (void)state;
    int rows[WIRE_PROBE_MAX_SIZES], n = 0;
    assert_int_equal(wire_probe_parse_rows("0,1,64", rows, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0], 0);
    assert_int_equal(rows[2], 64);
    static const char *const bad[] = {"1", "-1,4", "1,65537", "1,,x", "1,2,3,4,5,6,7,8,9", "a,1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(wire_probe_parse_rows(bad[i], rows, &n), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slope),
        cmocka_unit_test(test_flat),
        cmocka_unit_test(test_parse_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
