/* f16 <-> f32 conversions; see dtype.h. */
#include "runtime/base/dtype.h"

static uint32_t f32_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    return bits;
}

static float bits_f32(uint32_t bits) {
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

uint16_t f32_to_f16(float value) {
    uint32_t bits = f32_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: inf */
    if (abs < 0x38800000u) {                       /* f16 subnormal or 0 */
        if (abs < 0x33000000u) return sign;        /* < 2^-25: rounds to 0 */
        uint32_t exponent = abs >> 23;
        uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exponent; /* value = mantissa * 2^(exponent-150); unit 2^-24 */
        uint32_t result = mantissa >> shift;
        uint32_t rest = mantissa & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (result & 1u))) result++;
        return sign | (uint16_t)result;
    }
    /* Normal: rebias exponent 127 -> 15 and round 23 -> 10 mantissa bits (carry may bump
     * the exponent, which is exactly right, up to the overflow bound checked above). */
    uint32_t rebased = abs - ((127u - 15u) << 23);
    uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return sign | (uint16_t)((rebased + rounding) >> 13);
}

float f16_to_f32(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1f) return bits_f32(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return bits_f32(sign);
        float value = (float)mantissa * (1.0f / 16777216.0f); /* exact: mantissa * 2^-24 */
        return sign ? -value : value;
    }
    return bits_f32(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}
