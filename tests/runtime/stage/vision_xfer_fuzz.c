/* libFuzzer target over stage 0's side of the vision transfer (runtime/stage/vision_xfer.h):
 * the input is a sequence of frames, each a u32 little-endian length and the bytes; every
 * VisionBlock goes to vision_rx_on_block, every Request to vision_rx_attach (whose rebuilt
 * Request must read back), with small limits so the refusals are reached. No input may
 * crash, leak, read outside a frame or break the receiver's bookkeeping.
 * Seeds: tests/runtime/stage/fuzz_corpus/vision_xfer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/stage/vision_xfer.h"
#include "wire/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct vision_rx *rx;
    struct wire_arena arena;
    if (vision_rx_init(&rx, 3, (size_t)1 << 20, 50) < 0) return 0;
    if (wire_arena_init(&arena, 0) < 0) {
        vision_rx_free(rx);
        return 0;
    }
    int64_t now = 0;
    while (size >= 4) {
        uint32_t len = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                       (uint32_t)data[3] << 24;
        data += 4;
        size -= 4;
        if (len > size) len = (uint32_t)size;
        uint8_t *frame = malloc(len ? len : 1); /* exact size: ASan sees overreads */
        if (!frame) break;
        memcpy(frame, data, len);
        data += len;
        size -= len;
        now += 10;
        struct wire_vision_block block;
        struct wire_vision_ack ack;
        struct wire_request req, back;
        if (wire_read_vision_block(&block, frame, len) == 0) {
            if (vision_rx_on_block(rx, &ack, &block, now) == 0 &&
                (ack.nonce != block.nonce || ack.next_block > block.num_blocks))
                abort();
        } else if (wire_read_request(&req, frame, len) == 0 &&
                   vision_rx_attach(rx, &arena, &req) == 1 &&
                   wire_read_request(&back, wire_arena_frame(&arena),
                                     wire_arena_frame_len(&arena)) != 0) {
            abort(); /* the assembled Request must be a valid frame */
        }
        vision_rx_expire(rx, now);
        if (vision_rx_count(rx) > 3) abort();
        free(frame);
    }
    wire_arena_free(&arena);
    vision_rx_free(rx);
    return 0;
}
