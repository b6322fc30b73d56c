/* cpu_pin: lists parse as taskset writes them and format back folded; malformed ones are
 * refused naming the text; pinning takes only CPUs this process may use, refuses more threads
 * than CPUs, and once applied is what sched_getaffinity reports (here and in threads started
 * later). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/cpu_pin.h"
#include "runtime/base/status.h"

static void lists_parse_and_format_folded(void **state) {
    static const struct {
        const char *text, *formatted;
        int count;
    } cases[] = {{"0", "0", 1},         {"3", "3", 1},         {"0-3", "0-3", 4},
                 {"0,2,4", "0,2,4", 3}, {"4,0,2", "0,2,4", 3}, {"0-3,8,10-11", "0-3,8,10-11", 7},
                 {"1,0,2-3", "0-3", 4}, {"2-2", "2", 1},       {"1,1,1-2", "1-2", 2},
                 {"1023", "1023", 1}};
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cpu_pin p;
        char buf[64];
        assert_int_equal(cpu_pin_parse(cases[i].text, &p), 0);
        assert_int_equal(p.count, cases[i].count);
        cpu_pin_format(&p, buf, sizeof buf);
        assert_string_equal(buf, cases[i].formatted);
    }
}

static void malformed_lists_are_refused(void **state) {
    static const char *bad[] = {"",    ",",   "1,",  ",1", "1,,2",  "3-1",  "-1",          "1-",
                                "a",   "1a",  " 1",  "1 ", "1-2-3", "1024", "99999999999", "+1",
                                "0x1", "1;2", "1..3"};
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cpu_pin p = {.count = -7};
        assert_int_equal(cpu_pin_parse(bad[i], &p), STRATA_EINVAL);
        assert_int_equal(p.count, -7); /* untouched */
        char want[64];
        snprintf(want, sizeof want, "got \"%s\"", bad[i]);
        assert_non_null(strstr(strata_last_error(), want));
    }
}

static void format_truncates_to_fit(void **state) {
    struct cpu_pin p;
    char buf[6];
    (void)state;
    assert_int_equal(cpu_pin_parse("0,2,4,6,8,10", &p), 0);
    cpu_pin_format(&p, buf, sizeof buf);
    assert_true(strlen(buf) < sizeof buf);
    assert_int_equal(strncmp(buf, "0,2,4", strlen(buf)), 0);
}

static void *report_cpus(void *arg) {
    cpu_pin_current(arg);
    return NULL;
}

/* Pins to the first CPU this process may use, which a later thread inherits; then widens back
 * to the whole set (a pinned process is not bound by its own mask). */
static void pinning_applies_to_later_threads(void **state) {
    struct cpu_pin all, one, seen, in_thread;
    char list[256], first[16];
    pthread_t t;
    (void)state;
    assert_int_equal(cpu_pin_current(&all), 0);
    assert_true(all.count >= 1);
    cpu_pin_format(&all, list, sizeof list);
    int c0 = 0;
    while (!CPU_ISSET(c0, &all.set))
        c0++;
    snprintf(first, sizeof first, "%d", c0);
    assert_int_equal(cpu_pin_parse(first, &one), 0);
    assert_int_equal(cpu_pin_apply(&one, 2), STRATA_EINVAL); /* 2 threads, 1 CPU */
    assert_non_null(strstr(strata_last_error(), "2 threads on 1 CPU(s)"));
    assert_int_equal(cpu_pin_current(&seen), 0);
    assert_true(CPU_EQUAL(&seen.set, &all.set)); /* nothing changed */
    assert_int_equal(cpu_pin_apply(&one, 1), 0);
    assert_int_equal(cpu_pin_current(&seen), 0);
    assert_int_equal(seen.count, 1);
    assert_true(CPU_ISSET(c0, &seen.set));
    assert_int_equal(pthread_create(&t, NULL, report_cpus, &in_thread), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(in_thread.count, 1);
    assert_true(CPU_ISSET(c0, &in_thread.set));
    assert_int_equal(cpu_pin_apply(&all, all.count), 0);
    assert_int_equal(cpu_pin_current(&seen), 0);
    assert_true(CPU_EQUAL(&seen.set, &all.set));
}

/* A CPU outside the process's set (the highest id it may not use) is refused naming it and
 * the CPUs it may use, and nothing changes. */
static void cpus_outside_the_process_are_refused(void **state) {
    struct cpu_pin all, other;
    char text[16], want[48], list[256];
    (void)state;
    assert_int_equal(cpu_pin_current(&all), 0);
    int c = CPU_SETSIZE - 1;
    while (c >= 0 && CPU_ISSET(c, &all.set))
        c--;
    if (c < 0) skip(); /* every id allowed: nothing to refuse */
    snprintf(text, sizeof text, "%d", c);
    assert_int_equal(cpu_pin_parse(text, &other), 0);
    assert_int_equal(cpu_pin_apply(&other, 1), STRATA_EINVAL);
    snprintf(want, sizeof want, "CPU %d is not one this process may run on", c);
    assert_non_null(strstr(strata_last_error(), want));
    cpu_pin_format(&all, list, sizeof list);
    assert_non_null(strstr(strata_last_error(), list));
    struct cpu_pin seen;
    assert_int_equal(cpu_pin_current(&seen), 0);
    assert_true(CPU_EQUAL(&seen.set, &all.set));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lists_parse_and_format_folded),
        cmocka_unit_test(malformed_lists_are_refused),
        cmocka_unit_test(format_truncates_to_fit),
        cmocka_unit_test(pinning_applies_to_later_threads),
        cmocka_unit_test(cpus_outside_the_process_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
