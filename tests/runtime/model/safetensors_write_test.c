/* The safetensors writer: what it writes the reader takes back whole (names, dtypes, shapes,
 * offsets, the metadata, data 8-aligned), and what a header cannot hold is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_write.h"

static void tmp_path(char *out, size_t cap, const char *name) {
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(out, cap, "%s/%s", dir ? dir : "/tmp", name);
}

static void test_round_trip(void **state) {
    (void)state;
    char path[4096];
    tmp_path(path, sizeof path, "w.safetensors");
    const struct st_write_entry e[3] = {
        {.name = "a.weight", .dtype = ST_BF16, .ndim = 2, .shape = {3, 5}},
        {.name = "ids", .dtype = ST_I32, .ndim = 1, .shape = {7}},
        {.name = "scalar", .dtype = ST_F32, .ndim = 0},
    };
    assert_int_equal(st_write_entry_bytes(&e[0]), 30);
    assert_int_equal(st_write_entry_bytes(&e[2]), 4);
    const char *const meta[4] = {"format", "pt", "prompt_len", "12"};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t bytes = 0;
    assert_int_equal(safetensors_write_header(f, e, 3, meta, 2, &bytes), 0);
    assert_int_equal(bytes, 30 + 28 + 4);
    const long header_end = ftell(f);
    assert_int_equal(header_end % 8, 0); /* the data begins 8-aligned */
    for (uint64_t i = 0; i < bytes; ++i)
        fputc((int)(i * 7 + 1), f);
    assert_int_equal(fclose(f), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, path), 0);
    assert_int_equal(safetensors_count(st), 3);
    const struct st_tensor *a = safetensors_find(st, "a.weight");
    const struct st_tensor *ids = safetensors_find(st, "ids");
    const struct st_tensor *s = safetensors_find(st, "scalar");
    assert_non_null(a), assert_non_null(ids), assert_non_null(s);
    assert_int_equal(a->dtype, ST_BF16);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[1], 5);
    assert_int_equal(ids->numel, 7);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(((const uint8_t *)a->data)[0], 1);            /* offset 0 */
    assert_int_equal(((const uint8_t *)ids->data)[0], 30 * 7 + 1); /* offset 30 */
    assert_int_equal(((const uint8_t *)s->data)[0], (58 * 7 + 1) & 0xff);
    safetensors_close(st);
    /* the metadata is in the header as written */
    f = fopen(path, "rb");
    char head[512] = {0};
    assert_int_equal(fread(head, 1, sizeof head - 1, f) > 8, 1);
    fclose(f);
    assert_non_null(strstr(head + 8, "\"__metadata__\":{\"format\":\"pt\",\"prompt_len\":\"12\"}"));
}

static void test_refusals(void **state) {
    (void)state;
    char path[4096];
    tmp_path(path, sizeof path, "bad.safetensors");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    struct st_write_entry e = {.name = "quote\"d", .dtype = ST_F32, .ndim = 1, .shape = {2}};
    assert_int_equal(safetensors_write_header(f, &e, 1, NULL, 0, NULL), STRATA_EINVAL);
    e.name = "";
    assert_int_equal(safetensors_write_header(f, &e, 1, NULL, 0, NULL), STRATA_EINVAL);
    e.name = "x";
    e.shape[0] = -1;
    assert_int_equal(safetensors_write_header(f, &e, 1, NULL, 0, NULL), STRATA_EINVAL);
    e.shape[0] = 2;
    e.ndim = SAFETENSORS_MAX_DIMS + 1;
    assert_int_equal(safetensors_write_header(f, &e, 1, NULL, 0, NULL), STRATA_EINVAL);
    e.ndim = 1;
    const char *const meta[2] = {"k", "line\nbreak"};
    assert_int_equal(safetensors_write_header(f, &e, 1, meta, 1, NULL), STRATA_EINVAL);
    assert_int_equal(ftell(f), 0); /* nothing written by a refusal */
    fclose(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
