/* cli helpers: integers (and id lists) are all-or-nothing and range-checked with a message
 * naming the range and the text; files read whole or fail with ENOTFOUND; port files round-trip;
 * the clock never goes back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

static void good_ints_parse(void **state) {
    int v = -1;
    (void)state;
    assert_int_equal(cli_parse_int("42", 1, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(cli_parse_int("-7", -10, 10, &v), 0);
    assert_int_equal(v, -7);
    assert_int_equal(cli_parse_int("1", 1, 1, &v), 0); /* both ends are inclusive */
    assert_int_equal(v, 1);
    assert_int_equal(cli_parse_int("2147483647", 0, 2147483647L, &v), 0);
    assert_int_equal(v, 2147483647);
}

static void bad_ints_are_refused_with_a_message(void **state) {
    static const char *bad[] = {"", "12x", "x12", " ", "1.5", "99999999999999999999999"};
    int v = 5;
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cli_parse_int(bad[i], 0, 1000, &v), STRATA_EINVAL);
        assert_int_equal(v, 5); /* untouched */
    }
    assert_int_equal(cli_parse_int("0", 1, 64, &v), STRATA_EINVAL);
    assert_string_equal(strata_last_error(), "needs an integer in [1, 64], got \"0\"");
    assert_int_equal(cli_parse_int("65", 1, 64, &v), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "\"65\""));
    /* A range wider than int still refuses what an int cannot hold. */
    assert_int_equal(cli_parse_int("4294967296", 0, 1L << 40, &v), STRATA_EINVAL);
    assert_int_equal(v, 5);
}

static void tmp_path(char *out, size_t cap, const char *name) {
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(out, cap, "%s/cli_test.%d.%s", tmp ? tmp : "/tmp", (int)getpid(), name);
}

/* Id lists: comma-separated, each in range, at most cap; a trailing comma is allowed (as the
 * clients have always taken it), empty text is no ids, anything else is EINVAL. */
static void id_lists_parse_or_are_refused(void **state) {
    int32_t ids[4] = {-1, -1, -1, -1};
    (void)state;
    assert_int_equal(cli_parse_ids(ids, 4, "1,22,333", 0, 1000), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 22);
    assert_int_equal(ids[2], 333);
    assert_int_equal(cli_parse_ids(ids, 4, "7,", 0, 1000), 1);
    assert_int_equal(ids[0], 7);
    assert_int_equal(cli_parse_ids(ids, 4, "", 0, 1000), 0);
    assert_int_equal(cli_parse_ids(ids, 4, "2147483647", 0, INT32_MAX), 1);
    assert_int_equal(ids[0], INT32_MAX);
    static const char *bad[] = {
        "1,,2", "1;2", "x", "1,x", "-1", "1001", ",", "1,2,3,4,5", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(cli_parse_ids(ids, 4, bad[i], 0, 1000), STRATA_EINVAL);
    assert_int_equal(cli_parse_ids(ids, 4, "5,1001", 0, 1000), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "[0, 1000]"));
    assert_non_null(strstr(strata_last_error(), "\"5,1001\""));
    assert_int_equal(cli_parse_ids(ids, 4, "2147483648", 0, 4294967296L), STRATA_EINVAL);
}

static void read_file_missing_and_real(void **state) {
    char path[1024], *data = (char *)1;
    size_t len = 99;
    (void)state;
    tmp_path(path, sizeof path, "missing");
    unlink(path);
    assert_int_equal(cli_read_file(&data, &len, path), STRATA_ENOTFOUND);
    assert_null(data);
    assert_non_null(strstr(strata_last_error(), path));

    tmp_path(path, sizeof path, "real");
    assert_int_equal(cli_write_file_atomic(path, "hello\0world", 11), 0);
    assert_int_equal(cli_read_file(&data, &len, path), 0);
    assert_int_equal(len, 11);
    assert_memory_equal(data, "hello\0world", 11);
    assert_int_equal(data[11], '\0'); /* NUL-terminated for text parsers */
    free(data);

    assert_int_equal(cli_write_file_atomic(path, "", 0), 0); /* empty file */
    assert_int_equal(cli_read_file(&data, &len, path), 0);
    assert_int_equal(len, 0);
    assert_string_equal(data, "");
    free(data);
    unlink(path);
}

static void port_file_round_trip(void **state) {
    char path[1024];
    int port = 0;
    FILE *f;
    (void)state;
    tmp_path(path, sizeof path, "port");
    unlink(path);
    assert_int_equal(cli_read_port_file(path, &port), STRATA_ENOTFOUND);
    assert_int_equal(cli_write_port_file(path, 43210), 0);
    assert_int_equal(cli_read_port_file(path, &port), 0);
    assert_int_equal(port, 43210);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("not a port\n", f);
    fclose(f);
    port = 7;
    assert_int_equal(cli_read_port_file(path, &port), STRATA_EFORMAT);
    assert_int_equal(port, 7);
    unlink(path);
}

static void clock_is_monotonic(void **state) {
    int64_t prev = cli_now_ns();
    double prev_s = cli_now_sec();
    (void)state;
    for (int i = 0; i < 1000; i++) {
        int64_t t = cli_now_ns();
        double s = cli_now_sec();
        assert_true(t >= prev);
        assert_true(s >= prev_s);
        prev = t;
        prev_s = s;
    }
    usleep(2000);
    assert_true(cli_now_ns() - prev >= 1000000); /* 2 ms slept: at least 1 ms passed */
}

/* Every binary and backend names devices through cli_parse_device. */
static void devices_parse_or_are_refused(void **state) {
    (void)state;
    struct cli_device d;
    static const struct {
        const char *text;
        int kind, index;
    } good[] = {{NULL, CLI_DEVICE_CPU, 0},      {"cpu", CLI_DEVICE_CPU, 0},
                {"cuda", CLI_DEVICE_CUDA, 0},   {"cuda:0", CLI_DEVICE_CUDA, 0},
                {"cuda:7", CLI_DEVICE_CUDA, 7}, {"cuda:999", CLI_DEVICE_CUDA, 999}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(cli_parse_device(good[i].text, &d), 0);
        assert_int_equal(d.kind, good[i].kind);
        assert_int_equal(d.index, good[i].index);
    }
    static const char *bad[] = {"",        "gpu",     "CPU",   "cuda:", "cuda:x", "cuda:1000",
                                "cuda:-1", "cuda:1x", "cuda0", "cudaa", "cpu:0",  "cuda: 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cli_parse_device(bad[i], &d), STRATA_EINVAL);
        assert_non_null(strstr(strata_last_error(), "unknown device"));
        assert_false(cli_device_is_cuda(bad[i]));
    }
    assert_true(cli_device_is_cuda("cuda:3"));
    assert_false(cli_device_is_cuda("cpu"));
    assert_false(cli_device_is_cuda(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_ints_parse),
        cmocka_unit_test(bad_ints_are_refused_with_a_message),
        cmocka_unit_test(id_lists_parse_or_are_refused),
        cmocka_unit_test(read_file_missing_and_real),
        cmocka_unit_test(port_file_round_trip),
        cmocka_unit_test(clock_is_monotonic),
        cmocka_unit_test(devices_parse_or_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
