/* libFuzzer target for encode and decode on the small in-memory tokenizer: any bytes are
 * encoded (invalid UTF-8 must fail with a message), and the same bytes read as ids must
 * decode whole and streamed to the same text. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"
#include "tests/runtime/text/mini_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct tokenizer *g_tok;

static void decode_both_ways(const int32_t *ids, size_t n) {
    char *whole;
    size_t len, piece_len, at = 0;
    if (tokenizer_decode(g_tok, ids, n, 0, &whole, &len) != 0) return;
    struct tokenizer_stream *s;
    if (tokenizer_stream_new(&s, g_tok, 0) != 0) abort();
    const char *piece;
    for (size_t i = 0; i <= n; ++i) {
        if ((i < n ? tokenizer_stream_push(s, ids[i], &piece, &piece_len)
                   : tokenizer_stream_flush(s, &piece, &piece_len)) != 0)
            abort();
        if (at + piece_len > len || memcmp(whole + at, piece, piece_len) != 0) abort();
        at += piece_len;
    }
    if (at != len) abort();
    tokenizer_stream_free(s);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) {
        char *json = mini_tokenizer_json("");
        if (tokenizer_load_json(&g_tok, json, strlen(json), NULL, NULL) != 0) abort();
        free(json);
    }
    struct tokenizer_ids ids = {0};
    if (tokenizer_encode(g_tok, (const char *)data, size, &ids) == 0)
        decode_both_ways(ids.ids, ids.n);
    tokenizer_ids_free(&ids);
    /* The input as ids (two bytes each, a few out of range) through both decoders. */
    size_t n = size / 2;
    int32_t *raw = malloc((n ? n : 1) * sizeof *raw);
    for (size_t i = 0; i < n; ++i)
        raw[i] = (int32_t)(data[2 * i] | data[2 * i + 1] << 8) % 320;
    decode_both_ways(raw, n);
    free(raw);
    return 0;
}
