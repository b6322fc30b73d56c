/* KV handoff: pack slots of a reference kv_cache (the cache's owner packs: kv_cache_pack),
 * carry them as a KvBlock frame (runtime/stage/kv_block.h), read it back and restore it
 * into another cache with the same layer range, bit for bit; refusals for a different
 * layer range, too little capacity, lossy payloads and bad slots. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/kv_block.h"
#include "wire/wire.h"

enum { LAYER_START = 4, LAYER_END = 8, KV_HEADS = 2, HEAD_DIM = 8, MAX_SEQ = 16 };

static uint32_t rng = 12345;
static float next_float(void) {
    rng = rng * 1664525u + 1013904223u;
    uint32_t bits = (rng >> 9) | 0x3f800000u; /* [1, 2) with random mantissa */
    float f;
    memcpy(&f, &bits, 4);
    return (rng & 1) ? f - 1.5f : 1.5f - f;
}

/* Position pos of kv head h of (slot, layer): its keys (which 0) or values (1). */
static float *at(const struct kv_cache *kv, int slot, int layer, int h, int pos, int which) {
    const struct ops_kv view = kv_cache_view(kv, slot, layer);
    return (float *)(which ? view.v : view.k) + ops_kv_offset(&view, h, pos, kv->head_dim);
}

static void fill_slot(struct kv_cache *kv, int slot, int len) {
    assert_int_equal(kv_blocks_grow(&kv->blocks, slot, len), 0);
    for (int l = kv->layer_start; l < kv->layer_end; ++l)
        for (int h = 0; h < kv->num_kv_heads; ++h)
            for (int p = 0; p < len; ++p)
                for (int d = 0; d < kv->head_dim; ++d) {
                    at(kv, slot, l, h, p, 0)[d] = next_float();
                    at(kv, slot, l, h, p, 1)[d] = next_float();
                }
    kv->blocks.len[slot] = len;
}

static void assert_slots_equal(const struct kv_cache *a, int slot_a, const struct kv_cache *b,
                               int slot_b) {
    assert_int_equal(a->blocks.len[slot_a], b->blocks.len[slot_b]);
    size_t n = (size_t)a->head_dim * sizeof(float);
    for (int l = a->layer_start; l < a->layer_end; ++l)
        for (int h = 0; h < a->num_kv_heads; ++h)
            for (int p = 0; p < a->blocks.len[slot_a]; ++p)
                for (int which = 0; which < 2; ++which)
                    assert_memory_equal(at(a, slot_a, l, h, p, which),
                                        at(b, slot_b, l, h, p, which), n);
}

struct fixture {
    struct kv_cache source;
    struct kv_handoff pack;
    struct wire_arena arena;
    struct wire_kv_block block; /* read back from the frame */
    struct kv_handoff view;     /* of `block`'s bytes */
};

static int setup(void **state) {
    static struct fixture f;
    memset(&f, 0, sizeof f);
    int slot;
    if (kv_cache_init(&f.source, LAYER_START, LAYER_END, KV_HEADS, HEAD_DIM, MAX_SEQ, 3, 0,
                      OPS_F32))
        return -1;
    for (int i = 0; i < 3; ++i)
        kv_cache_acquire(&f.source, &slot);
    fill_slot(&f.source, 0, 5);
    fill_slot(&f.source, 2, 11);
    const int slots[2] = {2, 0};
    struct wire_kv_block out;
    if (kv_cache_pack(&f.pack, &f.source, slots, 2)) return -1;
    kv_block_from_handoff(&out, &f.pack);
    out.stage_from = 1;
    out.stage_to = 2;
    out.nonce = 77;
    if (wire_arena_init(&f.arena, 0) || wire_build_kv_block(&f.arena, &out)) return -1;
    if (wire_read_kv_block(&f.block, wire_arena_frame(&f.arena), wire_arena_frame_len(&f.arena)))
        return -1;
    if (kv_block_to_handoff(&f.view, &f.block)) return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    struct fixture *f = *state;
    wire_arena_free(&f->arena);
    kv_handoff_free(&f->pack);
    kv_cache_free(&f->source);
    return 0;
}

static void packed_layout_is_l_b_heads_s_d(void **state) {
    struct fixture *f = *state;
    const struct wire_tensor *k = &f->block.k;
    const int64_t want[5] = {LAYER_END - LAYER_START, 2, KV_HEADS, 11, HEAD_DIM};
    assert_int_equal(k->ndim, 5);
    assert_memory_equal(k->shape, want, sizeof want);
    assert_int_equal(f->block.num_lengths, 2);
    assert_int_equal(f->block.lengths[0], 11);
    assert_int_equal(f->block.lengths[1], 5);
    assert_int_equal(f->block.nonce, 77);
    /* Element [l=1, b=1, h=1, s=3, d=2] is layer 5, slot 0, head 1, position 3. */
    const float *data = k->data;
    size_t index = ((((size_t)1 * 2 + 1) * KV_HEADS + 1) * 11 + 3) * HEAD_DIM + 2;
    assert_memory_equal(&data[index], &at(&f->source, 0, 5, 1, 3, 0)[2], 4);
    /* Row b=1 holds 5 positions: positions 5..10 are zero padding. */
    index = ((((size_t)0 * 2 + 1) * KV_HEADS + 0) * 11 + 7) * HEAD_DIM;
    for (int d = 0; d < HEAD_DIM; ++d)
        assert_true(data[index + d] == 0.0f);
}

static void restore_is_bit_exact(void **state) {
    struct fixture *f = *state;
    struct kv_cache target;
    int slot;
    assert_int_equal(
        kv_cache_init(&target, LAYER_START, LAYER_END, KV_HEADS, HEAD_DIM, MAX_SEQ, 2, 0, OPS_F32),
        0);
    kv_cache_acquire(&target, &slot);
    kv_cache_acquire(&target, &slot);
    const int slots[2] = {0, 1};
    assert_int_equal(kv_cache_restore(&target, slots, 2, &f->view), 0);
    assert_slots_equal(&f->source, 2, &target, 0);
    assert_slots_equal(&f->source, 0, &target, 1);
    kv_cache_free(&target);
}

static void different_range_or_shape_is_refused(void **state) {
    struct fixture *f = *state;
    struct kv_cache other;
    int slot;
    const int slots[2] = {0, 1};
    assert_int_equal(kv_cache_init(&other, 0, 4, KV_HEADS, HEAD_DIM, MAX_SEQ, 2, 0, OPS_F32), 0);
    kv_cache_acquire(&other, &slot);
    kv_cache_acquire(&other, &slot);
    assert_int_equal(kv_cache_restore(&other, slots, 2, &f->view), STRATA_ERANGE);
    assert_non_null(
        strstr(strata_last_error(), "block holds layers [4, 8) but the cache holds [0, 4)"));
    kv_cache_free(&other);

    assert_int_equal(
        kv_cache_init(&other, LAYER_START, LAYER_END, KV_HEADS, HEAD_DIM, 8, 2, 0, OPS_F32), 0);
    kv_cache_acquire(&other, &slot);
    kv_cache_acquire(&other, &slot);
    assert_int_equal(kv_cache_restore(&other, slots, 2, &f->view), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "11 positions, cache capacity 8"));
    kv_cache_free(&other);

    assert_int_equal(
        kv_cache_init(&other, LAYER_START, LAYER_END, 1, HEAD_DIM, MAX_SEQ, 2, 0, OPS_F32), 0);
    kv_cache_acquire(&other, &slot);
    kv_cache_acquire(&other, &slot);
    assert_int_equal(kv_cache_restore(&other, slots, 2, &f->view), STRATA_EFORMAT);
    assert_int_equal(kv_cache_restore(&other, slots, 1, &f->view), STRATA_EFORMAT);
    kv_cache_release(&other, 1);
    kv_cache_free(&other);
}

static void lossy_block_and_bad_slots_are_refused(void **state) {
    struct fixture *f = *state;
    struct kv_cache target;
    int slot;
    assert_int_equal(
        kv_cache_init(&target, LAYER_START, LAYER_END, KV_HEADS, HEAD_DIM, MAX_SEQ, 2, 0, OPS_F32),
        0);
    kv_cache_acquire(&target, &slot);
    const int slots[2] = {0, 1};
    assert_int_equal(kv_cache_restore(&target, slots, 2, &f->view),
                     STRATA_EINVAL); /* slot 1 not in use */
    struct wire_kv_block lossy = f->block;
    struct kv_handoff view;
    lossy.k.codec = WIRE_CODEC_BF16;
    assert_int_equal(kv_block_to_handoff(&view, &lossy), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "exact restore needs f32/none"));
    lossy = f->block;
    lossy.num_lengths = 1; /* fewer lengths than batch rows */
    assert_int_equal(kv_block_to_handoff(&view, &lossy), STRATA_EFORMAT);
    struct kv_handoff pack;
    const int missing[1] = {1};
    assert_int_equal(kv_cache_pack(&pack, &f->source, missing, 0), STRATA_EINVAL);
    kv_cache_release(&f->source, 1);
    assert_int_equal(kv_cache_pack(&pack, &f->source, missing, 1), STRATA_EINVAL);
    kv_handoff_free(&pack);
    kv_cache_free(&target);
}

/* A 16-bit cache: its pack (f32 on the wire, exact) restores into a cache storing the same
 * dtype with every stored element's bits, through the KvBlock frame; a cache storing
 * another dtype refuses it, naming both. */
static void restore_keeps_the_stored_dtype(void **state) {
    (void)state;
    const enum ops_dtype dtypes[2] = {OPS_BF16, OPS_F16};
    for (int t = 0; t < 2; ++t) {
        struct kv_cache a, b, c;
        int sa, sb, sc;
        const int len = 13, D = HEAD_DIM, nkv = KV_HEADS;
        assert_int_equal(
            kv_cache_init(&a, LAYER_START, LAYER_END, nkv, D, MAX_SEQ, 2, 0, dtypes[t]), 0);
        assert_int_equal(
            kv_cache_init(&b, LAYER_START, LAYER_END, nkv, D, MAX_SEQ, 2, 0, dtypes[t]), 0);
        assert_int_equal(kv_cache_init(&c, LAYER_START, LAYER_END, nkv, D, MAX_SEQ, 2, 0, OPS_F32),
                         0);
        assert_int_equal(kv_cache_acquire(&a, &sa), 0);
        assert_int_equal(kv_cache_acquire(&b, &sb), 0);
        assert_int_equal(kv_cache_acquire(&c, &sc), 0);
        float rows_k[32 * KV_HEADS * HEAD_DIM], rows_v[32 * KV_HEADS * HEAD_DIM];
        for (size_t i = 0; i < sizeof rows_k / sizeof *rows_k; ++i) {
            rows_k[i] = next_float();
            rows_v[i] = next_float();
        }
        assert_int_equal(kv_blocks_grow(&a.blocks, sa, len), 0);
        for (int l = LAYER_START; l < LAYER_END; ++l) {
            const struct ops_kv view = kv_cache_view(&a, sa, l);
            kv_store(&view, rows_k, rows_v, nkv * D, 0, len, nkv, D);
        }
        a.blocks.len[sa] = len;
        struct kv_handoff h;
        assert_int_equal(kv_cache_pack(&h, &a, &sa, 1), 0);
        assert_int_equal(h.stored_dtype, (int)dtypes[t]);
        struct wire_arena arena;
        struct wire_kv_block msg, read;
        struct kv_handoff back;
        wire_arena_init(&arena, 0);
        kv_block_from_handoff(&msg, &h);
        assert_int_equal(wire_build_kv_block(&arena, &msg), 0);
        assert_int_equal(
            wire_read_kv_block(&read, wire_arena_frame(&arena), wire_arena_frame_len(&arena)), 0);
        assert_int_equal(kv_block_to_handoff(&back, &read), 0);
        assert_int_equal(kv_cache_restore(&b, &sb, 1, &back), 0);
        const size_t es = ops_kv_elem_bytes(dtypes[t]);
        for (int l = LAYER_START; l < LAYER_END; ++l) {
            const struct ops_kv va = kv_cache_view(&a, sa, l), vb = kv_cache_view(&b, sb, l);
            for (int g = 0; g < nkv; ++g)
                for (int p = 0; p < len; ++p) {
                    const size_t oa = ops_kv_offset(&va, g, p, D) * es,
                                 ob = ops_kv_offset(&vb, g, p, D) * es;
                    assert_memory_equal((char *)va.k + oa, (char *)vb.k + ob, (size_t)D * es);
                    assert_memory_equal((char *)va.v + oa, (char *)vb.v + ob, (size_t)D * es);
                }
        }
        assert_int_equal(kv_cache_restore(&c, &sc, 1, &back), STRATA_EFORMAT);
        assert_non_null(strstr(strata_last_error(),
                               dtypes[t] == OPS_BF16 ? "stored as bf16" : "stored as f16"));
        wire_arena_free(&arena);
        kv_handoff_free(&h);
        kv_cache_free(&a);
        kv_cache_free(&b);
        kv_cache_free(&c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(packed_layout_is_l_b_heads_s_d),
        cmocka_unit_test(restore_is_bit_exact),
        cmocka_unit_test(different_range_or_shape_is_refused),
        cmocka_unit_test(lossy_block_and_bad_slots_are_refused),
        cmocka_unit_test(restore_keeps_the_stored_dtype),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
