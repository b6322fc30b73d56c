/* Stage 0's draft sources for speculative decoding: n-gram lookup (runtime/stage/ngram_draft.h:
 * the longest recurring suffix, its latest occurrence, bounded by k and by the sequence) and
 * the benchmarks' oracle (runtime/stage/oracle_draft.h: recorded tokens, each replaced at the
 * set rate, deterministically; bad files refused naming the line). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/stage/ngram_draft.h"
#include "runtime/stage/oracle_draft.h"

static void ngram_longest_suffix_latest_occurrence(void **state) {
    (void)state;
    int32_t out[8];
    const int32_t a[] = {1, 2, 3, 9, 1, 2, 3};
    assert_int_equal(ngram_draft(a, 7, 3, out), 3); /* [1 2 3] recurs: what followed it */
    assert_int_equal(out[0], 9);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 2);
    const int32_t b[] = {5, 6, 7, 5, 6, 8, 5, 6};
    assert_int_equal(ngram_draft(b, 8, 3, out), 3); /* [5 6]: the latest earlier one */
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 5);
    assert_int_equal(out[2], 6);
    assert_int_equal(ngram_draft(b, 8, 1, out), 1); /* at most k */
    /* Past the end of the sequence the repetition goes on: a loop's continuation. */
    const int32_t c[] = {4, 4};
    assert_int_equal(ngram_draft(c, 2, 5, out), 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(out[i], 4);
    assert_int_equal(ngram_draft(a, 7, 6, out), 6); /* 9 1 2 3, then 9 1 again */
    assert_int_equal(out[3], 3);
    assert_int_equal(out[4], 9);
    assert_int_equal(out[5], 1);
    const int32_t d[] = {1, 2, 3, 4};
    assert_int_equal(ngram_draft(d, 4, 4, out), 0); /* nothing recurs */
    assert_int_equal(ngram_draft(d, 1, 4, out), 0);
    assert_int_equal(ngram_draft(d, 4, 0, out), 0);
}

static char *write_temp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/strata-oracle-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void oracle_rates_and_determinism(void **state) {
    (void)state;
    char text[8192] = "7,8,9 ";
    int32_t want[600], prompt[] = {7, 8, 9}, out[600], again[600];
    for (int i = 0; i < 600; i++) {
        want[i] = (i * 37) % 500;
        snprintf(text + strlen(text), sizeof text - strlen(text), i ? ",%d" : "%d", want[i]);
    }
    strcat(text, "\n");
    char *path = write_temp(text);
    struct oracle_draft *o;
    const double rates[] = {1.0, 0.0, 0.6};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(oracle_draft_load(&o, path, rates[r]), 0);
        int right = 0;
        assert_int_equal(oracle_draft(o, prompt, 3, 0, 600, 500, out), 600);
        for (int i = 0; i < 600; i++)
            right += out[i] == want[i];
        if (r == 0) assert_int_equal(right, 600);
        if (r == 1) assert_int_equal(right, 0);
        if (r == 2 && (right < 300 || right > 420)) fail_msg("rate 0.6: %d of 600 right", right);
        /* The same step gives the same drafts; a later step starts further on. */
        assert_int_equal(oracle_draft(o, prompt, 3, 0, 600, 500, again), 600);
        assert_memory_equal(out, again, sizeof out);
        assert_int_equal(oracle_draft(o, prompt, 3, 598, 4, 500, out), 2);
        assert_int_equal(oracle_draft(o, prompt, 2, 0, 4, 500, out), 0); /* another prompt */
        oracle_draft_free(o);
    }
    unlink(path);
    path = write_temp("1,2 3,4\n1,x 5\n");
    assert_int_equal(oracle_draft_load(&o, path, 0.5), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "line 2"));
    unlink(path);
    assert_int_equal(oracle_draft_load(&o, "/nonexistent/oracle", 0.5), STRATA_ENOTFOUND);
    assert_int_equal(oracle_draft_load(&o, "/dev/null", 1.5), STRATA_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ngram_longest_suffix_latest_occurrence),
        cmocka_unit_test(oracle_rates_and_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
