/* Builder/reader round trips for every message, verifier refusals for malformed frames,
 * zero-copy and alignment guarantees, arena behaviour, and a bounded mutation sweep that
 * must never crash (ASan/UBSan watch it in the sanitizer pass). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "tests/wire/samples.h"
#include "wire/codec.h"
#include "wire/message.h"

/* A heap copy of the frame so out-of-bounds reads are visible to ASan. */
static uint8_t *copy_frame(const struct wire_arena *arena, size_t *len) {
    *len = wire_arena_frame_len(arena);
    uint8_t *copy = malloc(*len);
    assert_non_null(copy);
    memcpy(copy, wire_arena_frame(arena), *len);
    return copy;
}

static void every_sample_round_trips(void **state) {
    (void)state;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST; ++kind) {
        assert_int_equal(sample_build(&arena, (enum wire_kind)kind), 0);
        size_t len;
        uint8_t *frame = copy_frame(&arena, &len);
        enum wire_kind found;
        uint16_t minor = 99;
        assert_int_equal(wire_verify(&found, &minor, frame, len), 0);
        assert_int_equal(found, kind);
        assert_int_equal(minor, WIRE_VERSION_MINOR);
        assert_memory_equal(frame + 4, "STRA", 4);
        int line = sample_read_and_check((enum wire_kind)kind, frame, len);
        if (line)
            fail_msg("%s differs at samples.c:%d (%s)", sample_name((enum wire_kind)kind), line,
                     strata_last_error());
        free(frame);
    }
    wire_arena_free(&arena);
}

static void reader_refuses_other_kind(void **state) {
    (void)state;
    struct wire_arena arena;
    struct wire_activation act;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(sample_build(&arena, WIRE_KIND_CONTROL), 0);
    assert_int_equal(
        wire_read_activation(&act, wire_arena_frame(&arena), wire_arena_frame_len(&arena)),
        STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "expected a Activation frame, got Control"));
    wire_arena_free(&arena);
}

static void payload_is_zero_copy_and_aligned(void **state) {
    (void)state;
    enum { T = 64, H = 96 };
    static float hidden[T * H];
    for (int i = 0; i < T * H; ++i)
        hidden[i] = (float)i * 0.5f - 7.0f;
    struct wire_activation msg, got;
    memset(&msg, 0, sizeof msg);
    assert_int_equal(wire_tensor_encode_f32(&msg.hidden, NULL, NULL, hidden, T, H, WIRE_CODEC_NONE),
                     0);
    msg.nonce = 1;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_activation(&arena, &msg), 0);
    const uint8_t *frame = wire_arena_frame(&arena);
    size_t len = wire_arena_frame_len(&arena);
    assert_int_equal((uintptr_t)frame % WIRE_PAYLOAD_ALIGN, 0);
    assert_int_equal(len % WIRE_PAYLOAD_ALIGN, 0);
    assert_int_equal(wire_read_activation(&got, frame, len), 0);
    const uint8_t *data = got.hidden.data;
    assert_true(data >= frame && data + got.hidden.nbytes <= frame + len);
    assert_int_equal((size_t)(data - frame) % WIRE_PAYLOAD_ALIGN, 0);
    assert_memory_equal(data, hidden, sizeof hidden);
    assert_int_equal(got.hidden.shape[0], T);
    assert_int_equal(got.hidden.shape[1], H);
    assert_false(got.attention_mask.defined);
    assert_int_equal(got.num_segments, 0);
    wire_arena_free(&arena);
}

static void fixed_arena_builds_in_place_and_refuses_overflow(void **state) {
    (void)state;
    static uint8_t storage[256] __attribute__((aligned(64)));
    struct wire_arena arena;
    assert_int_equal(wire_arena_init_fixed(&arena, storage, sizeof storage), 0);
    assert_int_equal(sample_build(&arena, WIRE_KIND_CONTROL), 0);
    assert_true(wire_arena_frame(&arena) >= storage &&
                wire_arena_frame(&arena) < storage + sizeof storage);
    assert_int_equal(sample_read_and_check(WIRE_KIND_CONTROL, wire_arena_frame(&arena),
                                           wire_arena_frame_len(&arena)),
                     0);
    assert_int_equal(sample_build(&arena, WIRE_KIND_ACTIVATION), STRATA_ENOMEM);
    assert_non_null(strstr(strata_last_error(), "fixed buffer"));
    wire_arena_free(&arena);
}

static void arena_grows_from_tiny(void **state) {
    (void)state;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 64), 0);
    for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST; ++kind) {
        assert_int_equal(sample_build(&arena, (enum wire_kind)kind), 0);
        assert_int_equal(sample_read_and_check((enum wire_kind)kind, wire_arena_frame(&arena),
                                               wire_arena_frame_len(&arena)),
                         0);
    }
    wire_arena_free(&arena);
    struct wire_arena zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    wire_arena_free(&zeroed);
}

static void builder_refuses_inconsistent_tensors(void **state) {
    (void)state;
    float values[6] = {0};
    struct wire_activation msg;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    memset(&msg, 0, sizeof msg);
    assert_int_equal(wire_tensor_encode_f32(&msg.hidden, NULL, NULL, values, 2, 3, WIRE_CODEC_NONE),
                     0);
    msg.hidden.nbytes = 20;
    assert_int_equal(wire_build_activation(&arena, &msg), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "Activation.hidden: payload is 20 bytes"));
    msg.hidden.nbytes = 24;
    msg.hidden.codec = WIRE_CODEC_INT8_ROW;
    msg.hidden.dtype = WIRE_DTYPE_I32;
    assert_int_equal(wire_build_activation(&arena, &msg), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "invalid for dtype i32"));
    msg.hidden.dtype = WIRE_DTYPE_F32;
    msg.hidden.codec = WIRE_CODEC_NONE;
    msg.hidden.ndim = WIRE_MAX_DIMS + 1;
    assert_int_equal(wire_build_activation(&arena, &msg), STRATA_EFORMAT);
    wire_arena_free(&arena);
}

static void verifier_refuses_truncation_and_garbage(void **state) {
    (void)state;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(sample_build(&arena, WIRE_KIND_ACTIVATION), 0);
    size_t len;
    uint8_t *frame = copy_frame(&arena, &len);
    enum wire_kind kind;
    /* Every prefix must be handled without a fault; one that cuts into data (not just the
     * builder's trailing alignment padding, < 64 bytes) must be refused. */
    for (size_t cut = 0; cut < len; cut += 4) {
        uint8_t *prefix = malloc(cut ? cut : 1);
        memcpy(prefix, frame, cut);
        int rc = wire_verify(&kind, NULL, prefix, cut);
        if (cut + WIRE_PAYLOAD_ALIGN <= len) assert_int_not_equal(rc, 0);
        free(prefix);
    }
    uint8_t wrong_id[64];
    memcpy(wrong_id, frame, sizeof wrong_id);
    memcpy(wrong_id + 4, "NOPE", 4);
    assert_int_equal(wire_verify(&kind, NULL, wrong_id, sizeof wrong_id), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "not a Strata frame"));
    assert_int_equal(wire_verify(&kind, NULL, NULL, 0), STRATA_EINVAL);
    assert_int_equal(wire_verify(&kind, NULL, frame + 1, len - 1), STRATA_EINVAL);
    /* A root offset pointing past the end. */
    uint8_t *bad_root = malloc(len);
    memcpy(bad_root, frame, len);
    bad_root[0] = 0xf0;
    bad_root[1] = 0xff;
    assert_int_equal(wire_verify(&kind, NULL, bad_root, len), STRATA_EFORMAT);
    free(bad_root);
    free(frame);
    wire_arena_free(&arena);
}

/* Offset of the only occurrence of `value` (8 bytes, little-endian) in frame [len]. */
static size_t find_u64(const uint8_t *frame, size_t len, uint64_t value) {
    size_t found = len;
    for (size_t i = 0; i + 8 <= len; ++i)
        if (memcmp(frame + i, &value, 8) == 0) {
            assert_int_equal(found, len); /* unique */
            found = i;
        }
    assert_true(found < len);
    return found;
}

static void request_round_trips_with_defaults(void **state) {
    (void)state;
    static const int32_t prompt[1] = {7};
    struct wire_request msg = {
        .nonce = 1, .prompt = prompt, .prompt_len = 1, .max_tokens = 1, .top_p = 1.0f};
    struct wire_request got;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_request(&arena, &msg), 0);
    assert_int_equal(
        wire_read_request(&got, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_true(got.nonce == 1 && got.prompt_len == 1 && got.prompt[0] == 7);
    assert_true(got.max_tokens == 1 && got.temperature == 0.0f && got.top_k == 0);
    assert_true(got.top_p == 1.0f); /* the schema default, not written */
    assert_true(got.seed == 0 && got.num_stop_ids == 0 && got.stop_ids == NULL);
    assert_true(got.num_resume_tokens == 0 && got.resume_tokens == NULL);
    /* Zero-copy: the prompt points into the frame. */
    assert_true((const uint8_t *)got.prompt > wire_arena_frame(&arena) &&
                (const uint8_t *)got.prompt <
                    wire_arena_frame(&arena) + wire_arena_frame_len(&arena));
    wire_arena_free(&arena);
}

static void request_builder_refuses_bad_messages(void **state) {
    (void)state;
    static const int32_t prompt[2] = {1, 2};
    struct wire_request good = {
        .nonce = 5, .prompt = prompt, .prompt_len = 2, .max_tokens = 3, .top_p = 1.0f};
    struct wire_request msg;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    msg = good;
    msg.nonce = 0;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "nonce 0 is reserved"));
    msg = good;
    msg.prompt_len = 0;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "no prompt"));
    msg = good;
    msg.max_tokens = 0;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "max_tokens 0"));
    msg = good;
    msg.temperature = NAN;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    msg = good;
    msg.num_stop_ids = 2;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    /* Recovery: at most max_tokens - 1 tokens can precede the resumed step. */
    static const int32_t done[3] = {4, 5, 6};
    msg = good;
    msg.resume_tokens = done;
    msg.num_resume_tokens = 3;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "fewer than max_tokens 3"));
    wire_arena_free(&arena);
}

/* A recovery Request (in-flight replay) carries the tokens generated before the break. */
static void request_resume_tokens_round_trip(void **state) {
    (void)state;
    static const int32_t prompt[2] = {1, 2}, done[2] = {9, 8};
    struct wire_request msg = {.nonce = 5,
                               .prompt = prompt,
                               .prompt_len = 2,
                               .max_tokens = 3,
                               .top_p = 1.0f,
                               .resume_tokens = done,
                               .num_resume_tokens = 2};
    struct wire_request got;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_request(&arena, &msg), 0);
    assert_int_equal(
        wire_read_request(&got, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_true(got.num_resume_tokens == 2 && got.resume_tokens[0] == 9 &&
                got.resume_tokens[1] == 8);
    wire_arena_free(&arena);
}

/* 1.1: a Request's image files must add up; formats are known and one per file; a Hello of
 * role Vision round-trips. */
static void request_image_files_checked(void **state) {
    (void)state;
    static const int32_t prompt[1] = {500};
    static const uint8_t files[5] = {1, 2, 3, 4, 5};
    static const uint32_t sizes[2] = {2, 3}, short_sizes[2] = {2, 2}, empty[2] = {0, 5};
    static const uint8_t formats[2] = {WIRE_IMAGE_JPEG, WIRE_IMAGE_UNKNOWN}, bad_format[2] = {1, 7};
    struct wire_request msg = {.nonce = 5,
                               .prompt = prompt,
                               .prompt_len = 1,
                               .max_tokens = 3,
                               .top_p = 1.0f,
                               .image_files = files,
                               .image_files_len = 5,
                               .image_file_sizes = sizes,
                               .num_image_files = 2,
                               .image_formats = formats},
                        got;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_request(&arena, &msg), 0);
    assert_int_equal(
        wire_read_request(&got, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(got.num_image_files, 2);
    assert_int_equal(got.image_files_len, 5);
    assert_memory_equal(got.image_files, files, 5);
    assert_memory_equal(got.image_file_sizes, sizes, sizeof sizes);
    assert_memory_equal(got.image_formats, formats, 2);
    msg.image_file_sizes = short_sizes;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "add up to 4 bytes, image_files holds 5"));
    msg.image_file_sizes = empty;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "image file 0 is empty"));
    msg.image_file_sizes = sizes;
    msg.image_formats = bad_format;
    assert_int_equal(wire_build_request(&arena, &msg), STRATA_EVERSION);
    assert_non_null(strstr(strata_last_error(), "image format 7 unknown"));
    struct wire_hello hello = {.version_major = 1,
                               .version_minor = 1,
                               .stage_index = -1,
                               .role = WIRE_ROLE_VISION},
                      hello_got;
    assert_int_equal(wire_build_hello(&arena, &hello), 0);
    assert_int_equal(
        wire_read_hello(&hello_got, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(hello_got.role, WIRE_ROLE_VISION);
    wire_arena_free(&arena);
}

/* Frames that verify structurally but break a Request rule are refused by the verifier
 * and the reader (patched in place: nonce 0, max_tokens 0, NaN temperature). */
static void request_verifier_refuses_reserved_nonce_and_bad_values(void **state) {
    (void)state;
    static const int32_t prompt[2] = {1, 2};
    struct wire_request msg = {.nonce = 0x0102030405060708ull,
                               .prompt = prompt,
                               .prompt_len = 2,
                               .max_tokens = 0x7a7b7c7d,
                               .temperature = 0.5f,
                               .top_p = 1.0f};
    struct wire_request got;
    struct wire_arena arena;
    enum wire_kind kind;
    size_t len;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(wire_build_request(&arena, &msg), 0);
    uint8_t *frame = copy_frame(&arena, &len);
    assert_int_equal(wire_verify(&kind, NULL, frame, len), 0);
    assert_int_equal(kind, WIRE_KIND_REQUEST);

    size_t at = find_u64(frame, len, msg.nonce);
    memset(frame + at, 0, 8);
    assert_int_equal(wire_verify(&kind, NULL, frame, len), STRATA_EFORMAT);
    assert_int_equal(kind, WIRE_KIND_REQUEST);
    assert_int_equal(wire_read_request(&got, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "Request.nonce 0 is reserved"));
    memcpy(frame + at, &msg.nonce, 8);
    assert_int_equal(wire_read_request(&got, frame, len), 0);

    int32_t max_tokens = msg.max_tokens, zero = 0;
    for (size_t i = 0; i + 4 <= len; ++i)
        if (memcmp(frame + i, &max_tokens, 4) == 0) memcpy(frame + i, &zero, 4);
    assert_int_equal(wire_read_request(&got, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "max_tokens 0 is invalid"));
    free(frame);

    msg.max_tokens = 3;
    msg.temperature = 0.25f;
    assert_int_equal(wire_build_request(&arena, &msg), 0);
    frame = copy_frame(&arena, &len);
    float nan_value = NAN, quarter = 0.25f;
    for (size_t i = 0; i + 4 <= len; ++i)
        if (memcmp(frame + i, &quarter, 4) == 0) memcpy(frame + i, &nan_value, 4);
    assert_int_equal(wire_read_request(&got, frame, len), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "NaN"));
    free(frame);
    wire_arena_free(&arena);
}

/* Deterministic xorshift so failures reproduce. */
/* Control Describe (1.1, appended): the stage list round trips, truncations are refused,
 * and the builder refuses entries a reader would refuse. */
static void describe_round_trips_and_truncations_refused(void **state) {
    (void)state;
    struct wire_arena arena;
    struct wire_control ctl;
    enum wire_kind kind;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    assert_int_equal(sample_build_describe(&arena), 0);
    size_t len;
    uint8_t *frame = copy_frame(&arena, &len);
    assert_int_equal(wire_verify(&kind, NULL, frame, len), 0);
    assert_int_equal(kind, WIRE_KIND_CONTROL);
    assert_int_equal(wire_read_control(&ctl, frame, len), 0);
    int line = sample_check_describe(&ctl);
    if (line) fail_msg("describe differs at samples.c:%d", line);
    /* A cut frame is refused, or (only trailing padding cut) reads back whole; never a read
     * past the end (ASan). */
    int refused = 0;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, frame, cut);
        if (wire_read_control(&ctl, part, cut) == 0)
            assert_int_equal(sample_check_describe(&ctl), 0);
        else
            refused++;
        free(part);
    }
    assert_true(refused >= (int)len - 4);
    free(frame);
    /* A plain control has no stages. */
    struct wire_control plain = {.kind = WIRE_CONTROL_DESCRIBE, .nonce = 5};
    assert_int_equal(wire_build_control(&arena, &plain), 0);
    assert_int_equal(
        wire_read_control(&ctl, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
    assert_int_equal(ctl.kind, WIRE_CONTROL_DESCRIBE);
    assert_int_equal(ctl.num_stages, 0);
    wire_arena_free(&arena);
}

static void describe_builder_refuses_bad_entries(void **state) {
    (void)state;
    struct wire_arena arena;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    struct wire_stage_info good = {
        .stage_index = 0, .num_stages = 1, .layer_end = 4, .tp = 1, .kvp = 1};
    struct wire_stage_info bad[6];
    for (int i = 0; i < 6; i++)
        bad[i] = good;
    bad[0].layer_start = 5; /* [5, 4) */
    bad[1].stage_index = 1; /* of 1 */
    bad[2].tp = 0;
    bad[3].num_stages = 0;
    bad[4].layer_start = -1;
    bad[5].queue_depth = -1;
    for (int i = 0; i < 6; i++) {
        struct wire_control m = {
            .kind = WIRE_CONTROL_DESCRIBE, .nonce = 1, .stages = &bad[i], .num_stages = 1};
        assert_int_equal(wire_build_control(&arena, &m), STRATA_EINVAL);
        assert_non_null(strstr(strata_last_error(), "Control Describe entry 0"));
    }
    struct wire_control none = {.kind = WIRE_CONTROL_DESCRIBE, .num_stages = 2};
    assert_int_equal(wire_build_control(&arena, &none), STRATA_EINVAL);
    struct wire_control many = {
        .kind = WIRE_CONTROL_DESCRIBE, .stages = &good, .num_stages = WIRE_MAX_DESCRIBE_STAGES + 1};
    assert_int_equal(wire_build_control(&arena, &many), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "at most 256"));
    struct wire_control one = {.kind = WIRE_CONTROL_DESCRIBE, .stages = &good, .num_stages = 1};
    assert_int_equal(wire_build_control(&arena, &one), 0);
    wire_arena_free(&arena);
}

static uint64_t next_random(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void mutations_never_crash(void **state) {
    (void)state;
    struct wire_arena arena;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int accepted = 0, refused = 0;
    assert_int_equal(wire_arena_init(&arena, 0), 0);
    /* Every sample, then (LAST + 1) the Control Describe with its vector of tables. */
    for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST + 1; ++kind) {
        assert_int_equal(kind > WIRE_KIND_LAST ? sample_build_describe(&arena)
                                               : sample_build(&arena, (enum wire_kind)kind),
                         0);
        size_t len;
        uint8_t *frame = copy_frame(&arena, &len);
        uint8_t *mutant = malloc(len);
        for (int trial = 0; trial < 3000; ++trial) {
            memcpy(mutant, frame, len);
            int flips = 1 + (int)(next_random(&seed) % 4);
            for (int f = 0; f < flips; ++f) {
                size_t at = next_random(&seed) % len;
                mutant[at] = (uint8_t)next_random(&seed);
            }
            enum wire_kind found;
            if (wire_verify(&found, NULL, mutant, len) == 0) {
                accepted++;
                /* A verified frame must be readable as what it claims, without faults. */
                struct wire_activation act;
                struct wire_kv_block kv;
                struct wire_token_result tok;
                struct wire_hello hello;
                struct wire_error err;
                struct wire_control ctl;
                struct wire_request req;
                struct wire_vision_block vb;
                struct wire_vision_ack va;
                int rc =
                    found == WIRE_KIND_REQUEST        ? wire_read_request(&req, mutant, len)
                    : found == WIRE_KIND_VISION_BLOCK ? wire_read_vision_block(&vb, mutant, len)
                    : found == WIRE_KIND_VISION_ACK   ? wire_read_vision_ack(&va, mutant, len)
                    : found == WIRE_KIND_ACTIVATION   ? wire_read_activation(&act, mutant, len)
                    : found == WIRE_KIND_KV_BLOCK     ? wire_read_kv_block(&kv, mutant, len)
                    : found == WIRE_KIND_TOKEN_RESULT ? wire_read_token_result(&tok, mutant, len)
                    : found == WIRE_KIND_HELLO        ? wire_read_hello(&hello, mutant, len)
                    : found == WIRE_KIND_ERROR        ? wire_read_error(&err, mutant, len)
                                                      : wire_read_control(&ctl, mutant, len);
                assert_int_equal(rc, 0);
                if (found == WIRE_KIND_ERROR) assert_true(strlen(err.message) < len);
                for (size_t i = 0; found == WIRE_KIND_CONTROL && i < ctl.num_stages; i++) {
                    struct wire_stage_info info = wire_control_stage(&ctl, i);
                    assert_true(strlen(info.device) < len && strlen(info.version) < len &&
                                strlen(info.next) < len);
                    assert_true(info.layer_start <= info.layer_end);
                }
            } else {
                refused++;
            }
        }
        free(mutant);
        free(frame);
    }
    printf("mutations: %d accepted (harmless bytes), %d refused\n", accepted, refused);
    assert_true(refused > 0 && accepted > 0);
    wire_arena_free(&arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_sample_round_trips),
        cmocka_unit_test(reader_refuses_other_kind),
        cmocka_unit_test(payload_is_zero_copy_and_aligned),
        cmocka_unit_test(fixed_arena_builds_in_place_and_refuses_overflow),
        cmocka_unit_test(arena_grows_from_tiny),
        cmocka_unit_test(builder_refuses_inconsistent_tensors),
        cmocka_unit_test(verifier_refuses_truncation_and_garbage),
        cmocka_unit_test(request_round_trips_with_defaults),
        cmocka_unit_test(request_builder_refuses_bad_messages),
        cmocka_unit_test(request_resume_tokens_round_trip),
        cmocka_unit_test(request_verifier_refuses_reserved_nonce_and_bad_values),
        cmocka_unit_test(request_image_files_checked),
        cmocka_unit_test(describe_round_trips_and_truncations_refused),
        cmocka_unit_test(describe_builder_refuses_bad_entries),
        cmocka_unit_test(mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
