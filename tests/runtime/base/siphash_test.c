/* SipHash-2-4 against the reference vectors (key 00 01 .. 0f, message 00 01 .. len-1; the
 * paper's appendix for 15 bytes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/base/siphash.h"

static void test_reference_vectors(void **state) {
    (void)state;
    const uint64_t key[2] = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
    unsigned char msg[64];
    for (int i = 0; i < 64; ++i)
        msg[i] = (unsigned char)i;
    assert_true(strata_siphash(key, msg, 0) == 0x726fdb47dd0e0e31ull);
    assert_true(strata_siphash(key, msg, 1) == 0x74f839c593dc67fdull);
    assert_true(strata_siphash(key, msg, 15) == 0xa129ca6149be45e5ull);
    assert_true(strata_siphash(key, msg, 63) == 0x958a324ceb064572ull);
    /* Another key, another hash. */
    const uint64_t other[2] = {key[0] ^ 1, key[1]};
    assert_true(strata_siphash(other, msg, 15) != 0xa129ca6149be45e5ull);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reference_vectors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
