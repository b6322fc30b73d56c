/* cmocka tests of the resumable vision transfer (runtime/stage/vision_xfer.h): every frame
 * goes through the wire builder and reader; a transfer whose connection drops after block k,
 * for every k and several block sizes, losing either block k itself or only its
 * acknowledgement, resumes to a Request frame byte-identical to an unbroken transfer's, with
 * DeepStack sent once; refusals (gaps, no block 0, mismatched sizes, limits, an incomplete
 * transfer) are clear; idle assemblies expire. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/stage/vision_xfer.h"
#include "wire/message.h"

#define T 24 /* image tokens: the qwen3_vl e2e golden's two images */
#define H 64
#define K 2
#define NONCE 0x1234567890ull

static float embeds[T * H], deepstack[K * T * H];
static const int32_t prompt[3] = {502, 500, 503};
static const int32_t grids[3] = {1, 8, 12};

static void fill(void) {
    uint32_t x = 12345;
    for (int i = 0; i < T * H; i++, x = x * 1103515245u + 12345u)
        embeds[i] = (float)(int32_t)x / 3e9f;
    for (int i = 0; i < K * T * H; i++, x = x * 1103515245u + 12345u)
        deepstack[i] = (float)(int32_t)x / 7e9f;
}

struct link {
    struct wire_arena arena;
    int deepstack_frames; /* blocks carrying DeepStack that reached the receiver */
};

/* Sends block i through the wire into rx; returns the ack (also read back from bytes). */
static void deliver(struct link *l, struct vision_rx *rx, struct vision_tx *tx, uint32_t i,
                    struct wire_vision_ack *ack) {
    struct wire_vision_block b;
    struct wire_vision_ack sent;
    uint8_t copy_ack[256] __attribute__((aligned(64)));
    assert_int_equal(vision_tx_build(tx, &l->arena, i), 0);
    assert_int_equal(
        wire_read_vision_block(&b, wire_arena_frame(&l->arena), wire_arena_frame_len(&l->arena)),
        0);
    l->deepstack_frames += b.deepstack.defined;
    assert_int_equal(vision_rx_on_block(rx, &sent, &b, 0), 0);
    struct wire_arena a;
    assert_int_equal(wire_arena_init(&a, 0), 0);
    assert_int_equal(wire_build_vision_ack(&a, &sent), 0);
    assert_true(wire_arena_frame_len(&a) <= sizeof copy_ack);
    memcpy(copy_ack, wire_arena_frame(&a), wire_arena_frame_len(&a));
    assert_int_equal(wire_read_vision_ack(ack, copy_ack, wire_arena_frame_len(&a)), 0);
    wire_arena_free(&a);
}

/* The Request the receiver hands to the core, as bytes (malloc'ed into *out). */
static size_t attach(struct vision_rx *rx, uint8_t **out) {
    struct wire_request req = {.nonce = NONCE,
                               .prompt = prompt,
                               .prompt_len = 3,
                               .max_tokens = 4,
                               .top_p = 1.0f,
                               .image_grids = grids,
                               .num_images = 1};
    struct wire_arena a;
    assert_int_equal(wire_arena_init(&a, 0), 0);
    assert_int_equal(vision_rx_attach(rx, &a, &req), 1);
    size_t len = wire_arena_frame_len(&a);
    *out = malloc(len);
    memcpy(*out, wire_arena_frame(&a), len);
    wire_arena_free(&a);
    return len;
}

/* One transfer; cut >= 0 drops the connection after block `cut` was sent, losing the block
 * (lose_block) or only its acknowledgement. Returns the Request frame. */
static size_t transfer(int block_tokens, int cut, int lose_block, uint8_t **out, int *ds_frames) {
    struct vision_rx *rx;
    struct vision_tx tx;
    struct link l = {0};
    struct wire_vision_ack ack;
    assert_int_equal(wire_arena_init(&l.arena, 0), 0);
    assert_int_equal(vision_rx_init(&rx, 0, 0, 0), 0);
    assert_int_equal(vision_tx_init(&tx, NONCE, embeds, T, H, deepstack, K, block_tokens), 0);
    for (int dropped = 0; !vision_tx_done(&tx);) {
        uint32_t i = tx.next_send++;
        if (!dropped && (int)i == cut) {
            if (!lose_block) deliver(&l, rx, &tx, i, &ack); /* arrives; the ack is lost */
            dropped = 1;
            vision_tx_rewind(&tx); /* reconnected: resume at the last acknowledged block */
            assert_int_equal(tx.next_send, i);
            continue;
        }
        deliver(&l, rx, &tx, i, &ack);
        assert_int_equal(vision_tx_on_ack(&tx, &ack), 0);
    }
    *ds_frames = l.deepstack_frames;
    size_t len = attach(rx, out);
    assert_int_equal(vision_rx_count(rx), 0);
    vision_rx_free(rx);
    wire_arena_free(&l.arena);
    return len;
}

static void test_cut_at_every_block_is_byte_identical(void **state) {
    (void)state;
    static const int sizes[] = {1, 5, 7, 24, 100};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint8_t *want, *got;
        int ds;
        size_t want_len = transfer(sizes[s], -1, 0, &want, &ds);
        assert_int_equal(ds, 1);
        struct wire_request r;
        assert_int_equal(wire_read_request(&r, want, want_len), 0);
        assert_memory_equal(r.vision_embeds.data, embeds, sizeof embeds);
        assert_memory_equal(r.deepstack.data, deepstack, sizeof deepstack);
        int blocks = (T + sizes[s] - 1) / sizes[s];
        for (int cut = 0; cut < blocks; cut++)
            for (int lose = 0; lose < 2; lose++) {
                size_t len = transfer(sizes[s], cut, lose, &got, &ds);
                assert_int_equal(len, want_len);
                assert_memory_equal(got, want, len);
                /* DeepStack went once, except when block 0's own delivery was cut. */
                assert_int_equal(ds, cut == 0 && !lose ? 2 : 1);
                free(got);
            }
        free(want);
    }
}

static void test_refusals(void **state) {
    (void)state;
    struct vision_rx *rx;
    struct vision_tx tx;
    struct wire_arena a;
    struct wire_vision_block b;
    struct wire_vision_ack ack;
    assert_int_equal(wire_arena_init(&a, 0), 0);
    assert_int_equal(vision_rx_init(&rx, 1, 0, 1000), 0);
    assert_int_equal(vision_tx_init(&tx, NONCE, embeds, T, H, deepstack, K, 5), 0);
    /* No block 0: refused. */
    assert_int_equal(vision_tx_build(&tx, &a, 1), 0);
    assert_int_equal(wire_read_vision_block(&b, wire_arena_frame(&a), wire_arena_frame_len(&a)), 0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &b, 0), STRATA_ENOTFOUND);
    assert_non_null(strstr(strata_last_error(), "block 0 first"));
    /* A gap: block 0, then block 2. */
    assert_int_equal(vision_tx_build(&tx, &a, 0), 0);
    assert_int_equal(wire_read_vision_block(&b, wire_arena_frame(&a), wire_arena_frame_len(&a)), 0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &b, 0), 0);
    assert_int_equal(ack.next_block, 1);
    /* A second transfer over the limit of 1. */
    struct vision_tx other;
    assert_int_equal(vision_tx_init(&other, NONCE + 1, embeds, T, H, NULL, 0, 5), 0);
    assert_int_equal(vision_tx_build(&other, &a, 0), 0);
    struct wire_vision_block ob;
    assert_int_equal(wire_read_vision_block(&ob, wire_arena_frame(&a), wire_arena_frame_len(&a)),
                     0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &ob, 0), STRATA_EBUSY);
    /* An incomplete transfer's Request is refused. */
    struct wire_request req = {.nonce = NONCE, .prompt = prompt, .prompt_len = 3, .max_tokens = 1};
    assert_int_equal(vision_rx_attach(rx, &a, &req), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "with 1 of its 5 vision blocks"));
    assert_int_equal(vision_rx_count(rx), 0);
    /* Restart; then block 2 after block 0 is a gap. */
    assert_int_equal(vision_tx_build(&tx, &a, 0), 0);
    assert_int_equal(wire_read_vision_block(&b, wire_arena_frame(&a), wire_arena_frame_len(&a)), 0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &b, 0), 0);
    assert_int_equal(vision_tx_build(&tx, &a, 2), 0);
    assert_int_equal(wire_read_vision_block(&b, wire_arena_frame(&a), wire_arena_frame_len(&a)), 0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &b, 0), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "does not continue the transfer"));
    assert_int_equal(vision_rx_count(rx), 0);
    /* A text request passes; an idle assembly expires. */
    assert_int_equal(vision_rx_attach(rx, &a, &req), 0);
    assert_int_equal(vision_tx_build(&tx, &a, 0), 0);
    assert_int_equal(wire_read_vision_block(&b, wire_arena_frame(&a), wire_arena_frame_len(&a)), 0);
    assert_int_equal(vision_rx_on_block(rx, &ack, &b, 100), 0);
    assert_int_equal(vision_rx_expire(rx, 1000), 0);
    assert_int_equal(vision_rx_expire(rx, 1101), 1);
    /* An acknowledgement beyond the blocks is refused by the sender. */
    ack = (struct wire_vision_ack){NONCE, 9};
    assert_int_equal(vision_tx_on_ack(&tx, &ack), STRATA_EFORMAT);
    /* The wire refuses DeepStack outside block 0 and rows beyond the total. */
    b.index = 1;
    b.num_blocks = 5;
    b.deepstack = (struct wire_tensor){.defined = 1,
                                       .dtype = WIRE_DTYPE_F32,
                                       .ndim = 3,
                                       .shape = {K, T, H},
                                       .data = deepstack,
                                       .nbytes = sizeof deepstack};
    assert_int_equal(wire_build_vision_block(&a, &b), STRATA_EINVAL);
    b.deepstack.defined = 0;
    b.token_start = T - 1;
    assert_int_equal(wire_build_vision_block(&a, &b), STRATA_EINVAL);
    vision_rx_free(rx);
    wire_arena_free(&a);
}

int main(void) {
    fill();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cut_at_every_block_is_byte_identical),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
