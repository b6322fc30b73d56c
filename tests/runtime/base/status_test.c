/* The error idiom: codes come back unchanged and messages are per thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"

static void set_error_returns_code_and_keeps_message(void **state) {
    (void)state;
    assert_int_equal(strata_set_error(STRATA_ENOTFOUND, "tensor %s missing", "x.weight"),
                     STRATA_ENOTFOUND);
    assert_string_equal(strata_last_error(), "tensor x.weight missing");
    assert_string_equal(strata_status_name(STRATA_ENOTFOUND), "ENOTFOUND");
    assert_string_equal(strata_status_name(12345), "EUNKNOWN");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(set_error_returns_code_and_keeps_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
