/* Compatibility of our FlatBuffers code with the official compiler (flatc 2.0.8):
 *  (a) our bytes -> `flatc --json --raw-binary` -> JSON equal to the golden file;
 *  (b) golden JSON -> `flatc -b` -> bytes our verifier and readers decode to the sample values;
 *  (c) a flatc-built Request with the reserved nonce 0, or image grids that are not
 *      (t, h, w) triples, is refused;
 *  (d) frames of a hypothetical next minor (1.2) schema (extra fields, new union member,
 *      new enum value) and of major 2, built by flatc, get the documented behaviour from
 *      our reader;
 *  (e) the Control Describe's vector of StageInfo tables both ways, and a bad entry refused.
 * Skipped with a reason when flatc is not installed (`./strata setup` installs it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "tests/test_util.h"
#include "tests/wire/samples.h"
#include "wire/message.h"

#define FLATC "/usr/bin/flatc"

static char work_dir[1024];

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1); /* malloc: aligned for the reader */
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void run_flatc(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && " FLATC " %s 2>&1", work_dir, args);
    int rc = system(cmd);
    if (rc != 0) fail_msg("flatc failed (%d): %s", rc, cmd);
}

static void assert_json_files_equal(const char *got_path, const char *want_path) {
    size_t n;
    char *got_text = read_file(got_path, &n);
    char *want_text = read_file(want_path, &n);
    cJSON *got = cJSON_Parse(got_text), *want = cJSON_Parse(want_text);
    assert_non_null(got);
    assert_non_null(want);
    if (!cJSON_Compare(got, want, 1))
        fail_msg("flatc JSON of our bytes differs from %s:\n%s", want_path, got_text);
    cJSON_Delete(got);
    cJSON_Delete(want);
    free(got_text);
    free(want_text);
}

static void our_bytes_decode_in_flatc_to_golden_json(void **state) {
    (void)state;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST; ++kind) {
        const char *name = sample_name((enum wire_kind)kind);
        char path[2048], args[8192];
        assert_int_equal(sample_build(&arena, (enum wire_kind)kind), 0);
        snprintf(path, sizeof path, "%s/ours_%s.bin", work_dir, name);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(wire_arena_frame(&arena), 1, wire_arena_frame_len(&arena), f),
                         wire_arena_frame_len(&arena));
        fclose(f);
        snprintf(args, sizeof args,
                 "--json --strict-json --defaults-json --raw-binary -o json '%s' -- ours_%s.bin",
                 test_path("wire/strata.fbs"), name); /* test_path's buffer is used right away */
        run_flatc(args);
        char got[4096], want[4096];
        snprintf(got, sizeof got, "%s/json/ours_%s.json", work_dir, name);
        snprintf(want, sizeof want, "tests/wire/testdata/%s.json", name);
        assert_json_files_equal(got, test_path(want));
    }
    wire_arena_free(&arena);
}

/* Runs `flatc -b [flags]` with `schema` on a testdata JSON and returns the binary (malloc'd). */
static char *flatc_binary_with(const char *flags, const char *schema_path, const char *json_name,
                               size_t *len) {
    char args[8192], json[1024], out[4096], schema[2048];
    snprintf(schema, sizeof schema, "%s", schema_path); /* test_path reuses one buffer */
    snprintf(json, sizeof json, "tests/wire/testdata/%s.json", json_name);
    snprintf(args, sizeof args, "-b %s -o bin '%s' '%s'", flags, schema, test_path(json));
    run_flatc(args);
    snprintf(out, sizeof out, "%s/bin/%s.stra", work_dir, json_name);
    return read_file(out, len);
}

static char *flatc_binary(const char *schema_path, const char *json_name, size_t *len) {
    return flatc_binary_with("", schema_path, json_name, len);
}

/* Plain, and with every default value written out (another vtable layout). */
static void flatc_bytes_read_back_as_samples(void **state) {
    (void)state;
    for (int variant = 0; variant < 2; ++variant)
        for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST; ++kind) {
            size_t len;
            char *frame =
                flatc_binary_with(variant ? "--force-defaults" : "", test_path("wire/strata.fbs"),
                                  sample_name((enum wire_kind)kind), &len);
            enum wire_kind found;
            if (wire_verify(&found, NULL, frame, len))
                fail_msg("%s: %s", sample_name((enum wire_kind)kind), strata_last_error());
            assert_int_equal(found, kind);
            int line = sample_read_and_check((enum wire_kind)kind, frame, len);
            if (line)
                fail_msg("flatc-built %s differs at samples.c:%d (%s)",
                         sample_name((enum wire_kind)kind), line, strata_last_error());
            free(frame);
        }
}

static void newer_minor_with_extra_fields_reads_fine(void **state) {
    (void)state;
    char schema[4096];
    snprintf(schema, sizeof schema, "%s", test_path("tests/wire/testdata/strata_v1_1.fbs"));
    size_t len;
    char *frame = flatc_binary(schema, "activation_v1_1", &len);
    enum wire_kind kind;
    uint16_t minor;
    if (wire_verify(&kind, &minor, frame, len)) fail_msg("%s", strata_last_error());
    assert_int_equal(kind, WIRE_KIND_ACTIVATION);
    assert_int_equal(minor, 2);
    int line = sample_read_and_check(WIRE_KIND_ACTIVATION, frame, len);
    if (line) fail_msg("1.1 activation differs at samples.c:%d", line);
    free(frame);

    frame = flatc_binary(schema, "telemetry_v1_1", &len);
    assert_int_equal(wire_verify(&kind, NULL, frame, len), STRATA_EVERSION);
    assert_non_null(
        strstr(strata_last_error(), "message type 10 unknown to protocol 1.1 (frame is 1.2)"));
    free(frame);

    frame = flatc_binary(schema, "control_pause_v1_1", &len);
    struct wire_control control;
    assert_int_equal(wire_read_control(&control, frame, len), STRATA_EVERSION);
    assert_non_null(strstr(strata_last_error(), "Control.kind 8 unknown"));
    free(frame);
}

static void other_major_is_refused_naming_both_versions(void **state) {
    (void)state;
    size_t len;
    char *frame = flatc_binary(test_path("wire/strata.fbs"), "control_major2", &len);
    struct wire_control control;
    assert_int_equal(wire_read_control(&control, frame, len), STRATA_EVERSION);
    assert_non_null(strstr(strata_last_error(), "peer speaks protocol 2.0, this build speaks 1.1"));
    free(frame);
}

/* A flatc-built Request with the reserved nonce 0 is refused by the verifier and the reader. */
static void reserved_request_nonce_is_refused(void **state) {
    (void)state;
    size_t len;
    char *frame = flatc_binary(test_path("wire/strata.fbs"), "request_nonce0", &len);
    enum wire_kind kind;
    struct wire_request request;
    assert_int_equal(wire_verify(&kind, NULL, frame, len), STRATA_EFORMAT);
    assert_int_equal(kind, WIRE_KIND_REQUEST);
    assert_int_equal(wire_read_request(&request, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "Request.nonce 0 is reserved"));
    free(frame);
}

/* Image grids come in (t, h, w) triples: four values are refused. */
static void request_grids_not_triples_refused(void **state) {
    (void)state;
    size_t len;
    char *frame = flatc_binary(test_path("wire/strata.fbs"), "request_bad_grids", &len);
    struct wire_request request;
    assert_int_equal(wire_read_request(&request, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "image_grids has 4 values"));
    free(frame);
}

/* Control Describe (1.1, appended: kind 6 + the `stages` vector of StageInfo tables): our
 * bytes read by flatc give the golden JSON; flatc's bytes (plain and with every default
 * written) read back as the sample; an entry with layers [4, 2) is refused. */
static void describe_both_directions(void **state) {
    (void)state;
    struct wire_arena arena;
    char path[2048], args[8192], got[4096];
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(sample_build_describe(&arena), 0);
    snprintf(path, sizeof path, "%s/ours_control_describe.bin", work_dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(wire_arena_frame(&arena), 1, wire_arena_frame_len(&arena), f),
                     wire_arena_frame_len(&arena));
    fclose(f);
    wire_arena_free(&arena);
    snprintf(args, sizeof args,
             "--json --strict-json --defaults-json --raw-binary -o json '%s' -- "
             "ours_control_describe.bin",
             test_path("wire/strata.fbs"));
    run_flatc(args);
    snprintf(got, sizeof got, "%s/json/ours_control_describe.json", work_dir);
    assert_json_files_equal(got, test_path("tests/wire/testdata/control_describe.json"));
    for (int variant = 0; variant < 2; ++variant) {
        size_t len;
        char *frame = flatc_binary_with(variant ? "--force-defaults" : "",
                                        test_path("wire/strata.fbs"), "control_describe", &len);
        struct wire_control control;
        if (wire_read_control(&control, frame, len)) fail_msg("%s", strata_last_error());
        int line = sample_check_describe(&control);
        if (line) fail_msg("flatc-built describe differs at samples.c:%d", line);
        free(frame);
    }
    size_t len;
    char *frame = flatc_binary(test_path("wire/strata.fbs"), "control_describe_bad", &len);
    struct wire_control control;
    enum wire_kind kind;
    assert_int_equal(wire_verify(&kind, NULL, frame, len), STRATA_EFORMAT);
    assert_int_equal(wire_read_control(&control, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "entry 1: stage 1 of 2, layers [4, 2)"));
    free(frame);
}

int main(void) {
    struct stat st;
    if (stat(FLATC, &st) != 0) {
        test_skip_all(
            "flatc not installed (Debian flatbuffers-compiler; ./strata setup installs it)");
        return 0;
    }
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(work_dir, sizeof work_dir, "%s/flatc_compat", tmp ? tmp : "/tmp");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/json' '%s/bin'", work_dir, work_dir,
             work_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot create %s\n", work_dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(our_bytes_decode_in_flatc_to_golden_json),
        cmocka_unit_test(flatc_bytes_read_back_as_samples),
        cmocka_unit_test(newer_minor_with_extra_fields_reads_fine),
        cmocka_unit_test(request_grids_not_triples_refused),
        cmocka_unit_test(other_major_is_refused_naming_both_versions),
        cmocka_unit_test(reserved_request_nonce_is_refused),
        cmocka_unit_test(describe_both_directions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
