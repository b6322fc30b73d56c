/* A small tokenizer.json in Qwen's shape, built in memory for unit tests and fuzzing: the 256
 * byte-level tokens (id = byte value), a few merges, added tokens and Qwen's split regex. */
#ifndef STRATA_TESTS_RUNTIME_TEXT_MINI_TOKENIZER_H
#define STRATA_TESTS_RUNTIME_TEXT_MINI_TOKENIZER_H

/* Ids of the merged and added tokens (bytes are their own ids). */
enum {
    MINI_IN = 256,       /* "in" */
    MINI_AA,             /* "aa" */
    MINI_G_T,            /* "Ġt" */
    MINI_HE,             /* "he" */
    MINI_G_THE,          /* "Ġthe" */
    MINI_AAAA,           /* "aaaa" */
    MINI_IM_START = 300, /* "<|im_start|>", special */
    MINI_T,              /* "<t>", added, not special */
    MINI_TX,             /* "<t>x", added, not special */
    MINI_NORM,           /* "<é>" (NFC form), added with normalized=true */
    MINI_N_IDS
};

/* The tokenizer.json text, malloc'ed. `extra` ("" or members each followed by ", ") is put
 * first in the top-level object; cJSON finds the first of duplicate keys, so a member of
 * `extra` replaces the regular one (how the tests break one field at a time). */
char *mini_tokenizer_json(const char *extra);

/* GPT-2's bytes_to_unicode(): the code point of byte b's byte-level token (restated here so
 * fixtures do not trust the code under test). */
unsigned mini_byte_cp(unsigned b);

#endif
