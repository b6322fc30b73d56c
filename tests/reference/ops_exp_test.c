/* ops_expf (reference/ops_exp.c), attention's exponential:
 *   - within 0.51 ulp of e^x (computed in long double) over a sweep of every 97th float of
 *     [-110, 88], and exact at the points that matter to softmax (e^0 = 1, underflow to 0
 *     below -104, overflow to inf above 89, NaN through, -inf to 0);
 *   - ops_expf16 gives ops_expf's bits on every path this CPU has (the AVX-512 lanes run
 *     the same double operations), over the same sweep. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "reference/ops.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Distance of got from the exact value in units of the float spacing at the exact value. */
static double ulps(float got, long double exact) {
    if (exact == 0.0L) return got == 0.0f ? 0.0 : INFINITY;
    int e;
    frexpl(exact, &e);
    long double spacing = ldexpl(1.0L, (e - 24 < -149 ? -149 : e - 24));
    return (double)(fabsl((long double)got - exact) / spacing);
}

static void test_accuracy(void **state) {
    (void)state;
    double worst = 0.0;
    float worst_x = 0.0f;
    long n = 0;
    /* Positive floats up to 88 (e^88.73 is past FLT_MAX), then negative ones down to -110,
     * every 97th bit pattern. */
    for (uint32_t u = 0; from_bits(u) <= 88.0f; u += 97, ++n) {
        const float x = from_bits(u);
        const double err = ulps(ops_expf(x), expl((long double)x));
        if (err > worst) worst = err, worst_x = x;
    }
    for (uint32_t u = 0x80000000u; from_bits(u) >= -110.0f; u += 97, ++n) {
        const float x = from_bits(u);
        const double err = ulps(ops_expf(x), expl((long double)x));
        if (err > worst) worst = err, worst_x = x;
    }
    printf("ops_expf: %ld points, worst %.4f ulp (at %a)\n", n, worst, (double)worst_x);
    assert_true(worst < 0.51);
    assert_true(ops_expf(0.0f) == 1.0f && ops_expf(-0.0f) == 1.0f);
    assert_true(ops_expf(-104.0f) == 0.0f && ops_expf(-1000.0f) == 0.0f);
    assert_true(ops_expf(-INFINITY) == 0.0f);
    assert_true(isinf(ops_expf(89.0f)) && isinf(ops_expf(INFINITY)));
    assert_true(isnan(ops_expf(NAN)));
    assert_true(ops_expf(-103.0f) > 0.0f); /* a subnormal, not flushed */
}

static void check_lanes(void) {
    float x[16], got[16];
    long n = 0;
    int k = 0;
    /* Every 61st pattern of [-110, 90] and the special values, 16 at a time. */
    static const float special[] = {0.0f,     -0.0f, -104.0f, -103.5f, 88.7f,  89.0f, -INFINITY,
                                    INFINITY, NAN,   -200.0f, -201.0f, 200.0f, 201.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; ++i)
        x[k++] = special[i];
    for (uint64_t u = 0; u <= 0xffffffffu; u += 61) {
        const float v = from_bits((uint32_t)u);
        if (!(v >= -110.0f && v <= 90.0f)) continue;
        x[k++] = v;
        if (k < 16) continue;
        ops_expf16(got, x);
        for (int i = 0; i < 16; ++i) {
            const float want = ops_expf(x[i]);
            if (to_bits(got[i]) != to_bits(want) && !(isnan(got[i]) && isnan(want)))
                fail_msg("%s path: ops_expf16(%a) = %a, ops_expf %a",
                         ops_path_name(ops_matmul_path()), (double)x[i], (double)got[i],
                         (double)want);
        }
        n += 16;
        k = 0;
    }
    printf("ops_expf16 == ops_expf on the %s path: %ld points\n", ops_path_name(ops_matmul_path()),
           n);
}

static void test_lanes(void **state) {
    (void)state;
    static const enum ops_path paths[] = {OPS_PATH_PORTABLE, OPS_PATH_AVX2, OPS_PATH_AVX512};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; ++p) {
        if (!ops_force_path(paths[p])) {
            printf("%s path: skipped (this CPU lacks it)\n", ops_path_name(paths[p]));
            continue;
        }
        check_lanes();
    }
    ops_force_path(OPS_PATH_AUTO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
