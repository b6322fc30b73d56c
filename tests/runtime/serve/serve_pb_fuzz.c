/* libFuzzer target for the gRPC front's request decoder (runtime/serve/serve_pb): any bytes
 * must decode into checked parameters or fail with a 400 and a message, never crash, leak or
 * read out of bounds. The first byte picks GenerateRequest or ChatRequest; a decoded request
 * is re-checked against the ranges it was accepted under. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/serve/serve_pb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const struct serve_limits limits = {"qwen3", 4096};
    struct serve_params p;
    struct serve_error err;
    if (size < 1) return 0;
    int chat = data[0] & 1;
    int rc = chat ? serve_pb_parse_chat(&p, data + 1, size - 1, &limits, &err)
                  : serve_pb_parse_generate(&p, data + 1, size - 1, &limits, &err);
    if (rc == 0) {
        if (serve_params_check(&p, &limits, &err) != 0) __builtin_trap();
        if (chat ? !p.messages_json : !p.prompt == !p.prompt_ids) __builtin_trap();
        if (p.n_prompt_ids < 0 || p.n_prompt_ids >= limits.max_tokens) __builtin_trap();
    } else if (err.http_status < 400 || !err.message[0] ||
               strlen(err.message) >= sizeof err.message) {
        __builtin_trap();
    }
    serve_params_free(&p);
    return 0;
}
