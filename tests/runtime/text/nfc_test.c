/* HF tokenizers' NFC (runtime/text/nfc.h) against HF itself: testdata/nfc_hf.jsonl holds
 * normalizers.NFC().normalize_str of every probe (tools/golden/nfc_table.py) of the code
 * points that trip other normalisers (U+07FD, U+1DF9, U+0D3B, U+08D3, U+10F46, U+0EBA, U+16FF0,
 * U+1DFA, which HF treats as class 0, and U+0323, U+1AB5, which it reorders like utf8proc) and of
 * both ends of every range of the table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/text/nfc.h"
#include "tests/test_util.h"

static const int listed[] = {0x07FD, 0x1DF9,  0x0D3B, 0x08D3, 0x10F46,
                             0x0EBA, 0x16FF0, 0x1DFA, 0x0323, 0x1AB5};
#define N_LISTED (int)(sizeof listed / sizeof *listed)

static void test_hf_cases(void **state) {
    (void)state;
    FILE *f = fopen(test_path("tests/runtime/text/testdata/nfc_hf.jsonl"), "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, failed = 0, lineno = 0, seen[N_LISTED] = {0};
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        assert_non_null(c);
        if (++lineno > 1) { /* line 1: header */
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            const char *want = cJSON_GetObjectItem(c, "nfc")->valuestring;
            int cp = (int)cJSON_GetObjectItem(c, "cp")->valuedouble;
            char *got = NULL;
            size_t len;
            ++n;
            for (int i = 0; i < N_LISTED; ++i)
                seen[i] += listed[i] == cp;
            if (nfc_hf(&got, &len, text, strlen(text)) != 0 || len != strlen(want) ||
                strcmp(got, want) != 0) {
                if (++failed <= 20)
                    printf("nfc line %d: U+%04X probe %s differs from HF\n", lineno, cp,
                           cJSON_GetObjectItem(c, "probe")->valuestring);
            }
            free(got);
        }
        cJSON_Delete(c);
    }
    free(line);
    fclose(f);
    printf("nfc: %d probes, %d identical to HF tokenizers, %d differ\n", n, n - failed, failed);
    assert_true(n >= 200);
    assert_int_equal(failed, 0);
    for (int i = 0; i < N_LISTED; ++i)
        assert_true(seen[i] >= 5); /* every probe of every listed character */
}

/* The table is what nfc_hf_is_inert's binary search assumes: ascending and disjoint. */
static void test_table(void **state) {
    (void)state;
    assert_true(nfc_hf_inert_n > 0);
    for (size_t i = 0; i < nfc_hf_inert_n; ++i) {
        assert_true(nfc_hf_inert[i].lo <= nfc_hf_inert[i].hi);
        if (i) assert_true(nfc_hf_inert[i - 1].hi + 1 < nfc_hf_inert[i].lo);
        assert_true(nfc_hf_is_inert(nfc_hf_inert[i].lo));
        assert_true(nfc_hf_is_inert(nfc_hf_inert[i].hi));
        assert_false(nfc_hf_is_inert(nfc_hf_inert[i].lo - 1));
        assert_false(nfc_hf_is_inert(nfc_hf_inert[i].hi + 1));
    }
    assert_false(nfc_hf_is_inert(0));
    assert_false(nfc_hf_is_inert(0x10FFFF));
}

static void test_edges(void **state) {
    (void)state;
    char *out;
    size_t len;
    assert_int_equal(nfc_hf(&out, &len, "", 0), 0);
    assert_int_equal(len, 0);
    assert_string_equal(out, "");
    free(out);
    /* Only an inert code point (U+07FD): the segment loop with nothing around it. */
    assert_int_equal(nfc_hf(&out, &len, "\xDF\xBD", 2), 0);
    assert_string_equal(out, "\xDF\xBD");
    free(out);
    assert_int_equal(nfc_hf(&out, &len, "ok\xC3(", 4), STRATA_EINVAL);
    assert_int_equal(nfc_hf(&out, &len, "\xDF\xBDq\xED\xA0\x80", 6), STRATA_EINVAL);
    assert_int_equal(nfc_hf(&out, &len, "q\xCC", 2), STRATA_EINVAL); /* truncated */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_cases),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
