/* Unit tests of runtime/text on a small in-memory tokenizer (mini_tokenizer.h): BPE merge
 * order, added tokens (leftmost-longest, normalized ones after NFC), lossy and streaming
 * decode, and a clear error for each kind of malformed tokenizer.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/text/tokenizer.h"
#include "tests/runtime/text/mini_tokenizer.h"

static struct tokenizer *load_mini(const char *extra, const char *cfg, const char *gen, int *st) {
    char *json = mini_tokenizer_json(extra);
    struct tokenizer *tok = NULL;
    *st = tokenizer_load_json(&tok, json, strlen(json), cfg, gen);
    free(json);
    return tok;
}

static int setup(void **state) {
    int st;
    *state = load_mini("", "{\"eos_token\": {\"content\": \"<|im_start|>\"}}",
                       "{\"eos_token_id\": [300, 10, 300]}", &st);
    if (st != 0) fprintf(stderr, "load: %s\n", strata_last_error());
    return st;
}

static int teardown(void **state) {
    tokenizer_free(*state);
    return 0;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static void expect_ids(const struct tokenizer *tok, const char *text, size_t len,
                       const int32_t *want) {
    struct tokenizer_ids ids = {0};
    assert_int_equal(tokenizer_encode(tok, text, len, &ids), 0);
    size_t n = 0;
    while (want[n] >= 0)
        ++n;
    if (ids.n != n) printf("\"%s\": %zu ids, want %zu\n", text, ids.n, n);
    assert_int_equal(ids.n, n);
    for (size_t i = 0; i < n; ++i)
        assert_int_equal(ids.ids[i], want[i]);
    tokenizer_ids_free(&ids);
}
#define EXPECT(tok, text, ...)                                                                     \
    expect_ids(tok, text, sizeof(text) - 1, (const int32_t[]){__VA_ARGS__, -1})

static void test_bpe(void **state) {
    const struct tokenizer *tok = *state;
    EXPECT(tok, " the", MINI_G_THE);
    EXPECT(tok, "the", 't', MINI_HE);
    EXPECT(tok, "in", MINI_IN);
    /* Equal ranks merge leftmost first: "aaa" -> "aa" + "a"; then "aa"+"aa" -> "aaaa". */
    EXPECT(tok, "aaa", MINI_AA, 'a');
    EXPECT(tok, "aaaaa", MINI_AAAA, 'a');
    /* Contractions split as the regex says; ASCII-only case folding ("'S" too). */
    EXPECT(tok, "it's", 'i', 't', '\'', 's');
    EXPECT(tok, "IT'S", 'I', 'T', '\'', 'S');
    /* Non-ASCII bytes are byte-level tokens: "é" is C3 A9. */
    EXPECT(tok, "\xC3\xA9", 0xC3, 0xA9);
    EXPECT(tok, "a\0b", 'a', 0, 'b');
}

static void test_added_tokens(void **state) {
    const struct tokenizer *tok = *state;
    EXPECT(tok, "x<|im_start|>y", 'x', MINI_IM_START, 'y');
    EXPECT(tok, "<t>", MINI_T);
    EXPECT(tok, "<t>x", MINI_TX); /* leftmost-longest */
    EXPECT(tok, "<t><t>xy", MINI_T, MINI_TX, 'y');
    EXPECT(tok, "<|im_start", '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't');
    /* normalized=true: matched after NFC, so the decomposed "e" U+0301 matches too. */
    EXPECT(tok, "<\xC3\xA9>", MINI_NORM);
    EXPECT(tok, "<e\xCC\x81>", MINI_NORM);
    assert_int_equal(tokenizer_token_id(tok, "<t>x"), MINI_TX);
    assert_true(tokenizer_is_special(tok, MINI_IM_START));
    assert_false(tokenizer_is_special(tok, MINI_T));
    int32_t eos[TOKENIZER_MAX_EOS];
    assert_int_equal(tokenizer_eos_ids(tok, eos), 2);
    assert_int_equal(eos[0], MINI_IM_START);
    assert_int_equal(eos[1], 10);
    assert_int_equal(tokenizer_n_ids(tok), MINI_N_IDS);
}

static void expect_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip,
                          const char *want) {
    char *out;
    size_t len;
    assert_int_equal(tokenizer_decode(tok, ids, n, skip, &out, &len), 0);
    assert_int_equal(len, strlen(want));
    assert_string_equal(out, want);
    free(out);
}

/* Invalid bytes become U+FFFD per maximal subpart, as Rust's from_utf8_lossy. */
static void test_decode_lossy(void **state) {
    const struct tokenizer *tok = *state;
    expect_decode(tok, (const int32_t[]){0xE2, 0x82, 'A'}, 3, 0,
                  "\xEF\xBF\xBD"
                  "A");
    expect_decode(tok, (const int32_t[]){0xF0, 0x80}, 2, 0, "\xEF\xBF\xBD\xEF\xBF\xBD");
    expect_decode(tok, (const int32_t[]){0xED, 0xA0, 0x80}, 3, 0,
                  "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    expect_decode(tok, (const int32_t[]){0xFF, 0xC3, 0xA9}, 3, 0, "\xEF\xBF\xBD\xC3\xA9");
    expect_decode(tok, (const int32_t[]){MINI_G_THE, MINI_IM_START, 'x'}, 3, 0,
                  " the<|im_start|>x");
    expect_decode(tok, (const int32_t[]){MINI_G_THE, MINI_IM_START, 'x'}, 3, 1, " thex");
    char *out;
    size_t len;
    assert_int_equal(tokenizer_decode(tok, (const int32_t[]){1, MINI_N_IDS}, 2, 0, &out, &len),
                     STRATA_ERANGE);
    assert_int_equal(tokenizer_decode(tok, (const int32_t[]){270}, 1, 0, &out, &len),
                     STRATA_ERANGE); /* a gap in the ids */
}

/* Pushes ids one at a time; returns the concatenation (malloc'ed). */
static char *stream_all(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    struct tokenizer_stream *s;
    assert_int_equal(tokenizer_stream_new(&s, tok, skip), 0);
    char *all = calloc(1, 1024);
    const char *piece;
    size_t len;
    for (size_t i = 0; i <= n; ++i) {
        assert_int_equal(i < n ? tokenizer_stream_push(s, ids[i], &piece, &len)
                               : tokenizer_stream_flush(s, &piece, &len),
                         0);
        strncat(all, piece, len);
    }
    tokenizer_stream_free(s);
    return all;
}

static void test_stream(void **state) {
    const struct tokenizer *tok = *state;
    const int32_t euro[] = {0xE2, 0x82, 0xAC, 'x', 0xF0, 0x9F, 0x98}; /* "€x" + cut emoji */
    struct tokenizer_stream *s;
    const char *piece;
    size_t len;
    assert_int_equal(tokenizer_stream_new(&s, tok, 0), 0);
    assert_int_equal(tokenizer_stream_push(s, euro[0], &piece, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tokenizer_stream_push(s, euro[1], &piece, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tokenizer_stream_push(s, euro[2], &piece, &len), 0);
    assert_string_equal(piece, "\xE2\x82\xAC");
    assert_int_equal(tokenizer_stream_push(s, -5, &piece, &len), STRATA_ERANGE);
    tokenizer_stream_free(s);
    char *all = stream_all(tok, euro, 7, 0);
    assert_string_equal(all, "\xE2\x82\xAC"
                             "x"
                             "\xEF\xBF\xBD");
    free(all);
    /* A skipped special token between the bytes of one character does not split it. */
    all = stream_all(tok, (const int32_t[]){0xC3, MINI_IM_START, 0xA9}, 3, 1);
    assert_string_equal(all, "\xC3\xA9");
    free(all);
    all = stream_all(tok, (const int32_t[]){0xC3, MINI_IM_START, 0xA9}, 3, 0);
    assert_string_equal(all, "\xEF\xBF\xBD<|im_start|>\xEF\xBF\xBD");
    free(all);
}

static void test_bad_text(void **state) {
    const struct tokenizer *tok = *state;
    struct tokenizer_ids ids = {0};
    static const char *const bad[] = {
        "\x80", "ab\xC3", "\xC0\xAF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        assert_int_equal(tokenizer_encode(tok, bad[i], strlen(bad[i]), &ids), STRATA_EINVAL);
        assert_non_null(strstr(strata_last_error(), "invalid UTF-8 at byte offset"));
    }
    assert_int_equal(ids.n, 0);
}

struct bad_case {
    const char *extra, *cfg, *gen, *message;
};

static const struct bad_case bad_cases[] = {
    {"\"model\": 1, ", 0, 0, "\"model\" is missing"},
    {"\"model\": {\"merges\": []}, ", 0, 0, "model.vocab is missing"},
    {"\"model\": {\"vocab\": {}, \"merges\": {}}, ", 0, 0, "model.merges is missing"},
    {"\"added_tokens\": [], \"model\": {\"vocab\": {}, \"merges\": []}, ", 0, 0,
     "model.vocab is empty"},
    {"\"model\": {\"vocab\": {\"a\": \"x\"}, \"merges\": []}, ", 0, 0, "needs an id"},
    {"\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}, ", 0, 0, "needs an id"},
    {"\"model\": {\"vocab\": {\"a\": 1.5}, \"merges\": []}, ", 0, 0, "needs an id"},
    {"\"model\": {\"vocab\": {\"a\": 1e12}, \"merges\": []}, ", 0, 0, "needs an id"},
    {"\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}, ", 0, 0, "id 0 twice"},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, ", 0, 0, "byte 0x00"},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [[\"a\", \"q\"]]}, ", 0, 0,
     "not in model.vocab"},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}, ", 0, 0, "not a pair"},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}, ", 0, 0, "not a pair"},
    {"\"model\": {\"type\": \"WordPiece\", \"vocab\": {}, \"merges\": []}, ", 0, 0,
     "model \"WordPiece\""},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}, ", 0, 0,
     "model.dropout"},
    {"\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": true}, ", 0, 0,
     "byte_fallback"},
    {"\"added_tokens\": {}, ", 0, 0, "added_tokens is not an array"},
    {"\"added_tokens\": [{\"id\": 5}], ", 0, 0, "no content"},
    {"\"added_tokens\": [{\"content\": \"x\"}], ", 0, 0, "added_tokens[].id"},
    {"\"added_tokens\": [{\"id\": 5, \"content\": \"x\", \"lstrip\": true}], ", 0, 0,
     "lstrip/rstrip/single_word"},
    {"\"normalizer\": {\"type\": \"NFKC\"}, ", 0, 0, "normalizer \"NFKC\""},
    {"\"pre_tokenizer\": null, ", 0, 0, "pre_tokenizer is missing"},
    {"\"pre_tokenizer\": {\"type\": \"Whitespace\"}, ", 0, 0, "pre_tokenizer \"Whitespace\""},
    {"\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}, ", 0, 0,
     "add_prefix_space"},
    {"\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
     "\"behavior\": \"Isolated\"}, ",
     0, 0, "Split regex"},
    {"\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
     "\"behavior\": \"Isolated\"}, ",
     0, 0, "behavior Isolated"},
    {"\"decoder\": {\"type\": \"WordPiece\"}, ", 0, 0, "decoder \"WordPiece\""},
    {"", "{\"eos_token\": \"<nope>\"}", 0, "eos_token \"<nope>\" is not a token"},
    {"", "{\"eos_token\": 5}", 0, "eos_token is not a string"},
    {"", "[]", 0, "tokenizer_config.json is not a JSON object"},
    {"", 0, "{\"eos_token_id\": 270}", "eos id 270 is not a token"},
    {"", 0, "{\"eos_token_id\": [1, \"x\"]}", "eos_token_id[]"},
    {"", 0, "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", "more than 8 eos ids"},
    {"", 0, "nope", "generation_config.json is not a JSON object"},
};

static void test_bad_tokenizer_json(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; ++i) {
        const struct bad_case *c = &bad_cases[i];
        int st;
        struct tokenizer *tok = load_mini(c->extra, c->cfg, c->gen, &st);
        if (st == 0 || !strstr(strata_last_error(), c->message))
            printf("case %zu: status %d, message \"%s\", want \"%s\"\n", i, st, strata_last_error(),
                   c->message);
        assert_null(tok);
        assert_int_equal(st, STRATA_EFORMAT);
        assert_non_null(strstr(strata_last_error(), c->message));
    }
    struct tokenizer *tok;
    assert_int_equal(tokenizer_load_json(&tok, "{\"model\"", 8, NULL, NULL), STRATA_EFORMAT);
    assert_int_equal(tokenizer_load_json(&tok, "[]", 2, NULL, NULL), STRATA_EFORMAT);
    assert_int_equal(tokenizer_load(&tok, "/nonexistent"), STRATA_ENOTFOUND);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe),          cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_decode_lossy), cmocka_unit_test(test_stream),
        cmocka_unit_test(test_bad_text),     cmocka_unit_test(test_bad_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
