/* ids -> UTF-8: HF tokenizers' Tokenizer::decode (tokenizer/mod.rs) with the ByteLevel
 * decoder, whole and incrementally. Each id's bytes were precomputed at load, so decoding is
 * a concatenation followed by the from_utf8_lossy conversion. */
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/text/tokenizer_internal.h"

/* Appends id's bytes to raw unless it is skipped. HF silently drops ids it does not know;
 * a Strata caller gets an error instead, since such an id means a wrong model. */
static int append_id(const struct tokenizer *tok, int32_t id, size_t pos, int skip_special,
                     struct tok_buf *raw) {
    if (id < 0 || id >= tok->n_ids || tok->tok_len[id] < 0)
        return strata_set_error(STRATA_ERANGE, "id %d at position %zu is not a token (ids < %d)",
                                id, pos, tok->n_ids);
    if (skip_special && tok->special[id]) return 0;
    return tok_buf_append(raw, tok->decoded.data + tok->dec_off[id], tok->dec_len[id]);
}

int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                     char **out, size_t *len) {
    struct tok_buf raw = {0}, text = {0};
    int st = tok_buf_append(&raw, "", 0);
    for (size_t i = 0; i < n && st == 0; ++i)
        st = append_id(tok, ids[i], i, skip_special, &raw);
    if (st == 0) st = tok_buf_append(&text, "", 0);
    if (st == 0 && tok_utf8_lossy(&text, (const uint8_t *)raw.data, raw.len, 1) < 0)
        st = STRATA_ENOMEM;
    free(raw.data);
    if (st != 0) {
        free(text.data);
        return st;
    }
    *out = text.data;
    *len = text.len;
    return 0;
}

struct tokenizer_stream {
    const struct tokenizer *tok;
    int skip_special;
    size_t pushed;       /* ids so far, for error messages */
    struct tok_buf held; /* bytes of a character not yet complete (at most 3) */
    struct tok_buf out;  /* what the last call returned */
};

int tokenizer_stream_new(struct tokenizer_stream **out, const struct tokenizer *tok,
                         int skip_special) {
    struct tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s || tok_buf_append(&s->held, "", 0) != 0 || tok_buf_append(&s->out, "", 0) != 0) {
        tokenizer_stream_free(s);
        return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (stream)");
    }
    s->tok = tok;
    s->skip_special = skip_special;
    *out = s;
    return 0;
}

/* Converts held bytes; whatever is an incomplete character at the end stays held (unless
 * final). Because a UTF-8 sequence is at most 4 bytes, holding at most 3 bytes back gives
 * the same U+FFFD decisions as converting the whole concatenation at once. */
static int drain(struct tokenizer_stream *s, int final, const char **text, size_t *len) {
    s->out.len = 0;
    s->out.data[0] = 0;
    long used = tok_utf8_lossy(&s->out, (const uint8_t *)s->held.data, s->held.len, final);
    if (used < 0) return STRATA_ENOMEM;
    memmove(s->held.data, s->held.data + used, s->held.len - (size_t)used);
    s->held.len -= (size_t)used;
    *text = s->out.data;
    *len = s->out.len;
    return 0;
}

int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len) {
    int st = append_id(s->tok, id, s->pushed, s->skip_special, &s->held);
    if (st != 0) return st;
    s->pushed++;
    return drain(s, 0, text, len);
}

int tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len) {
    s->pushed = 0;
    return drain(s, 1, text, len);
}

void tokenizer_stream_free(struct tokenizer_stream *s) {
    if (!s) return;
    free(s->held.data);
    free(s->out.data);
    free(s);
}
