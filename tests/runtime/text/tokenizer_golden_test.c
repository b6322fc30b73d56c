/* The real Qwen3 tokenizer against Hugging Face `tokenizers` (the truth): every string of
 * testdata/tokenizer_golden.jsonl (tools/golden/tokenizer_golden.py) must encode to HF's ids,
 * and HF's ids must decode to HF's text, whole and streamed id by id; encode(decode(ids))
 * gives ids back exactly where HF's does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/text/tokenizer.h"
#include "tests/runtime/text/mini_tokenizer.h"
#include "tests/test_util.h"

static struct tokenizer *g_tok;
static int stream_decode(const int32_t *ids, size_t n, int skip, char **out);
static int32_t g_byte_id[256]; /* the real vocabulary's id of each byte-level token */

static void find_byte_ids(void) {
    for (unsigned b = 0; b < 256; ++b) {
        unsigned cp = mini_byte_cp(b);
        char s[3] = {(char)cp, 0, 0};
        if (cp >= 0x80) {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        g_byte_id[b] = tokenizer_token_id(g_tok, s);
    }
}

/* The text streamed one byte-level token per byte, so every multi-byte character is split
 * across pushes: the stream must give the text back exactly. */
static int byte_stream_ok(const char *text) {
    size_t n = strlen(text);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; ++i)
        ids[i] = g_byte_id[(unsigned char)text[i]];
    char *out = NULL;
    int ok = stream_decode(ids, n, 0, &out) == 0 && strcmp(out, text) == 0;
    free(ids);
    free(out);
    return ok;
}

static int same_ids(const struct tokenizer_ids *got, const cJSON *want) {
    if ((int)got->n != cJSON_GetArraySize(want)) return 0;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) if (got->ids[i++] != (int32_t)e->valuedouble) return 0;
    return 1;
}

static int stream_decode(const int32_t *ids, size_t n, int skip, char **out) {
    struct tokenizer_stream *s;
    size_t cap = 64, len = 0, piece_len;
    const char *piece;
    char *buf = malloc(cap);
    if (tokenizer_stream_new(&s, g_tok, skip) != 0) return -1;
    for (size_t i = 0; i <= n; ++i) {
        int st = i < n ? tokenizer_stream_push(s, ids[i], &piece, &piece_len)
                       : tokenizer_stream_flush(s, &piece, &piece_len);
        if (st != 0) return -1;
        /* No piece may end inside a character: each must be valid UTF-8 on its own. */
        if (piece_len && ((unsigned char)piece[piece_len - 1] & 0xC0) == 0xC0) return -2;
        while (len + piece_len + 1 > cap)
            buf = realloc(buf, cap *= 2);
        memcpy(buf + len, piece, piece_len);
        len += piece_len;
    }
    buf[len] = 0;
    tokenizer_stream_free(s);
    *out = buf;
    return 0;
}

/* Checks one golden case; returns a short reason when it fails, else NULL. */
static const char *check_case(const cJSON *c) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    const cJSON *want = cJSON_GetObjectItem(c, "ids");
    const char *dec = cJSON_GetObjectItem(c, "decode")->valuestring;
    const char *dec_skip = cJSON_GetObjectItem(c, "decode_skip")->valuestring;
    int roundtrip = cJSON_IsTrue(cJSON_GetObjectItem(c, "roundtrip"));
    struct tokenizer_ids ids = {0}, again = {0};
    const char *why = NULL;
    char *out = NULL, *skip = NULL, *streamed = NULL;
    size_t len, skip_len;
    if (tokenizer_encode(g_tok, text, strlen(text), &ids) != 0)
        why = "encode failed";
    else if (!same_ids(&ids, want))
        why = "ids differ";
    else if (tokenizer_decode(g_tok, ids.ids, ids.n, 0, &out, &len) != 0)
        why = "decode failed";
    else if (strcmp(out, dec) != 0)
        why = "decode differs";
    else if (tokenizer_decode(g_tok, ids.ids, ids.n, 1, &skip, &skip_len) != 0)
        why = "decode failed";
    else if (strcmp(skip, dec_skip) != 0)
        why = "decode(skip_special) differs";
    else if (stream_decode(ids.ids, ids.n, 0, &streamed) != 0)
        why = "stream broke a character";
    else if (strcmp(streamed, dec) != 0)
        why = "streamed decode differs";
    else if (!byte_stream_ok(dec))
        why = "byte-by-byte stream differs";
    else if (tokenizer_encode(g_tok, out, len, &again) != 0)
        why = "re-encode failed";
    else if (roundtrip != (again.n == ids.n && !memcmp(again.ids, ids.ids, ids.n * 4)))
        why = "round trip differs from HF's";
    free(out);
    free(skip);
    free(streamed);
    tokenizer_ids_free(&ids);
    tokenizer_ids_free(&again);
    return why;
}

static void test_golden(void **state) {
    (void)state;
    FILE *f = fopen(test_path("tests/runtime/text/testdata/tokenizer_golden.jsonl"), "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, failed = 0, lineno = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        assert_non_null(c);
        if (++lineno > 1) { /* line 1: header */
            const char *why = check_case(c);
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            ++n;
            if (why && ++failed <= 40) printf("golden line %d: %s: %s\n", lineno, why, text);
        }
        cJSON_Delete(c);
    }
    free(line);
    fclose(f);
    printf("golden: %d strings, %d identical to HF tokenizers, %d differ\n", n, n - failed, failed);
    assert_true(n >= 2000);
    assert_int_equal(failed, 0); /* every one: NFC included (runtime/text/nfc.h) */
}

static void test_eos_and_specials(void **state) {
    (void)state;
    int32_t eos[TOKENIZER_MAX_EOS];
    assert_int_equal(tokenizer_eos_ids(g_tok, eos), 1);
    assert_int_equal(eos[0], 151645); /* <|im_end|> from tokenizer_config.json */
    assert_int_equal(tokenizer_n_ids(g_tok), 151669);
    assert_int_equal(tokenizer_token_id(g_tok, "<|image_pad|>"), 151655);
    assert_int_equal(tokenizer_token_id(g_tok, "Ġthe"), 279);
    assert_int_equal(tokenizer_token_id(g_tok, "no such token"), -1);
    assert_true(tokenizer_is_special(g_tok, 151644));
    assert_false(tokenizer_is_special(g_tok, 151667)); /* <think> is added, not special */
    assert_false(tokenizer_is_special(g_tok, 279));
}

/* A 4-byte emoji whose bytes come one token each: nothing until the last byte, and a
 * stream cut short flushes one U+FFFD (from_utf8_lossy on a truncated sequence). */
static void test_stream_holds_partial_characters(void **state) {
    (void)state;
    /* Byte 0xF0 (an emoji's lead byte) is the byte-level token "\u00f0" on its own. */
    int32_t lead = tokenizer_token_id(g_tok, "\xC3\xB0");
    assert_true(lead >= 0);
    struct tokenizer_stream *s;
    const char *piece;
    size_t len;
    assert_int_equal(tokenizer_stream_new(&s, g_tok, 0), 0);
    assert_int_equal(tokenizer_stream_push(s, lead, &piece, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tokenizer_stream_flush(s, &piece, &len), 0);
    assert_string_equal(piece, "\xEF\xBF\xBD");
    assert_int_equal(tokenizer_stream_push(s, 151644, &piece, &len), 0); /* reusable */
    assert_string_equal(piece, "<|im_start|>");
    assert_int_equal(tokenizer_stream_push(s, 1 << 30, &piece, &len), STRATA_ERANGE);
    tokenizer_stream_free(s);
}

static void test_bad_input(void **state) {
    (void)state;
    struct tokenizer_ids ids = {0};
    assert_int_equal(tokenizer_encode(g_tok, "ok\xC3(", 4, &ids), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "byte offset 2"));
    assert_int_equal(tokenizer_encode(g_tok, "\xED\xA0\x80", 3, &ids), STRATA_EINVAL);
    assert_int_equal(ids.n, 0);
    int32_t bad[] = {9707, 151669};
    char *out;
    size_t len;
    assert_int_equal(tokenizer_decode(g_tok, bad, 2, 0, &out, &len), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "position 1"));
    bad[1] = -1;
    assert_int_equal(tokenizer_decode(g_tok, bad, 2, 0, &out, &len), STRATA_ERANGE);
    /* NUL is an ordinary character to the library (byte-level token "Ā"). */
    assert_int_equal(tokenizer_encode(g_tok, "a\0b", 3, &ids), 0);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[1], 188);
    tokenizer_ids_free(&ids);
}

int main(void) {
    if (tokenizer_load(&g_tok, test_path("tests/runtime/text/testdata/qwen3-tokenizer")) != 0) {
        fprintf(stderr, "load: %s\n", strata_last_error());
        return 1;
    }
    find_byte_ids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_eos_and_specials),
        cmocka_unit_test(test_stream_holds_partial_characters),
        cmocka_unit_test(test_bad_input),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tokenizer_free(g_tok);
    return rc;
}
