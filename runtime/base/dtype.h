/* Conversions between f32 and the 16-bit float formats, used by the safetensors reader,
 * the reference decoder and the wire codecs alike (one implementation, one rounding rule).
 *
 * bf16 and f16 values are handled as their uint16 bit patterns. Widening is exact;
 * narrowing rounds to nearest, ties to even, keeps NaN a (quiet) NaN and overflows f16 to
 * infinity. The bf16 pair is inline because the reference matmul widens weights in its
 * inner loop. */
#ifndef STRATA_RUNTIME_BASE_DTYPE_H
#define STRATA_RUNTIME_BASE_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding) >> 16);
}

/* IEEE half <-> float, including subnormals, infinities and NaN. */
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);

#endif
