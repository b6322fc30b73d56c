/* libFuzzer target over the frame verifier and every reader: no input may crash, leak or
 * read outside the buffer. Each accepted message is walked completely (payload bytes,
 * scales, strings, vectors, segments, f32 decode) so ASan sees any pointer that escapes.
 * Seeds: tests/wire/fuzz_corpus (sample frames, flatc-built 1.1 and 2.0 frames). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/codec.h"
#include "wire/message.h"

#define MAX_DECODE_VALUES (1u << 16)

static volatile uint32_t sink;

static void touch(const void *p, size_t n) {
    const uint8_t *bytes = p;
    uint32_t sum = 0;
    for (size_t i = 0; i < n; ++i)
        sum += bytes[i];
    sink += sum;
}

static void walk_tensor(const struct wire_tensor *t) {
    if (!t->defined) return;
    touch(t->data, t->nbytes);
    touch(t->scales, t->num_scales * sizeof(float));
    int64_t numel = wire_tensor_numel(t);
    if (numel > 0 && numel <= MAX_DECODE_VALUES) {
        float *values = malloc((size_t)numel * sizeof(float));
        if (values && wire_tensor_decode_f32(values, t) == 0)
            touch(values, (size_t)numel * sizeof(float));
        free(values);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size heap copy: malloc alignment, and ASan redzones right after the end. */
    uint8_t *frame = malloc(size ? size : 1);
    if (!frame) return 0;
    memcpy(frame, data, size);
    enum wire_kind kind;
    uint16_t minor;
    int verified = wire_verify(&kind, &minor, frame, size) == 0;

    struct wire_hello hello;
    struct wire_activation act;
    struct wire_kv_block kv;
    struct wire_token_result token;
    struct wire_error error;
    struct wire_control control;
    struct wire_request request;
    struct wire_vision_block block;
    struct wire_vision_ack ack;
    int readable = 0;
    if (wire_read_hello(&hello, frame, size) == 0) {
        readable++;
        touch(&hello, sizeof hello);
    }
    if (wire_read_activation(&act, frame, size) == 0) {
        readable++;
        walk_tensor(&act.hidden);
        walk_tensor(&act.attention_mask);
        walk_tensor(&act.position_ids);
        walk_tensor(&act.visual_mask);
        walk_tensor(&act.deepstack);
        for (size_t i = 0; i < act.num_segments; ++i)
            sink += (uint32_t)wire_activation_segment(&act, i).nonce;
    }
    if (wire_read_kv_block(&kv, frame, size) == 0) {
        readable++;
        touch(kv.lengths, kv.num_lengths * sizeof(int32_t));
        walk_tensor(&kv.k);
        walk_tensor(&kv.v);
    }
    if (wire_read_token_result(&token, frame, size) == 0) {
        readable++;
        touch(token.tokens, token.num_tokens * sizeof(int32_t));
        touch(token.logprobs, token.num_logprobs * sizeof(float));
    }
    if (wire_read_error(&error, frame, size) == 0) {
        readable++;
        touch(error.message, strlen(error.message));
    }
    if (wire_read_control(&control, frame, size) == 0) {
        readable++;
        for (size_t i = 0; i < control.num_stages; ++i) {
            struct wire_stage_info info = wire_control_stage(&control, i);
            touch(info.device, strlen(info.device));
            touch(info.weights_dtype, strlen(info.weights_dtype));
            touch(info.version, strlen(info.version));
            touch(info.next, strlen(info.next));
            sink += (uint32_t)info.layer_end;
        }
    }
    if (wire_read_request(&request, frame, size) == 0) {
        readable++;
        touch(request.prompt, request.prompt_len * sizeof(int32_t));
        touch(request.stop_ids, request.num_stop_ids * sizeof(int32_t));
        touch(request.image_files, request.image_files_len);
        touch(request.image_file_sizes, request.num_image_files * sizeof(uint32_t));
        if (request.image_formats) touch(request.image_formats, request.num_image_files);
        walk_tensor(&request.vision_embeds);
        walk_tensor(&request.deepstack);
    }
    if (wire_read_vision_block(&block, frame, size) == 0) {
        readable++;
        walk_tensor(&block.embeds);
        walk_tensor(&block.deepstack);
    }
    if (wire_read_vision_ack(&ack, frame, size) == 0) readable++;
    /* The readers and wire_verify must agree: exactly one reader accepts a verified frame. */
    if (readable != (verified ? 1 : 0)) abort();
    free(frame);
    return 0;
}
