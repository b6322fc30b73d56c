/* cmocka tests for runtime/stage_plan: the even-split property over all L <= 200,
 * S <= L; explicit range checks; the memory-proportional planner against brute force;
 * the memory model against a real checkpoint; size parsing and formatting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "tests/test_util.h"

static void test_even_split_property(void **state) {
    (void)state;
    struct stage_range r[STAGE_PLAN_MAX_STAGES];
    for (int L = 1; L <= 200; ++L) {
        for (int S = 1; S <= L; ++S) {
            assert_int_equal(stage_plan_even(r, L, S), 0);
            int base = L / S, rem = L % S, expect_start = 0;
            for (int s = 0; s < S; ++s) {
                /* contiguous from 0, each of the formula's size, hence disjoint */
                assert_int_equal(r[s].layer_start, expect_start);
                assert_int_equal(r[s].layer_end - r[s].layer_start, base + (s < rem));
                expect_start = r[s].layer_end;
            }
            assert_int_equal(expect_start, L); /* covers [0, L) */
            assert_int_equal(stage_plan_check_ranges(r, S, L, 1), 0);
        }
        assert_int_equal(stage_plan_even(r, L, L + 1), STRATA_ERANGE);
    }
    assert_int_equal(stage_plan_even(r, 5, 0), STRATA_ERANGE);
    assert_int_equal(stage_plan_even(r, 0, 1), STRATA_EINVAL);
}

static void test_explicit_ranges(void **state) {
    (void)state;
    assert_int_equal(stage_plan_check_range(0, 4, 4), 0);
    assert_int_equal(stage_plan_check_range(3, 3, 4), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "empty"));
    assert_int_equal(stage_plan_check_range(2, 5, 4), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "outside"));
    assert_int_equal(stage_plan_check_range(-1, 2, 4), STRATA_ERANGE);
    assert_int_equal(stage_plan_check_range(3, 1, 4), STRATA_ERANGE);

    struct stage_range unordered[] = {{4, 8}, {0, 4}};
    assert_int_equal(stage_plan_check_ranges(unordered, 2, 8, 1), 0);
    struct stage_range overlap[] = {{0, 5}, {4, 8}};
    assert_int_equal(stage_plan_check_ranges(overlap, 2, 8, 0), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "overlap"));
    struct stage_range gap[] = {{0, 3}, {4, 8}};
    assert_int_equal(stage_plan_check_ranges(gap, 2, 8, 0), 0);
    assert_int_equal(stage_plan_check_ranges(gap, 2, 8, 1), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "[3, 4)"));
    struct stage_range short_end[] = {{0, 7}};
    assert_int_equal(stage_plan_check_ranges(short_end, 1, 8, 1), STRATA_ERANGE);
    assert_int_equal(stage_plan_check_ranges(short_end, 0, 8, 0), STRATA_EINVAL);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Max fraction of a plan. */
static double plan_max_fraction(const struct stage_plan *p, const uint64_t *mem) {
    double worst = 0;
    for (int s = 0; s < p->num_stages; ++s) {
        double f = (double)p->stages[s].total_bytes / (double)mem[s];
        if (f > worst) worst = f;
    }
    return worst;
}

/* Brute force over every split (all 2^(L-1) cut sets with S-1 cuts). */
static double brute_force(const struct stage_memory_model *mm, const uint64_t *mem, int S) {
    int L = mm->num_layers;
    double best = 1e300;
    struct stage_plan plan;
    for (uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
        if (__builtin_popcount(cuts) != S - 1) continue;
        struct stage_range r[16];
        int s = 0, start = 0;
        for (int l = 1; l < L; ++l) {
            if (cuts & (1u << (l - 1))) {
                r[s].layer_start = start;
                r[s++].layer_end = l;
                start = l;
            }
        }
        r[s].layer_start = start;
        r[s].layer_end = L;
        assert_int_equal(stage_plan_price(&plan, mm, r, S), 0);
        double f = plan_max_fraction(&plan, mem);
        if (f < best) best = f;
    }
    return best;
}

static void test_balanced_matches_brute_force(void **state) {
    (void)state;
    uint64_t rng = 42;
    struct stage_memory_model *mm = calloc(1, sizeof *mm);
    struct stage_plan *plan = calloc(1, sizeof *plan);
    for (int trial = 0; trial < 300; ++trial) {
        memset(mm, 0, sizeof *mm);
        int L = 1 + (int)(rng_next(&rng) % 10);
        int S = 1 + (int)(rng_next(&rng) % (L < 5 ? L : 5));
        mm->num_layers = L;
        for (int l = 0; l < L; ++l)
            mm->layer_weight_bytes[l] = 100 + rng_next(&rng) % 900;
        mm->embed_bytes = rng_next(&rng) % 2000;
        mm->norm_bytes = 10;
        mm->head_is_embed = (int)(rng_next(&rng) % 2);
        mm->head_bytes = mm->head_is_embed ? mm->embed_bytes : rng_next(&rng) % 2000;
        mm->kv_bytes_per_layer = rng_next(&rng) % 300;
        mm->workspace_bytes = 50;
        mm->logits_bytes = rng_next(&rng) % 100;
        uint64_t mem[8];
        for (int s = 0; s < S; ++s)
            mem[s] = 1000 + rng_next(&rng) % 10000;
        double expect = brute_force(mm, mem, S);
        int rc = stage_plan_balanced(plan, mm, mem, S);
        assert_int_equal(rc, expect <= 1.0 ? 0 : STRATA_ERANGE);
        assert_int_equal(plan->num_stages, S);
        struct stage_range r[8];
        for (int s = 0; s < S; ++s)
            r[s] = plan->stages[s].range;
        assert_int_equal(stage_plan_check_ranges(r, S, L, 1), 0);
        double got = plan_max_fraction(plan, mem);
        if (got > expect * (1 + 1e-12))
            fail_msg("trial %d L=%d S=%d: planner %.6f, optimum %.6f", trial, L, S, got, expect);
        if (rc != 0) assert_non_null(strstr(strata_last_error(), "does not fit"));
    }
    free(mm);
    free(plan);
}

/* The largest streamed bytes over the stages of the best split of [first, L) into the
 * stages s .. S-1 (exhaustive). */
static uint64_t decode_brute(const struct stage_memory_model *mm, int first, int s, int S) {
    const int L = mm->num_layers;
    if (s == S - 1) return stage_plan_streamed_bytes(mm, s, S, first, L);
    uint64_t best = UINT64_MAX;
    for (int end = first + 1; end <= L - (S - 1 - s); ++end) {
        uint64_t here = stage_plan_streamed_bytes(mm, s, S, first, end);
        uint64_t rest = decode_brute(mm, end, s + 1, S);
        uint64_t worst = here > rest ? here : rest;
        if (worst < best) best = worst;
    }
    return best;
}

/* stage_plan_decode: an optimum of the exhaustive search on random layer and head sizes,
 * the head counted on the last stage only, the embedding never (it is gathered). */
static void test_decode_split_matches_brute_force(void **state) {
    (void)state;
    uint64_t rng = 7;
    struct stage_memory_model *mm = calloc(1, sizeof *mm);
    for (int trial = 0; trial < 300; ++trial) {
        memset(mm, 0, sizeof *mm);
        int L = 1 + (int)(rng_next(&rng) % 12);
        int S = 1 + (int)(rng_next(&rng) % (L < 6 ? L : 6));
        mm->num_layers = L;
        for (int l = 0; l < L; ++l)
            mm->layer_weight_bytes[l] = 100 + rng_next(&rng) % 900;
        mm->embed_bytes = rng_next(&rng) % 5000;
        mm->norm_bytes = 10;
        mm->head_bytes = rng_next(&rng) % 5000;
        struct stage_range r[8];
        assert_int_equal(stage_plan_decode(r, mm, S), 0);
        assert_int_equal(stage_plan_check_ranges(r, S, L, 1), 0);
        uint64_t got = 0;
        for (int s = 0; s < S; ++s) {
            uint64_t b = stage_plan_streamed_bytes(mm, s, S, r[s].layer_start, r[s].layer_end);
            if (b > got) got = b;
        }
        uint64_t want = decode_brute(mm, 0, 0, S);
        if (got != want)
            fail_msg("trial %d L=%d S=%d: planner %llu, optimum %llu", trial, L, S,
                     (unsigned long long)got, (unsigned long long)want);
    }
    /* A head worth 3.5 layers: 8 layers of 10 over 2 stages -> [0, 6) (60) and [6, 8) + 35. */
    memset(mm, 0, sizeof *mm);
    mm->num_layers = 8;
    for (int l = 0; l < 8; ++l)
        mm->layer_weight_bytes[l] = 10;
    mm->head_bytes = 35;
    struct stage_range r[2];
    assert_int_equal(stage_plan_decode(r, mm, 2), 0);
    assert_int_equal(r[0].layer_end, 6);
    assert_int_equal(stage_plan_streamed_bytes(mm, 1, 2, 6, 8), 55);
    assert_int_equal(stage_plan_decode(r, mm, 9), STRATA_ERANGE);
    free(mm);
}

static void test_balanced_proportional(void **state) {
    (void)state;
    struct stage_memory_model *mm = calloc(1, sizeof *mm);
    struct stage_plan *plan = calloc(1, sizeof *plan);
    mm->num_layers = 30;
    for (int l = 0; l < 30; ++l)
        mm->layer_weight_bytes[l] = 1000;
    /* 2:1 memory -> 20 and 10 layers. */
    uint64_t mem[2] = {40000, 20000};
    assert_int_equal(stage_plan_balanced(plan, mm, mem, 2), 0);
    assert_int_equal(plan->stages[0].range.layer_end, 20);
    assert_int_equal(plan->stages[0].memory_bytes, 40000);
    /* A big embedding on stage 0 moves layers to stage 1. */
    mm->embed_bytes = 10000;
    assert_int_equal(stage_plan_balanced(plan, mm, mem, 2), 0);
    assert_true(plan->stages[0].range.layer_end < 20);
    /* Not enough memory anywhere. */
    uint64_t tiny[2] = {1000, 1000};
    assert_int_equal(stage_plan_balanced(plan, mm, tiny, 2), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "does not fit"));
    uint64_t zero[2] = {0, 1000};
    assert_int_equal(stage_plan_balanced(plan, mm, zero, 2), STRATA_EINVAL);
    assert_int_equal(stage_plan_balanced(plan, mm, mem, 31), STRATA_ERANGE);
    free(mm);
    free(plan);
}

static void test_memory_model_from_checkpoint(void **state) {
    (void)state;
    struct model_config cfg;
    const char *dir = test_path("tests/runtime/testdata/tiny_qwen3");
    assert_int_equal(model_config_load(&cfg, dir), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, dir), 0);
    struct stage_memory_options opt = {4, 100, 3, 8, 0};
    struct stage_memory_model *mm = calloc(1, sizeof *mm);
    assert_int_equal(stage_memory_model_build(mm, &cfg, st, &opt), 0);
    uint64_t sum = mm->embed_bytes + mm->norm_bytes + mm->head_bytes, total = 0;
    for (int l = 0; l < mm->num_layers; ++l)
        sum += mm->layer_weight_bytes[l];
    for (int i = 0; i < safetensors_count(st); ++i)
        total += safetensors_at(st, i)->nbytes;
    assert_true(sum == total);
    assert_true(mm->embed_bytes == 128 * 16 * 2);
    assert_int_equal(mm->head_is_embed, 0);
    /* 2 × nkv × D × 4 B × max_seq × batch */
    assert_true(mm->kv_bytes_per_layer == 2ull * 1 * 8 * 4 * 100 * 3);
    assert_true(mm->logits_bytes == 8ull * 128 * 4);

    struct stage_range r[2];
    struct stage_plan *plan = calloc(1, sizeof *plan);
    assert_int_equal(stage_plan_even(r, 4, 2), 0);
    assert_int_equal(stage_plan_price(plan, mm, r, 2), 0);
    assert_true(plan->stages[0].weight_bytes + plan->stages[1].weight_bytes == total);
    assert_true(plan->stages[1].kv_bytes == 2 * mm->kv_bytes_per_layer);
    assert_true(plan->stages[1].workspace_bytes == mm->workspace_bytes + mm->logits_bytes);
    assert_true(plan->stages[0].total_bytes == plan->stages[0].weight_bytes +
                                                   plan->stages[0].kv_bytes +
                                                   plan->stages[0].workspace_bytes);

    /* Without the checkpoint the bf16 estimate equals the exact bytes (all tensors bf16). */
    struct stage_memory_model *est = calloc(1, sizeof *est);
    assert_int_equal(stage_memory_model_build(est, &cfg, NULL, &opt), 0);
    assert_memory_equal(est->layer_weight_bytes, mm->layer_weight_bytes,
                        sizeof mm->layer_weight_bytes);
    assert_true(est->head_bytes == mm->head_bytes);

    /* Tied model on one stage counts the embedding once. */
    est->head_is_embed = 1;
    est->head_bytes = est->embed_bytes;
    struct stage_range one = {0, 4};
    assert_int_equal(stage_plan_price(plan, est, &one, 1), 0);
    assert_true(plan->stages[0].weight_bytes == total - mm->head_bytes);
    free(est);
    free(plan);
    free(mm);
    safetensors_close(st);
}

static void test_sizes(void **state) {
    (void)state;
    uint64_t v;
    assert_int_equal(stage_plan_parse_size(&v, "24G"), 0);
    assert_true(v == 24ull << 30);
    assert_int_equal(stage_plan_parse_size(&v, "1.5g"), 0);
    assert_true(v == 3ull << 29);
    assert_int_equal(stage_plan_parse_size(&v, "512M"), 0);
    assert_true(v == 512ull << 20);
    assert_int_equal(stage_plan_parse_size(&v, "7KiB"), 0);
    assert_true(v == 7 * 1024);
    assert_int_equal(stage_plan_parse_size(&v, "3GB"), 0);
    assert_true(v == 3ull << 30);
    assert_int_equal(stage_plan_parse_size(&v, "100"), 0);
    assert_true(v == 100);
    const char *bad[] = {"", "G", "-1G", "12X", "1e400", " 5G", "5G ", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        if (stage_plan_parse_size(&v, bad[i]) == 0) fail_msg("accepted \"%s\"", bad[i]);
    char buf[32];
    stage_plan_format_size(buf, sizeof buf, 512);
    assert_string_equal(buf, "512 B");
    stage_plan_format_size(buf, sizeof buf, 3ull << 29);
    assert_string_equal(buf, "1.50 GiB");
    stage_plan_format_size(buf, sizeof buf, 20ull << 20);
    assert_string_equal(buf, "20.0 MiB");
    stage_plan_format_size(buf, sizeof buf, 300ull << 10);
    assert_string_equal(buf, "300 KiB");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even_split_property),
        cmocka_unit_test(test_explicit_ranges),
        cmocka_unit_test(test_balanced_matches_brute_force),
        cmocka_unit_test(test_balanced_proportional),
        cmocka_unit_test(test_decode_split_matches_brute_force),
        cmocka_unit_test(test_memory_model_from_checkpoint),
        cmocka_unit_test(test_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
