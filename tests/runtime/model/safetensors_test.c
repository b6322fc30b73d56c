/* cmocka tests for runtime/safetensors: valid single and sharded checkpoints written at
 * test time into $TEST_TMPDIR, dtype widening, and one corrupted file per validation rule
 * (each must fail with a message that says what is wrong). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/safetensors.h"
#include "tests/runtime/model/st_writer.h"

static char tmp_root[1024];

static const char *tmp_path(const char *name) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", tmp_root, name);
    return buf;
}

static void assert_error_mentions(const char *a, const char *b) {
    const char *msg = strata_last_error();
    if (!strstr(msg, a) || (b && !strstr(msg, b)))
        fail_msg("error \"%s\" does not mention \"%s\" and \"%s\"", msg, a, b ? b : "");
}

static void test_single_file_roundtrip(void **state) {
    (void)state;
    float w[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t bf[4] = {0x3f80, 0xc000, 0x0000, 0x7f80}; /* 1, -2, 0, inf */
    uint16_t hf[4] = {0x3c00, 0xc000, 0x0001, 0x7bff}; /* 1, -2, 2^-24, 65504 */
    int64_t ids[3] = {7, -1, 1LL << 40};
    int32_t i32[2] = {5, -5};
    uint8_t u8[3] = {1, 2, 255};
    struct st_write_tensor ts[] = {
        {"w", ST_F32, 2, {2, 3}, w},     {"b", ST_BF16, 1, {4}, bf},
        {"h", ST_F16, 2, {2, 2}, hf},    {"ids", ST_I64, 1, {3}, ids},
        {"i", ST_I32, 1, {2}, i32},      {"u", ST_U8, 1, {3}, u8},
        {"empty", ST_F32, 2, {0, 4}, 0}, {"scalar", ST_F32, 0, {0}, w},
    };
    const char *path = tmp_path("single.safetensors");
    assert_int_equal(st_write(path, ts, 8), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, path), 0);
    assert_non_null(st);
    assert_int_equal(safetensors_count(st), 8);
    const struct st_tensor *t = safetensors_find(st, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 24);
    assert_memory_equal(t->data, w, sizeof w);
    float out[6];
    assert_int_equal(st_tensor_to_f32(out, t), 0);
    assert_memory_equal(out, w, sizeof w);
    assert_int_equal(st_tensor_to_f32(out, safetensors_find(st, "b")), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.0f && out[3] > 1e38f);
    assert_int_equal(st_tensor_to_f32(out, safetensors_find(st, "h")), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 5.9604644775390625e-8f &&
                out[3] == 65504.0f);
    t = safetensors_find(st, "ids");
    int64_t got;
    memcpy(&got, (const char *)t->data + 16, sizeof got);
    assert_true(got == (1LL << 40));
    assert_int_equal(st_tensor_to_f32(out, t), STRATA_EINVAL);
    assert_int_equal(safetensors_find(st, "empty")->numel, 0);
    assert_int_equal(safetensors_find(st, "scalar")->numel, 1);
    assert_null(safetensors_find(st, "nope"));
    /* safetensors_at walks every tensor exactly once. */
    int seen = 0;
    for (int i = 0; i < safetensors_count(st); ++i)
        seen += safetensors_at(st, i) != NULL;
    assert_int_equal(seen, 8);
    assert_null(safetensors_at(st, 8));
    safetensors_close(st);

    /* A directory holding model.safetensors opens the same way. */
    mkdir(tmp_path("dir_single"), 0755);
    assert_int_equal(st_write(tmp_path("dir_single/model.safetensors"), ts, 2), 0);
    assert_int_equal(safetensors_open(&st, tmp_path("dir_single")), 0);
    assert_int_equal(safetensors_count(st), 2);
    safetensors_close(st);
}

static void test_sharded(void **state) {
    (void)state;
    mkdir(tmp_path("sharded"), 0755);
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    struct st_write_tensor s1[] = {{"a", ST_F32, 1, {2}, a}, {"c", ST_F32, 1, {2}, a}};
    struct st_write_tensor s2[] = {{"b", ST_F32, 1, {3}, b}};
    assert_int_equal(st_write(tmp_path("sharded/model-00001-of-00002.safetensors"), s1, 2), 0);
    assert_int_equal(st_write(tmp_path("sharded/model-00002-of-00002.safetensors"), s2, 1), 0);
    assert_int_equal(st_write_text(tmp_path("sharded/model.safetensors.index.json"),
                                   "{\"metadata\":{\"total_size\":28},\"weight_map\":{"
                                   "\"a\":\"model-00001-of-00002.safetensors\","
                                   "\"b\":\"model-00002-of-00002.safetensors\","
                                   "\"c\":\"model-00001-of-00002.safetensors\"}}"),
                     0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, tmp_path("sharded")), 0);
    assert_int_equal(safetensors_count(st), 3);
    const struct st_tensor *t = safetensors_find(st, "b");
    assert_non_null(t);
    assert_memory_equal(t->data, b, sizeof b);
    safetensors_close(st);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded/model.safetensors.index.json")), 0);
    safetensors_close(st);

    /* The index names a tensor that its shard lacks. */
    mkdir(tmp_path("sharded_bad"), 0755);
    assert_int_equal(st_write(tmp_path("sharded_bad/s1.safetensors"), s1, 2), 0);
    assert_int_equal(st_write_text(tmp_path("sharded_bad/model.safetensors.index.json"),
                                   "{\"weight_map\":{\"a\":\"s1.safetensors\","
                                   "\"zz\":\"s1.safetensors\"}}"),
                     0);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded_bad")), STRATA_ENOTFOUND);
    assert_null(st);
    assert_error_mentions("zz", "weight_map");

    /* A missing shard file and a path escaping the directory. */
    assert_int_equal(st_write_text(tmp_path("sharded_bad/model.safetensors.index.json"),
                                   "{\"weight_map\":{\"a\":\"gone.safetensors\"}}"),
                     0);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded_bad")), STRATA_ENOTFOUND);
    assert_error_mentions("gone.safetensors", NULL);
    assert_int_equal(st_write_text(tmp_path("sharded_bad/model.safetensors.index.json"),
                                   "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}"),
                     0);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded_bad")), STRATA_EFORMAT);
    assert_int_equal(st_write_text(tmp_path("sharded_bad/model.safetensors.index.json"), "{"), 0);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded_bad")), STRATA_EFORMAT);

    /* The same tensor in two shards. */
    mkdir(tmp_path("sharded_dup"), 0755);
    assert_int_equal(st_write(tmp_path("sharded_dup/s1.safetensors"), s1, 2), 0);
    assert_int_equal(st_write(tmp_path("sharded_dup/s2.safetensors"), s1, 1), 0);
    assert_int_equal(st_write_text(tmp_path("sharded_dup/model.safetensors.index.json"),
                                   "{\"weight_map\":{\"a\":\"s1.safetensors\","
                                   "\"c\":\"s2.safetensors\"}}"),
                     0);
    assert_int_equal(safetensors_open(&st, tmp_path("sharded_dup")), STRATA_EFORMAT);
    assert_error_mentions("\"a\"", "twice");
}

#define AUTO_LEN 0 /* header length field = the header's real length */

/* One corrupted file per rule: name, header length field, header, data size, expected
 * substring of the error. */
static void check_corrupt(const char *name, uint64_t len_field, const char *header, size_t data_len,
                          const char *expect) {
    static const uint8_t zeros[256];
    const char *path = tmp_path(name);
    assert_true(data_len <= sizeof zeros);
    if (len_field == AUTO_LEN) len_field = strlen(header);
    assert_int_equal(st_write_raw(path, len_field, header, strlen(header), zeros, data_len), 0);
    struct safetensors *st = (struct safetensors *)1;
    int rc = safetensors_open(&st, path);
    if (rc == 0) fail_msg("%s: opened but should be rejected", name);
    assert_null(st);
    assert_error_mentions(expect, name);
}

static void test_corrupted_files(void **state) {
    (void)state;
    const char *good = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    check_corrupt("len_past_end.st", 1000, good, 8, "exceeds");
    check_corrupt("len_huge.st", UINT64_MAX, good, 8, "exceeds");
    check_corrupt("bad_json.st", AUTO_LEN, "{\"x\":{\"dtype\":\"F32\",", 8, "JSON");
    check_corrupt("not_object.st", AUTO_LEN, "[1,2]", 0, "not a JSON object");
    check_corrupt("trailing.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],"
                  "\"data_offsets\":[0,8]}}abcd",
                  8, "trailing");
    check_corrupt("out_of_data.st", AUTO_LEN, good, 4, "outside the data section");
    check_corrupt("size_mismatch.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
                  "needs 12");
    check_corrupt("bad_dtype.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 16,
                  "unsupported dtype");
    check_corrupt("reversed.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9,8]}}", 16, "outside");
    check_corrupt("negative_dim.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 16, "shape");
    check_corrupt("huge_dims.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                  "\"data_offsets\":[0,8]}}",
                  16, "overflows");
    check_corrupt("no_offsets.st", AUTO_LEN, "{\"x\":{\"dtype\":\"U8\",\"shape\":[1]}}", 16,
                  "data_offsets");
    check_corrupt("overlap.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  16, "overlap");
    check_corrupt("duplicate.st", AUTO_LEN,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                  16, "twice");
    check_corrupt("bad_metadata.st", AUTO_LEN, "{\"__metadata__\":[]}", 0, "__metadata__");

    /* Truncated before the length field is complete, and an empty file. */
    const char *path = tmp_path("short.st");
    assert_int_equal(st_write_text(path, "abc"), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, path), STRATA_EFORMAT);
    assert_error_mentions("too short", "short.st");
    path = tmp_path("empty.st");
    assert_int_equal(st_write_text(path, ""), 0);
    assert_int_equal(safetensors_open(&st, path), STRATA_EFORMAT);
    assert_int_equal(safetensors_open(&st, tmp_path("does_not_exist.st")), STRATA_ENOTFOUND);
    assert_int_equal(safetensors_open(&st, tmp_path("")), STRATA_ENOTFOUND); /* dir, no model */
    assert_error_mentions("model.safetensors", NULL);
}

static void test_validate_in_memory(void **state) {
    (void)state;
    const char *header = "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t hn = strlen(header);
    uint8_t buf[128] = {0};
    buf[0] = (uint8_t)hn;
    memcpy(buf + 8, header, hn);
    assert_int_equal(safetensors_validate(buf, 8 + hn + 2, "mem"), 0);
    assert_int_equal(safetensors_validate(buf, 8 + hn + 1, "mem"), STRATA_EFORMAT);
    assert_int_equal(safetensors_validate(buf, 7, "mem"), STRATA_EFORMAT);
    assert_int_equal(safetensors_validate(NULL, 0, "mem"), STRATA_EFORMAT);
    /* Every truncation of a valid file is rejected or accepted without reading past it. */
    for (size_t len = 0; len < 8 + hn + 2; ++len) {
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, buf, len);
        assert_int_not_equal(safetensors_validate(copy, len, "mem"), 0);
        free(copy);
    }
}

static void test_dtype_names(void **state) {
    (void)state;
    assert_string_equal(st_dtype_name(ST_BF16), "BF16");
    assert_string_equal(st_dtype_name(ST_U8), "U8");
    assert_int_equal(st_dtype_size(ST_I64), 8);
    assert_int_equal(st_dtype_size(ST_F16), 2);
    assert_int_equal(st_dtype_size((enum st_dtype)99), 0);
}

int main(void) {
    const char *base = getenv("TEST_TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/safetensors_test", base ? base : "/tmp");
    mkdir(tmp_root, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file_roundtrip), cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_corrupted_files),       cmocka_unit_test(test_validate_in_memory),
        cmocka_unit_test(test_dtype_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
