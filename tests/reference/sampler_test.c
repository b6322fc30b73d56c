/* Sampler: greedy is torch.argmax (first maximum); seeded sampling replays; top-k 1 and a tiny
 * top-p collapse to greedy; temperature sampling follows the softmax distribution. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "reference/sampler.h"

static void test_greedy_first_max(void **state) {
    (void)state;
    float logits[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
    assert_int_equal(argmax(logits, 5), 1);
    struct sampler s;
    struct sampler_params p = {0.0f, 0, 1.0f, 7};
    sampler_init(&s, &p);
    assert_int_equal(sampler_sample(&s, logits, 5, NULL), 1);
}

/* The vocab-parallel argmax (argmax_part per part, argmax_merge in part order) against
 * argmax() of the whole row, for every way of cutting it into 1 to 4 contiguous parts. */
static int split_argmax(const float *x, const int *cuts, int parts) {
    struct argmax_candidate c[4];
    for (int p = 0; p < parts; ++p)
        c[p] = argmax_part(x + cuts[p], cuts[p + 1] - cuts[p], cuts[p]);
    return argmax_merge(c, parts);
}

static void check_every_split(const float *x, int n) {
    const int want = argmax(x, n);
    for (unsigned mask = 0; mask < 1u << (n - 1); ++mask) { /* bit i: a cut after id i */
        int cuts[5] = {0}, parts = 0;
        for (int i = 0; i < n - 1 && parts < 4; ++i)
            if (mask >> i & 1) cuts[++parts] = i + 1;
        if (__builtin_popcount(mask) > 3) continue; /* at most 4 parts */
        cuts[++parts] = n;
        const int got = split_argmax(x, cuts, parts);
        if (got != want) fail_msg("%d parts (cuts 0x%x): id %d, argmax %d", parts, mask, got, want);
    }
}

static void test_split_argmax_ties(void **state) {
    (void)state;
    const float inf = INFINITY, nan = NAN;
    /* ties inside a part, across parts (the lower id must win), +-0, -inf only, and NaN
     * anywhere (argmax() skips a NaN unless it is at id 0) */
    const float rows[][8] = {
        {1, 3, 3, 2, 3, 0, 3, 1},
        {3, 3, 3, 3, 3, 3, 3, 3},
        {0, 1, 2, 3, 4, 5, 6, 7},
        {7, 6, 5, 4, 3, 2, 1, 0},
        {-0.0f, 0.0f, -0.0f, 0, 0, 0, 0, 0},
        {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {nan, 1, 2, 9, 9, 3, 2, 1},
        {1, nan, 2, nan, 5, nan, 5, 2},
        {1, 2, 3, 4, nan, 9, 9, nan},
        {nan, nan, nan, nan, nan, nan, nan, nan},
        {-inf, nan, nan, -inf, nan, -inf, nan, nan},
        {2, 1, nan, nan, nan, nan, nan, 2},
        {inf, 1, inf, 2, nan, inf, 3, 4},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; ++r)
        check_every_split(rows[r], 8);
    /* random rows with few distinct values (many ties) */
    uint64_t z = 42;
    for (int t = 0; t < 200; ++t) {
        float x[11];
        for (int i = 0; i < 11; ++i) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((z >> 60) % 4);
        }
        check_every_split(x, 11);
    }
}

static void test_seed_replays(void **state) {
    (void)state;
    enum { V = 50 };
    float logits[V];
    for (int i = 0; i < V; ++i)
        logits[i] = sinf((float)i) * 2.0f;
    float scratch[2 * V];
    struct sampler_params p = {0.9f, 20, 0.95f, 42};
    struct sampler_params other_seed = p;
    other_seed.seed = 43;
    struct sampler a, b, c;
    sampler_init(&a, &p);
    sampler_init(&b, &p);
    sampler_init(&c, &other_seed);
    int differ = 0, seeds_differ = 0;
    for (int i = 0; i < 100; ++i) {
        int ta = sampler_sample(&a, logits, V, scratch),
            tb = sampler_sample(&b, logits, V, scratch);
        assert_int_equal(ta, tb);
        differ |= ta != argmax(logits, V);
        seeds_differ |= ta != sampler_sample(&c, logits, V, scratch);
    }
    assert_true(differ);       /* temperature 0.9 over 20 candidates is not greedy */
    assert_true(seeds_differ); /* the seed drives the draws */
}

/* sampler_skip(n) leaves the sampler where n samples would have (recovery resumes a
 * request's sampler at step n this way), at temperature > 0 with cuts and greedy. */
static void test_skip_equals_sampling(void **state) {
    (void)state;
    enum { V = 40 };
    float logits[V], scratch[2 * V];
    for (int i = 0; i < V; ++i)
        logits[i] = cosf((float)i * 0.7f) * 3.0f;
    const struct sampler_params cases[3] = {
        {0.8f, 0, 1.0f, 5}, {1.1f, 7, 0.9f, 99}, {0.0f, 0, 1.0f, 3}};
    for (int c = 0; c < 3; ++c) {
        for (int n = 0; n < 20; n += 7) {
            struct sampler run, skipped;
            sampler_init(&run, &cases[c]);
            sampler_init(&skipped, &cases[c]);
            for (int i = 0; i < n; ++i)
                (void)sampler_sample(&run, logits, V, scratch);
            sampler_skip(&skipped, n);
            for (int i = 0; i < 30; ++i)
                assert_int_equal(sampler_sample(&run, logits, V, scratch),
                                 sampler_sample(&skipped, logits, V, scratch));
        }
    }
}

static void test_cuts_collapse_to_greedy(void **state) {
    (void)state;
    enum { V = 30 };
    float logits[V];
    for (int i = 0; i < V; ++i)
        logits[i] = cosf((float)i * 1.7f);
    float scratch[2 * V];
    struct sampler s;
    struct sampler_params topk1 = {1.5f, 1, 1.0f, 3}, tiny_p = {1.5f, 0, 1e-6f, 3};
    sampler_init(&s, &topk1);
    for (int i = 0; i < 20; ++i)
        assert_int_equal(sampler_sample(&s, logits, V, scratch), argmax(logits, V));
    sampler_init(&s, &tiny_p);
    for (int i = 0; i < 20; ++i)
        assert_int_equal(sampler_sample(&s, logits, V, scratch), argmax(logits, V));
}

static void test_distribution(void **state) {
    (void)state;
    float logits[3] = {0.0f, logf(2.0f), logf(7.0f)}; /* probabilities 0.1, 0.2, 0.7 */
    float scratch[2 * 3];
    struct sampler s;
    struct sampler_params p = {1.0f, 0, 1.0f, 99};
    sampler_init(&s, &p);
    int counts[3] = {0, 0, 0}, n = 20000;
    for (int i = 0; i < n; ++i)
        counts[sampler_sample(&s, logits, 3, scratch)]++;
    assert_true(fabs(counts[0] / (double)n - 0.1) < 0.015);
    assert_true(fabs(counts[2] / (double)n - 0.7) < 0.015);
    /* top-k 2 keeps {2, 1}: token 0 never appears, token 1 does. */
    struct sampler_params top2 = {1.0f, 2, 1.0f, 6};
    int saw_one = 0;
    sampler_init(&s, &top2);
    for (int i = 0; i < 2000; ++i) {
        int t = sampler_sample(&s, logits, 3, scratch);
        assert_int_not_equal(t, 0);
        saw_one |= t == 1;
    }
    assert_true(saw_one);
    /* top-p 0.75 keeps {2, 1} (0.7 then 0.9 >= 0.75): token 0 never appears. */
    struct sampler_params nucleus = {1.0f, 0, 0.75f, 5};
    sampler_init(&s, &nucleus);
    for (int i = 0; i < 2000; ++i)
        assert_int_not_equal(sampler_sample(&s, logits, 3, scratch), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_first_max),     cmocka_unit_test(test_seed_replays),
        cmocka_unit_test(test_skip_equals_sampling), cmocka_unit_test(test_cuts_collapse_to_greedy),
        cmocka_unit_test(test_distribution),         cmocka_unit_test(test_split_argmax_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
