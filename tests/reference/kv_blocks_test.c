/* The paged KV pool's bookkeeping (reference/kv_blocks.h): reservations are promises no other
 * slot can take, growth takes from the slot's own reservation first, a full pool is a clear
 * EBUSY, and every block returns when a slot is released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_blocks.h"
#include "runtime/base/status.h"

static void expect_busy(int rc, const char *words) {
    assert_int_equal(rc, STRATA_EBUSY);
    if (!strstr(strata_last_error(), words))
        fail_msg("'%s' does not say '%s'", strata_last_error(), words);
}

static void test_default_pool_holds_every_slot(void **state) {
    (void)state;
    struct kv_blocks b;
    assert_int_equal(kv_blocks_init(&b, 40, 3, 0), 0); /* 3 blocks per slot */
    assert_int_equal(b.slot_blocks, 3);
    assert_int_equal(b.num_blocks, 9);
    int s[3];
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(kv_blocks_acquire(&b, &s[i]), 0);
        assert_int_equal(kv_blocks_grow(&b, s[i], 40), 0);
    }
    assert_int_equal(b.num_free, 0);
    expect_busy(kv_blocks_acquire(&b, &(int){0}), "all 3 slots");
    assert_int_equal(kv_blocks_grow(&b, s[0], 41), STRATA_ERANGE);
    for (int i = 0; i < 3; ++i)
        kv_blocks_release(&b, s[i]);
    assert_int_equal(b.num_free, 9);
    kv_blocks_free(&b);
}

static void test_reservations(void **state) {
    (void)state;
    struct kv_blocks b;
    int a, c, d;
    assert_int_equal(kv_blocks_init(&b, 64, 4, 6), 0);
    assert_int_equal(kv_blocks_acquire(&b, &a), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 50), 0); /* 4 blocks promised */
    assert_int_equal(b.promised, 4);
    assert_int_equal(kv_blocks_available(&b), 2);
    assert_int_equal(kv_blocks_reserve(&b, -1, 32), 0); /* a question: 2 fit */
    expect_busy(kv_blocks_reserve(&b, -1, 33), "need 3 more blocks");
    assert_int_equal(b.promised, 4); /* asking promised nothing */
    assert_int_equal(kv_blocks_acquire(&b, &c), 0);
    expect_busy(kv_blocks_reserve(&b, c, 48), "2 of 6 are free");
    assert_int_equal(kv_blocks_reserve(&b, c, 20), 0); /* 2 blocks */
    /* Nobody else can take a promised block; growth inside a reservation never fails. */
    assert_int_equal(kv_blocks_acquire(&b, &d), 0);
    expect_busy(kv_blocks_grow(&b, d, 1), "the pool is full");
    assert_int_equal(kv_blocks_grow(&b, a, 17), 0); /* 2 of its 4 */
    assert_int_equal(b.held[a], 2);
    assert_int_equal(b.reserved[a], 2);
    assert_int_equal(kv_blocks_grow(&b, c, 32), 0);
    assert_int_equal(kv_blocks_grow(&b, a, 64), 0); /* all 4 */
    assert_int_equal(b.num_free, 0);
    assert_int_equal(b.promised, 0);
    /* Every block is a different one. */
    int seen[6] = {0};
    for (int i = 0; i < b.held[a]; ++i)
        seen[kv_blocks_table(&b, a)[i]]++;
    for (int i = 0; i < b.held[c]; ++i)
        seen[kv_blocks_table(&b, c)[i]]++;
    for (int i = 0; i < 6; ++i)
        assert_int_equal(seen[i], 1);
    /* Released: its blocks are free at once, for the waiting slot. */
    kv_blocks_release(&b, a);
    assert_int_equal(b.num_free, 4);
    assert_int_equal(kv_blocks_grow(&b, d, 64), 0);
    kv_blocks_release(&b, c);
    kv_blocks_release(&b, d);
    assert_int_equal(b.num_free, 6);
    assert_int_equal(b.promised, 0);
    kv_blocks_free(&b);
}

/* A released reservation lapses; re-reserving replaces, it does not add. */
static void test_reservation_lapses(void **state) {
    (void)state;
    struct kv_blocks b;
    int a;
    assert_int_equal(kv_blocks_init(&b, 64, 2, 4), 0);
    assert_int_equal(kv_blocks_acquire(&b, &a), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 64), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 16), 0);
    assert_int_equal(b.promised, 1);
    assert_int_equal(kv_blocks_grow(&b, a, 16), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 30), 0); /* one more beyond the one held */
    assert_int_equal(b.promised, 1);
    kv_blocks_release(&b, a);
    assert_int_equal(b.promised, 0);
    assert_int_equal(b.num_free, 4);
    kv_blocks_release(&b, a); /* twice: nothing */
    assert_int_equal(b.num_free, 4);
    assert_int_equal(kv_blocks_reserve(&b, a, 16), STRATA_EINVAL); /* not in use */
    kv_blocks_free(&b);
    assert_int_equal(kv_blocks_init(&b, 0, 1, 0), STRATA_EINVAL);
    kv_blocks_free(&b);
}

/* Registered blocks outlive their request, are attached to a later one with the same keys
 * (shared, not copied), and are the first taken, least recently used first, when no block is
 * free. */
static void test_prefix_reuse(void **state) {
    (void)state;
    struct kv_blocks b;
    const uint64_t keys[4] = {11, 22, 33, 44}, other[2] = {11, 99};
    int a, c, d, idle;
    assert_int_equal(kv_blocks_init(&b, 64, 3, 6), 0);
    assert_int_equal(kv_blocks_acquire(&b, &a), 0);
    assert_int_equal(kv_blocks_grow(&b, a, 50), 0); /* 4 blocks, 3 of them full */
    const int32_t first = kv_blocks_table(&b, a)[0], second = kv_blocks_table(&b, a)[1];
    kv_blocks_register(&b, a, keys, 3);
    assert_int_equal(kv_blocks_lookup(&b, keys, 4, &idle), 3);
    assert_int_equal(idle, 0); /* still held */
    kv_blocks_release(&b, a);
    assert_int_equal(b.num_cached, 3);
    assert_int_equal(b.num_free, 3);
    assert_int_equal(kv_blocks_available(&b), 6);
    assert_int_equal(kv_blocks_lookup(&b, keys, 4, &idle), 3);
    assert_int_equal(idle, 3);
    assert_int_equal(kv_blocks_lookup(&b, other, 2, NULL), 1);
    /* Two requests share the first two blocks. */
    assert_int_equal(kv_blocks_acquire(&b, &c), 0);
    assert_int_equal(kv_blocks_attach(&b, c, keys, 2, 32), 2);
    assert_int_equal(b.len[c], 32);
    assert_int_equal(kv_blocks_acquire(&b, &d), 0);
    assert_int_equal(kv_blocks_attach(&b, d, other, 2, 32), 1);
    assert_int_equal(kv_blocks_table(&b, c)[0], first);
    assert_int_equal(kv_blocks_table(&b, d)[0], first);
    assert_int_equal(kv_blocks_table(&b, c)[1], second);
    assert_int_equal(b.refs[first], 2);
    assert_int_equal(b.num_cached, 1);                                     /* keys[2]'s block */
    assert_int_equal(kv_blocks_attach(&b, c, keys, 2, 32), STRATA_EINVAL); /* not fresh */
    kv_blocks_release(&b, d);
    assert_int_equal(b.refs[first], 1);
    kv_blocks_release(&b, c);
    assert_int_equal(b.num_cached, 3);
    /* Pressure: a request of 4 blocks (reserved: cached blocks count as available) takes
     * the 3 free ones, then the least recently used cached one: keys[2]'s, cached first and
     * never attached since. */
    assert_int_equal(kv_blocks_acquire(&b, &a), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 64), 0);
    assert_int_equal(kv_blocks_grow(&b, a, 64), 0);
    assert_int_equal(b.num_free, 0);
    assert_int_equal(b.num_cached, 2);
    assert_int_equal(kv_blocks_lookup(&b, keys, 4, NULL), 2);
    assert_int_equal(kv_blocks_lookup(&b, keys + 2, 1, NULL), 0);
    kv_blocks_release(&b, a);
    assert_int_equal(b.num_free + b.num_cached, 6);
    kv_blocks_free(&b);
}

/* Many keys in and out of the index (its deletion shifts runs back): lookups stay right. */
static void test_index_churn(void **state) {
    (void)state;
    struct kv_blocks b;
    enum { N = 40 };
    uint64_t keys[N];
    int s;
    assert_int_equal(kv_blocks_init(&b, N * KV_BLOCK, 1, N), 0);
    for (int round = 0; round < 30; ++round) {
        assert_int_equal(kv_blocks_acquire(&b, &s), 0);
        const int n = 5 + (round * 7) % (N - 5);
        for (int i = 0; i < n; ++i) /* keys that collide in the low bits */
            keys[i] = ((uint64_t)(round * 131 + i) << 32) | 0x10;
        assert_int_equal(kv_blocks_grow(&b, s, n * KV_BLOCK), 0);
        kv_blocks_register(&b, s, keys, n);
        kv_blocks_release(&b, s);
        assert_int_equal(kv_blocks_lookup(&b, keys, n, NULL), n);
        assert_int_equal(b.num_free + b.num_cached, N);
    }
    kv_blocks_free(&b);
}

/* Speculative decoding's rejected rows: the length drops, the blocks stay the slot's (its
 * reservation paid for them) and growing again over them takes nothing from the pool. */
static void test_truncate(void **state) {
    (void)state;
    struct kv_blocks b;
    int a;
    assert_int_equal(kv_blocks_init(&b, 64, 2, 8), 0);
    assert_int_equal(kv_blocks_acquire(&b, &a), 0);
    assert_int_equal(kv_blocks_reserve(&b, a, 40), 0);
    assert_int_equal(kv_blocks_grow(&b, a, 37), 0);
    b.len[a] = 37; /* a forward's bookkeeping */
    const int free_before = b.num_free, held = b.held[a];
    assert_int_equal(kv_blocks_truncate(&b, a, 30), 0);
    assert_int_equal(b.len[a], 30);
    assert_int_equal(b.held[a], held);
    assert_int_equal(kv_blocks_grow(&b, a, 37), 0);
    assert_int_equal(b.num_free, free_before);
    assert_int_equal(kv_blocks_truncate(&b, a, 31), STRATA_ERANGE); /* never grows */
    if (!strstr(strata_last_error(), "holds 30 positions")) fail_msg("'%s'", strata_last_error());
    assert_int_equal(kv_blocks_truncate(&b, 1, 0), STRATA_EINVAL); /* not in use */
    kv_blocks_release(&b, a);
    assert_int_equal(b.num_free, 8);
    kv_blocks_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_pool_holds_every_slot),
        cmocka_unit_test(test_reservations),
        cmocka_unit_test(test_reservation_lapses),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_index_churn),
        cmocka_unit_test(test_truncate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
