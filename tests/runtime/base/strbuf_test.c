/* runtime/base/strbuf: appends of every kind keep a NUL-terminated string, growth over many
 * pieces keeps every byte, and a failure sticks (later appends change nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/strbuf.h"

static void test_appends(void **state) {
    (void)state;
    struct strbuf b = {0};
    strbuf_put(&b, "", 0); /* the empty string is still a string */
    assert_non_null(b.s);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.s, "");
    strbuf_puts(&b, "shape");
    strbuf_printf(&b, "[%d,%lld]", 4096, (long long)151936);
    strbuf_put(&b, "a\0b", 3); /* bytes, NULs included */
    assert_int_equal(b.len, 5 + 13 + 3);
    assert_memory_equal(b.s, "shape[4096,151936]a\0b", b.len + 1);
    assert_false(b.failed);
    strbuf_free(&b);
    assert_null(b.s);
    assert_int_equal(b.len, 0);
}

static void test_growth(void **state) {
    (void)state;
    struct strbuf b = {0};
    char want[8];
    for (int i = 0; i < 20000; ++i)
        strbuf_printf(&b, "%04d,", i % 10000);
    assert_false(b.failed);
    assert_int_equal(b.len, 20000 * 5);
    for (int i = 0; i < 20000; i += 997) {
        snprintf(want, sizeof want, "%04d,", i % 10000);
        assert_memory_equal(b.s + (size_t)i * 5, want, 5);
    }
    assert_int_equal(b.s[b.len], '\0');
    strbuf_free(&b);
}

/* A rendering longer than the spare room is formatted again after the growth, whole. */
static void test_long_printf(void **state) {
    (void)state;
    struct strbuf b = {0};
    char big[3001];
    for (int i = 0; i < 3000; ++i)
        big[i] = (char)('a' + i % 26);
    big[3000] = '\0';
    strbuf_printf(&b, "<%s>", "x");
    strbuf_printf(&b, "[%s|%d]", big, 42);
    assert_false(b.failed);
    assert_int_equal(b.len, 3 + 3000 + 5);
    assert_memory_equal(b.s, "<x>[", 4);
    assert_memory_equal(b.s + 4, big, 3000);
    assert_string_equal(b.s + 3004, "|42]");
    strbuf_free(&b);
}

static void test_failure_sticks(void **state) {
    (void)state;
    struct strbuf b = {0};
    strbuf_puts(&b, "kept");
    strbuf_put(&b, "x", SIZE_MAX - 2); /* more than any memory: fails without touching b.s */
    assert_true(b.failed);
    assert_string_equal(b.s, "kept");
    strbuf_puts(&b, "more");
    strbuf_printf(&b, "%d", 7);
    assert_int_equal(b.len, 4);
    assert_string_equal(b.s, "kept");
    strbuf_free(&b);
    assert_false(b.failed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_long_printf),
        cmocka_unit_test(test_failure_sticks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
