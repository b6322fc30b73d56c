/* libFuzzer target for the tokenizer.json loader: any bytes must load or fail with a
 * message, never crash, leak or read out of bounds. A file that loads is used once: encode
 * a mixed string and decode every id, whole and streamed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const struct tokenizer *tok) {
    static const char text[] = "Hi <|im_start|>user\n don't 123 caf\xC3\xA9 \xF0\x9F\x98\x80  ";
    struct tokenizer_ids ids = {0};
    char *out;
    size_t len;
    if (tokenizer_encode(tok, text, sizeof text - 1, &ids) == 0 &&
        tokenizer_decode(tok, ids.ids, ids.n, 0, &out, &len) == 0)
        free(out);
    tokenizer_ids_free(&ids);
    int32_t n = tokenizer_n_ids(tok);
    struct tokenizer_stream *s;
    if (tokenizer_stream_new(&s, tok, 1) != 0) return;
    const char *piece;
    for (int32_t id = 0; id < n && id < 4096; ++id)
        (void)tokenizer_stream_push(s, id, &piece, &len);
    (void)tokenizer_stream_flush(s, &piece, &len);
    tokenizer_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tokenizer *tok;
    if (tokenizer_load_json(&tok, (const char *)data, size, "{\"eos_token\": \"<|im_end|>\"}",
                            "{\"eos_token_id\": [0, 1]}") == 0) {
        exercise(tok);
        tokenizer_free(tok);
    }
    return 0;
}
