/* The logger: the "[prefix secs.ms] level: message" format stage logs are grepped by,
 * level filtering, and whole lines when two threads log at once. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/log.h"

/* Runs `fn` with stderr redirected to a temp file and returns what it wrote (malloc'ed). */
static char *capture_stderr(void (*fn)(void)) {
    FILE *tmp = tmpfile();
    int saved = dup(2);
    long n;
    char *text;
    assert_non_null(tmp);
    fflush(stderr);
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = ftell(tmp);
    text = calloc(1, (size_t)n + 1);
    rewind(tmp);
    assert_int_equal(fread(text, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return text;
}

static void log_some(void) {
    strata_log_setup("stage 2", STRATA_LOG_WARN);
    strata_log(STRATA_LOG_WARN, "refused connection from %s: %s", "1.2.3.4:5", "wrong key");
    strata_log(STRATA_LOG_INFO, "not shown");
    strata_log_setup(NULL, STRATA_LOG_DEBUG);
    strata_log(STRATA_LOG_DEBUG, "no prefix");
}

static void format_and_levels(void **state) {
    char *text = capture_stderr(log_some);
    char level[16], msg[128];
    long secs, ms;
    int stage;
    (void)state;
    assert_int_equal(
        sscanf(text, "[stage %d %ld.%ld] %15[a-z]: %127[^\n]", &stage, &secs, &ms, level, msg), 5);
    assert_int_equal(stage, 2);
    assert_string_equal(level, "warn");
    assert_string_equal(msg, "refused connection from 1.2.3.4:5: wrong key");
    assert_null(strstr(text, "not shown"));
    assert_non_null(strstr(text, "] debug: no prefix\n"));
    assert_true(strata_log_enabled(STRATA_LOG_DEBUG));
    free(text);
}

static void *log_many(void *arg) {
    for (int i = 0; i < 200; i++)
        strata_log(STRATA_LOG_INFO, "%s %d %s", (const char *)arg, i, "0123456789abcdef");
    return NULL;
}

static void two_threads(void) {
    pthread_t a, b;
    strata_log_setup("t", STRATA_LOG_INFO);
    pthread_create(&a, NULL, log_many, "acceptor");
    pthread_create(&b, NULL, log_many, "loop");
    pthread_join(a, NULL);
    pthread_join(b, NULL);
}

static void threads_write_whole_lines(void **state) {
    char *text = capture_stderr(two_threads), *save = NULL;
    int lines = 0;
    (void)state;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        assert_true(strncmp(line, "[t ", 3) == 0);
        assert_non_null(strstr(line, "] info: "));
        assert_non_null(strstr(line, " 0123456789abcdef"));
        lines++;
    }
    assert_int_equal(lines, 400);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(format_and_levels),
        cmocka_unit_test(threads_write_whole_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
