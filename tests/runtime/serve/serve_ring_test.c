/* serve_ring's address parsing: the `next` a stage reports, split for a probe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/serve/serve_ring.h"

static void addresses(void **state) {
    char host[64];
    int port = 0;
    (void)state;
    assert_int_equal(serve_ring_parse_address("127.0.0.1:7001", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7001);
    assert_int_equal(serve_ring_parse_address("stage-2.example:65535", host, sizeof host, &port),
                     0);
    assert_string_equal(host, "stage-2.example");
    assert_int_equal(port, 65535);
    assert_int_equal(serve_ring_parse_address("[::1]:80", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 80);
    /* What a stage whose link is down reports, and what no stage reports. */
    const char *bad[] = {
        "", ":7001", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:70x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(serve_ring_parse_address(bad[i], host, sizeof host, &port), STRATA_EINVAL);
    assert_int_equal(serve_ring_parse_address(NULL, host, sizeof host, &port), STRATA_EINVAL);
    char small[4];
    assert_int_equal(serve_ring_parse_address("10.0.0.1:1", small, sizeof small, &port),
                     STRATA_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(addresses)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
