/* fp32 <-> bf16 / fp16 conversions (round to nearest even, specials, subnormals) and int8
 * per-row quantisation, checked by properties that do not reuse the implementation: the
 * chosen half value is never farther from x than its neighbours (ties to even), every
 * finite half round-trips exactly, and under gcc the result equals the compiler's own
 * _Float16 conversion. Also reports each lossy codec's error on synthetic activations. */
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
#include "wire/codec.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

typedef float (*decode_fn)(uint16_t);

/* Checks that `h` is a correctly rounded (nearest, ties to even) half for finite x. */
static void check_nearest(float x, uint16_t h, decode_fn decode, uint16_t inf_bits) {
    double exact = x;
    uint16_t sign = h & 0x8000u, mag = h & 0x7fffu;
    double got = decode(h);
    if (mag == inf_bits) { /* overflow: x must be at least halfway past the largest finite */
        double largest = decode((uint16_t)(inf_bits - 1));
        double next = 2 * largest - decode((uint16_t)(inf_bits - 2));
        assert_true(fabs(exact) >= (largest + next) / 2);
        return;
    }
    double err = fabs(exact - got);
    if (mag > 0) {
        double below = decode((uint16_t)(sign | (mag - 1)));
        assert_true(err <= fabs(exact - below));
        if (err == fabs(exact - below)) assert_int_equal(mag & 1u, 0);
    }
    if (mag + 1 < inf_bits) {
        double above = decode((uint16_t)(sign | (mag + 1)));
        assert_true(err <= fabs(exact - above));
        if (err == fabs(exact - above)) assert_int_equal(mag & 1u, 0);
    }
    if (mag == 0 && x != 0) assert_true(fabs(exact) <= fabs(decode((uint16_t)(sign | 1))) / 2);
}

static void bf16_known_values(void **state) {
    (void)state;
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie -> even (down) */
    assert_int_equal(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie -> even (up) */
    assert_int_equal(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81); /* above tie -> up */
    assert_int_equal(f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    uint16_t nan = f32_to_bf16(from_bits(0x7f800001u));            /* signalling NaN payload */
    assert_true((nan & 0x7f80u) == 0x7f80u && (nan & 0x7fu) != 0);
    assert_true(isnan(bf16_to_f32(nan)));
    assert_true(bf16_to_f32(0x8000) == 0.0f && signbit(bf16_to_f32(0x8000)));
}

static void f16_known_values(void **state) {
    (void)state;
    assert_int_equal(f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(f32_to_f16(-2.5f), 0xc100);
    assert_int_equal(f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(f32_to_f16(65520.0f), 0x7c00); /* halfway to 2^16: ties to even = inf */
    assert_int_equal(f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
    assert_int_equal(f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie -> even zero */
    assert_int_equal(f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* smallest normal */
    assert_true(isnan(f16_to_f32(f32_to_f16(NAN))));
    assert_true(f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(f16_to_f32(0x7bff) == 65504.0f);
}

static void every_finite_half_round_trips(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue; /* NaN */
        assert_int_equal(f32_to_f16(f16_to_f32((uint16_t)h)), h);
        if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) continue;
        assert_int_equal(f32_to_bf16(bf16_to_f32((uint16_t)h)), h);
    }
}

static void random_floats_round_to_nearest_even(void **state) {
    (void)state;
    for (int i = 0; i < 400000; ++i) {
        uint32_t bits = next_u32();
        if (i % 2) bits = (bits & 0x8fffffffu) | 0x30000000u; /* bias towards the f16 range */
        float x = from_bits(bits);
        if (!isfinite(x)) continue;
        check_nearest(x, f32_to_bf16(x), bf16_to_f32, 0x7f80);
        check_nearest(x, f32_to_f16(x), f16_to_f32, 0x7c00);
#if defined(__FLT16_MAX__) && !defined(__clang__)
        _Float16 reference = (_Float16)x;
        uint16_t reference_bits;
        memcpy(&reference_bits, &reference, 2);
        assert_int_equal(f32_to_f16(x), reference_bits);
#endif
    }
}

/* Synthetic hidden-state-like rows: mostly small values plus a few large outliers. */
static void fill_activations(float *x, size_t rows, size_t cols) {
    for (size_t i = 0; i < rows * cols; ++i) {
        float u = (float)(next_u32() % 2000001) / 1000000.0f - 1.0f;
        x[i] = u * (i % 97 == 0 ? 40.0f : 1.5f);
    }
}

static void lossy_codecs_report_bounded_error(void **state) {
    (void)state;
    enum { ROWS = 16, COLS = 512 };
    static float src[ROWS * COLS], dst[ROWS * COLS], scales[ROWS];
    static uint8_t encoded[ROWS * COLS * 4];
    fill_activations(src, ROWS, COLS);
    const enum wire_codec codecs[] = {WIRE_CODEC_NONE, WIRE_CODEC_BF16, WIRE_CODEC_FP16,
                                      WIRE_CODEC_INT8_ROW};
    for (int c = 0; c < 4; ++c) {
        struct wire_tensor t;
        assert_int_equal(wire_tensor_encode_f32(&t, encoded, scales, src, ROWS, COLS, codecs[c]),
                         0);
        assert_int_equal(t.nbytes,
                         (size_t)ROWS * COLS * wire_codec_value_bytes(WIRE_DTYPE_F32, codecs[c]));
        assert_int_equal(wire_tensor_decode_f32(dst, &t), 0);
        double max_abs, rms;
        wire_codec_error(&max_abs, &rms, src, dst, ROWS * COLS);
        printf("codec %-8s synthetic [%d, %d]: max abs error %.3g, RMS %.3g\n",
               wire_codec_name(codecs[c]), ROWS, COLS, max_abs, rms);
        for (size_t i = 0; i < (size_t)ROWS * COLS; ++i) {
            double bound = codecs[c] == WIRE_CODEC_NONE   ? 0.0
                           : codecs[c] == WIRE_CODEC_BF16 ? fabs(src[i]) * 0x1p-8
                           : codecs[c] == WIRE_CODEC_FP16 ? fabs(src[i]) * 0x1p-11 + 0x1p-25
                                                          : scales[i / COLS] * 0.5 * (1 + 1e-6);
            assert_true(fabs((double)src[i] - dst[i]) <= bound);
        }
    }
}

static void int8_handles_zero_rows_and_refuses_non_finite(void **state) {
    (void)state;
    float src[2][3] = {{0, 0, 0}, {1, -2, 4}}, scales[2], back[6];
    int8_t q[6];
    struct wire_tensor t;
    assert_int_equal(wire_tensor_encode_f32(&t, q, scales, &src[0][0], 2, 3, WIRE_CODEC_INT8_ROW),
                     0);
    assert_true(scales[0] == 0.0f && scales[1] == 4.0f / 127.0f);
    assert_int_equal(q[5], 127);
    assert_int_equal(wire_tensor_decode_f32(back, &t), 0);
    assert_true(back[0] == 0.0f && back[5] == 4.0f);
    src[1][1] = NAN;
    assert_int_equal(wire_encode_f32(q, scales, &src[0][0], 2, 3, WIRE_CODEC_INT8_ROW),
                     STRATA_EINVAL);
}

static void integer_dtypes_decode_by_value(void **state) {
    (void)state;
    int64_t i64[3] = {-5, 0, 1 << 20};
    float out[3];
    struct wire_tensor t = {1, WIRE_DTYPE_I64, 1, {3}, WIRE_CODEC_NONE, i64, sizeof i64, NULL, 0};
    assert_int_equal(wire_tensor_decode_f32(out, &t), 0);
    assert_true(out[0] == -5.0f && out[2] == (float)(1 << 20));
    assert_int_equal(wire_codec_value_bytes(WIRE_DTYPE_I32, WIRE_CODEC_FP16), 0);
    assert_int_equal(wire_dtype_size(WIRE_DTYPE_U8), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_known_values),
        cmocka_unit_test(f16_known_values),
        cmocka_unit_test(every_finite_half_round_trips),
        cmocka_unit_test(random_floats_round_to_nearest_even),
        cmocka_unit_test(lossy_codecs_report_bounded_error),
        cmocka_unit_test(int8_handles_zero_rows_and_refuses_non_finite),
        cmocka_unit_test(integer_dtypes_decode_by_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
