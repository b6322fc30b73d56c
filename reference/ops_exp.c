/* ops_expf (reference/ops.h): attention's exponential, defined here rather than taken from
 * libm so that its bits are the project's own on every machine and C library, and so that
 * the vector loops (ops_attention_simd.c) can compute the same values 16 at a time.
 *
 * exp(x) = 2^(k/32) * 2^(r/32) with x * 32/ln2 = k + r, k the nearest integer (ties to even)
 * and |r| <= 1/2: 2^(k/32) is a table entry (2^(i/32), i = k mod 32, each correctly rounded)
 * times 2^floor(k/32) put into the exponent; 2^(r/32) = e^(r ln2/32) is its Taylor series to
 * the 4th power (truncation error below 1e-12 relative). All in double, one operation per
 * statement (never fused), then rounded once to float: within about half an ulp of exp(x). */
#include <stdint.h>
#include <string.h>

#include "reference/ops.h"
#include "reference/ops_attention_simd.h"

const double ops_exp_table[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};

float ops_expf(float x) {
    /* Clamped to [-200, 200] (exp underflows float to 0 below -104 and overflows above 89;
     * double holds e^±200 exactly enough), NaN passing through: the vector max / min keep
     * their second operand when one is NaN, and so do these. */
    float c = OPS_EXP_LO > x ? OPS_EXP_LO : x;
    c = OPS_EXP_HI < c ? OPS_EXP_HI : c;
    const double z = (double)c * OPS_EXP_INV_LN2_32;
    const double shifted = z + OPS_EXP_SHIFT; /* k in the low bits, rounded to nearest even */
    const double kd = shifted - OPS_EXP_SHIFT;
    const double r = z - kd;
    uint64_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    const int64_t k = (int64_t)(int32_t)(uint32_t)bits;
    uint64_t sbits;
    memcpy(&sbits, &ops_exp_table[k & 31], sizeof sbits);
    sbits += (uint64_t)(k >> 5) << 52;
    double s;
    memcpy(&s, &sbits, sizeof s);
    double p = r * OPS_EXP_A4;
    p = p + OPS_EXP_A3;
    p = p * r;
    p = p + OPS_EXP_A2;
    p = p * r;
    p = p + OPS_EXP_A1;
    p = p * r;
    p = p + 1.0;
    return (float)(s * p);
}

void ops_expf16(float *dst, const float *src) {
    if (attn_avx512_enabled()) {
        attn_exp16_avx512(dst, src);
        return;
    }
    if (attn_simd_enabled()) {
        attn_exp8_avx2(dst, src);
        attn_exp8_avx2(dst + 8, src + 8);
        return;
    }
    for (int i = 0; i < 16; ++i)
        dst[i] = ops_expf(src[i]);
}
