/* runtime/base/progress_printer.c on a fake clock (progress_printer_step): by default a load
 * under 2 s leaves no line at all and a longer one starts reporting at 2 s, at most one line
 * per 0.5 s plus 100% and the final "done" line; STRATA_PROGRESS=1 reports from the start,
 * =0 never; the lines read as the README shows them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/progress_printer.h"

/* Runs `n` reports of an even load of `total` bytes over `seconds` into a temporary file and
 * returns what was printed (static buffer). */
static const char *run(enum progress_mode mode, int n, double seconds, uint64_t total) {
    static char text[4096];
    FILE *f = tmpfile();
    assert_non_null(f);
    struct progress_printer p;
    progress_printer_init(&p, f, "loading weights", mode);
    p.is_tty = 0; /* a log file, whatever the test runner's stderr is */
    p.t_start = 100.0;
    for (int i = 0; i <= n; ++i)
        progress_printer_step(&p, 100.0 + seconds * i / n, total * (uint64_t)i / (uint64_t)n, total,
                              i < n / 2 ? "reading tensors" : "copying to huge pages");
    progress_printer_step(&p, 100.0 + seconds, total, total, "copying to huge pages");
    long len = ftell(f);
    rewind(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = 0;
    fclose(f);
    assert_int_equal((long)got, len);
    return text;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; ++s)
        n += *s == '\n';
    return n;
}

static void test_short_load_is_silent(void **state) {
    (void)state;
    assert_string_equal(run(PROGRESS_AUTO, 400, 1.9, 500000), "");
    assert_string_equal(run(PROGRESS_NEVER, 400, 60.0, 16000000000ull), "");
}

static void test_long_load_reports_from_2s_every_half_second(void **state) {
    (void)state;
    /* 10 s, a report every 25 ms: lines at 2.0 (or just after), 2.5, ..., 9.5 s, then 100%
     * and done. */
    const char *out = run(PROGRESS_AUTO, 400, 10.0, 16000000000ull);
    const int lines = count_lines(out); /* 16 +- one of rounding at the half seconds */
    assert_in_range(lines, 15 + 2, 17 + 2);
    assert_non_null(strstr(out, "loading weights: 20% (3.2 / 16.0 GB) 2.0 s, reading tensors\n"));
    assert_null(strstr(out, " 1.9 s"));
    assert_non_null(strstr(out, "loading weights: 100% (16.0 / 16.0 GB) 10.0 s, copying to huge "
                                "pages\nloading weights: done, 16.0 GB in 10.0 s (1.60 GB/s)\n"));
}

static void test_forced_reports_from_the_start(void **state) {
    (void)state;
    const char *out = run(PROGRESS_ALWAYS, 10, 0.01, 500000);
    assert_int_equal(count_lines(out), 3); /* the first report, 100%, done */
    assert_non_null(strstr(out, "loading weights: 0% (0.0 / 0.5 MB) 0.0 s, reading tensors\n"));
    assert_non_null(strstr(out, "loading weights: done, 0.5 MB in 0.0 s"));
}

static void test_mode_from_env(void **state) {
    (void)state;
    setenv("PROGRESS_TEST_MODE", "1", 1);
    assert_int_equal(progress_mode_from_env("PROGRESS_TEST_MODE"), PROGRESS_ALWAYS);
    setenv("PROGRESS_TEST_MODE", "0", 1);
    assert_int_equal(progress_mode_from_env("PROGRESS_TEST_MODE"), PROGRESS_NEVER);
    unsetenv("PROGRESS_TEST_MODE");
    assert_int_equal(progress_mode_from_env("PROGRESS_TEST_MODE"), PROGRESS_AUTO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_load_is_silent),
        cmocka_unit_test(test_long_load_reports_from_2s_every_half_second),
        cmocka_unit_test(test_forced_reports_from_the_start),
        cmocka_unit_test(test_mode_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
