/* Internals shared by tokenizer_load.c, tokenizer_encode.c and tokenizer_decode.c. */
#ifndef STRATA_RUNTIME_TEXT_TOKENIZER_INTERNAL_H
#define STRATA_RUNTIME_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

/* Ids above this are refused at load: a hostile file must not make us allocate per-id
 * tables of gigabytes. Real vocabularies are below 2^19. */
#define TOK_MAX_ID (1 << 20)

/* Growable byte buffer; strings are stored as (offset, length) into one. */
struct tok_buf {
    char *data;
    size_t len, cap;
};
int tok_buf_append(struct tok_buf *b, const void *data, size_t n);

/* Open-addressing hash map from byte strings (kept in an arena) to int32 values. */
struct tok_str_slot {
    uint32_t off, len; /* len == UINT32_MAX: empty */
    int32_t value;
};
struct tok_str_map {
    struct tok_str_slot *slots;
    size_t mask, count;
};

/* Open-addressing hash map from a pair of ids to (rank, merged id). */
struct tok_merge_slot {
    uint64_t key; /* (uint64)left << 32 | right; UINT64_MAX: empty */
    int32_t rank, merged;
};
struct tok_merge_map {
    struct tok_merge_slot *slots;
    size_t mask, count;
};

struct tok_added {
    int32_t id;
    uint32_t off, len; /* content in tok->strings */
    uint8_t special, normalized;
};

struct tokenizer {
    struct tok_buf strings;      /* token texts (byte-level form for the vocabulary) */
    struct tok_buf decoded;      /* each id's bytes after the ByteLevel decoder */
    int32_t n_ids;               /* one past the largest id */
    uint32_t *tok_off;           /* [n_ids] */
    int32_t *tok_len;            /* [n_ids], -1: no token has this id */
    uint32_t *dec_off;           /* [n_ids] */
    uint32_t *dec_len;           /* [n_ids] */
    uint8_t *special;            /* [n_ids] */
    struct tok_str_map vocab;    /* model.vocab */
    struct tok_merge_map merges; /* model.merges */
    struct tok_added *added;     /* sorted longest content first */
    int n_added;
    uint8_t added_first[2][256]; /* [normalized][first byte]: some added token starts so */
    int32_t byte_id[256];        /* id of each byte's byte-level character */
    int nfc;                     /* normalizer is NFC (else none) */
    int ignore_merges;           /* model.ignore_merges: whole words looked up first */
    pcre2_code *split_re;        /* pre-tokenizer Split regex (NULL: no split) */
    int32_t eos[TOKENIZER_MAX_EOS];
    int n_eos;
};

/* GPT-2's bytes_to_unicode(): the code point that stands for byte b in byte-level tokens
 * (printable Latin-1 bytes stand for themselves, the other 68 map to U+0100.. in order). */
uint32_t tok_byte_to_cp(uint8_t b);
/* The inverse: the byte for code point cp, or -1 when cp is not in the alphabet. */
int tok_cp_to_byte(uint32_t cp);
/* UTF-8 encodes cp (< 0x110000) into out[4]; returns the length. */
int tok_utf8_put(char *out, uint32_t cp);

int tok_str_map_init(struct tok_str_map *m, size_t expected);
void tok_str_map_free(struct tok_str_map *m);
/* Inserts key -> value unless present; *existing gets the old value or -1. */
int tok_str_map_put(struct tok_str_map *m, const struct tok_buf *arena, uint32_t off, uint32_t len,
                    int32_t value, int32_t *existing);
int32_t tok_str_map_get(const struct tok_str_map *m, const struct tok_buf *arena, const char *key,
                        size_t len);

int tok_merge_map_init(struct tok_merge_map *m, size_t expected);
void tok_merge_map_free(struct tok_merge_map *m);
/* Inserts or overwrites (HF builds its merge map with collect(), so a later duplicate wins). */
void tok_merge_map_put(struct tok_merge_map *m, int32_t left, int32_t right, int32_t rank,
                       int32_t merged);
const struct tok_merge_slot *tok_merge_map_get(const struct tok_merge_map *m, int32_t left,
                                               int32_t right);

/* Rewrites an Oniguruma pattern (what HF tokenizers compiles) into PCRE2 syntax with the
 * same meaning; see the definition for the two differences it covers. malloc'ed result. */
int tok_regex_translate(const char *onig, size_t len, char **out);

/* Checks that text is valid UTF-8; STRATA_EINVAL naming the first bad byte offset. */
int tok_utf8_validate(const char *text, size_t len);

/* Appends bytes to out as UTF-8, replacing each maximal invalid subsequence with U+FFFD
 * (Rust's String::from_utf8_lossy). When !final, an incomplete but so far valid sequence
 * at the end is not consumed. Returns the number of input bytes consumed, or a negative
 * status (no memory). */
long tok_utf8_lossy(struct tok_buf *out, const uint8_t *in, size_t n, int final);

#endif
