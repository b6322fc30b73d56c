/* strata-bench-vision-transfer: the vision stage -> stage 0 transfer's bytes and time per
 * image over loopback TCP, with the real code on both sides (runtime/stage/vision_xfer.h,
 * wire frames, acknowledgements with a window of VISION_STAGE_WINDOW blocks, the Request
 * rebuilt with its tensors at the end), for Qwen3-VL-2B-shaped outputs (out hidden 2048,
 * 3 DeepStack layers) of a 448x448 image (196 tokens) and a 1024x1024 one (1024 tokens), at
 * several block sizes, unbroken and with the link cut after the first block (resumed on a
 * new connection). A benchmark, not a test: numbers depend on the machine. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/vision_stage.h"
#include "runtime/stage/vision_xfer.h"
#include "wire/transport.h"

#define H 2048
#define K 3
#define NONCE 77

struct receiver {
    struct wire_listener listener;
    int connections; /* how many to serve */
    struct vision_rx *rx;
    size_t request_bytes; /* the rebuilt Request */
    int rc;
};

/* Stage 0's side: blocks in, acknowledgements out, the Request rebuilt at the end. */
static void *receive(void *arg) {
    struct receiver *r = arg;
    struct wire_arena arena;
    wire_arena_init(&arena, 0);
    for (int c = 0; c < r->connections; c++) {
        struct wire_conn conn;
        const uint8_t *frame;
        size_t len;
        if ((r->rc = wire_accept(&conn, &r->listener, 0, 10000)) < 0) break;
        while (wire_recv_frame(&conn, &frame, &len, 10000) == 0) {
            struct wire_vision_block b;
            struct wire_vision_ack ack;
            struct wire_request req;
            if (wire_read_vision_block(&b, frame, len) == 0) {
                if ((r->rc = vision_rx_on_block(r->rx, &ack, &b, 0)) < 0) break;
                wire_build_vision_ack(&arena, &ack);
                wire_send_frame(&conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                                5000);
            } else if (wire_read_request(&req, frame, len) == 0) {
                r->rc = vision_rx_attach(r->rx, &arena, &req) == 1 ? 0 : -1;
                r->request_bytes = wire_arena_frame_len(&arena);
                break;
            }
        }
        wire_close(&conn);
    }
    wire_arena_free(&arena);
    return NULL;
}

/* One transfer; cut = 1 drops the connection after block 0. Returns bytes sent. */
static size_t transfer(int port, const float *embeds, const float *deepstack, int tokens, int block,
                       int cut, const uint8_t *request, size_t request_len) {
    struct vision_tx tx;
    struct wire_conn conn;
    struct wire_arena arena;
    size_t bytes = 0;
    wire_arena_init(&arena, 0);
    vision_tx_init(&tx, NONCE, embeds, tokens, H, deepstack, K, block);
    wire_connect(&conn, NULL, port, 0, 2000);
    while (!vision_tx_done(&tx)) {
        while (tx.next_send < tx.num_blocks && tx.next_send - tx.acked < VISION_STAGE_WINDOW) {
            vision_tx_build(&tx, &arena, tx.next_send++);
            wire_send_frame(&conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena), 5000);
            bytes += wire_arena_frame_len(&arena) + 4;
            if (cut && tx.next_send == 1) { /* the link drops; reconnect and resume */
                const uint8_t *f;
                size_t n;
                cut = 0;
                if (wire_recv_frame(&conn, &f, &n, 5000) == 0) {
                    struct wire_vision_ack ack;
                    if (wire_read_vision_ack(&ack, f, n) == 0) vision_tx_on_ack(&tx, &ack);
                }
                wire_close(&conn);
                vision_tx_rewind(&tx);
                wire_connect(&conn, NULL, port, 0, 2000);
            }
        }
        const uint8_t *f;
        size_t n;
        struct wire_vision_ack ack;
        if (vision_tx_done(&tx)) break; /* the cut block's acknowledgement came before the cut */
        if (wire_recv_frame(&conn, &f, &n, 5000) < 0) break;
        if (wire_read_vision_ack(&ack, f, n) == 0) vision_tx_on_ack(&tx, &ack);
    }
    wire_send_frame(&conn, request, request_len, 5000);
    bytes += request_len + 4;
    wire_close(&conn);
    wire_arena_free(&arena);
    return bytes;
}

static int run(int tokens, int block, int cut, int reps) {
    float *embeds = malloc(sizeof(float) * (size_t)tokens * H);
    float *deepstack = malloc(sizeof(float) * (size_t)K * tokens * H);
    int32_t prompt[3] = {151652, 151655, 151653}, grid[3] = {1, 2, tokens * 2};
    struct wire_request req = {.nonce = NONCE,
                               .prompt = prompt,
                               .prompt_len = 3,
                               .max_tokens = 1,
                               .top_p = 1.0f,
                               .image_grids = grid,
                               .num_images = 1};
    struct wire_arena arena;
    if (!embeds || !deepstack || wire_arena_init(&arena, 0) < 0) return -1;
    for (size_t i = 0; i < (size_t)tokens * H; i++)
        embeds[i] = (float)(i % 977) * 1e-3f;
    for (size_t i = 0; i < (size_t)K * tokens * H; i++)
        deepstack[i] = (float)(i % 613) * -1e-3f;
    wire_build_request(&arena, &req);
    double best = 1e30;
    size_t bytes = 0, rebuilt = 0;
    for (int r = 0; r < reps; r++) {
        struct receiver rcv = {.connections = cut ? 2 : 1};
        pthread_t th;
        if (wire_listen(&rcv.listener, NULL, 0) < 0 || vision_rx_init(&rcv.rx, 0, 0, 0) < 0)
            return -1;
        pthread_create(&th, NULL, receive, &rcv);
        double t0 = cli_now_sec();
        bytes = transfer(rcv.listener.port, embeds, deepstack, tokens, block, cut,
                         wire_arena_frame(&arena), wire_arena_frame_len(&arena));
        pthread_join(th, NULL);
        double t = cli_now_sec() - t0;
        if (t < best) best = t;
        rebuilt = rcv.request_bytes;
        vision_rx_free(rcv.rx);
        wire_listener_close(&rcv.listener);
        if (rcv.rc < 0) {
            fprintf(stderr, "strata-bench-vision-transfer: the receiver failed\n");
            return -1;
        }
    }
    printf("%5d tokens  blocks of %4d  %-9s  %7.2f MB sent  %7.2f ms/image  %6.2f GB/s  "
           "(Request at stage 0: %.2f MB)\n",
           tokens, block, cut ? "cut+resume" : "unbroken", bytes / 1e6, best * 1e3,
           bytes / best / 1e9, rebuilt / 1e6);
    free(embeds);
    free(deepstack);
    wire_arena_free(&arena);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("usage: strata-bench-vision-transfer\n"
               "Times the vision stage -> stage 0 transfer (VisionBlocks + acks + Request) per\n"
               "image over loopback TCP for Qwen3-VL-2B-shaped outputs (H %d, K %d).\n",
               H, K);
        return strcmp(argv[1], "--help") == 0 ? STRATA_EXIT_OK : STRATA_EXIT_USAGE;
    }
    printf("vision transfer over loopback TCP (plaintext), H %d, K %d DeepStack, best of 5\n", H,
           K);
    static const int tokens[] = {196, 1024}, blocks[] = {64, 256, 1024};
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 3; b++)
            for (int cut = 0; cut < 2; cut++)
                if (run(tokens[t], blocks[b], cut, 5) < 0) return STRATA_EXIT_FAILURE;
    return STRATA_EXIT_OK;
}
