/* Byte-level BPE tokenizer for Hugging Face `tokenizer.json` files as Qwen2/Qwen3(-VL) ship
 * them, producing the ids of HF `tokenizers`' Tokenizer.encode(text, add_special_tokens=False)
 * and the text of Tokenizer.decode(ids) (tokenizers 0.22).
 *
 * Encode follows HF's order (tokenizers/src/tokenizer/added_vocabulary.rs,
 * extract_and_normalize): added tokens with normalized=false are split out of the raw text
 * first (leftmost-longest match), every other piece is NFC-normalised (HF's NFC, nfc.h), then
 * added tokens with normalized=true are split out, and the remaining text is split by the
 * pre-tokenizer's regex (PCRE2, behaviour "Isolated"), mapped byte by byte to GPT-2's
 * byte-to-unicode alphabet and merged by BPE rank.
 *
 * Decode maps each id to its token (added tokens first), reverses the byte-level mapping per
 * token and converts the bytes to UTF-8 like Rust's String::from_utf8_lossy: each maximal
 * invalid subsequence becomes U+FFFD (HF decode's errors='replace').
 *
 * A loaded tokenizer is read-only, so one may be shared by threads. Errors follow the one
 * idiom (runtime/base/status.h). */
#ifndef STRATA_RUNTIME_TEXT_TOKENIZER_H
#define STRATA_RUNTIME_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* Most eos ids a tokenizer keeps (tokenizer_config's eos_token + generation_config's). */
#define TOKENIZER_MAX_EOS 8

/* Loads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and
 * DIR/generation_config.json (optional). STRATA_ENOTFOUND when tokenizer.json is missing,
 * STRATA_EFORMAT for malformed or unsupported content (the message names the field). */
int tokenizer_load(struct tokenizer **out, const char *dir);

/* The same from memory: `tokenizer_json` (len bytes, need not be NUL-terminated); the two
 * configs are NUL-terminated JSON texts or NULL. */
int tokenizer_load_json(struct tokenizer **out, const char *tokenizer_json, size_t len,
                        const char *config_json, const char *generation_json);

void tokenizer_free(struct tokenizer *tok);

/* Growable id array that tokenizer_encode appends to. Zero-initialise; free with
 * tokenizer_ids_free. */
struct tokenizer_ids {
    int32_t *ids;
    size_t n, cap;
};
void tokenizer_ids_free(struct tokenizer_ids *ids);

/* Appends the ids of `text` (len bytes of UTF-8; NUL bytes are ordinary characters) to
 * *ids. Invalid UTF-8 is STRATA_EINVAL naming the byte offset (HF accepts only str, so
 * there is no truth to follow for bytes). On failure *ids keeps its old length. */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                     struct tokenizer_ids *ids);

/* Decodes ids into a malloc'ed, NUL-terminated UTF-8 string (*len bytes without the NUL).
 * skip_special drops added tokens marked special (HF's skip_special_tokens). An id with no
 * token is STRATA_ERANGE naming its position (HF drops such ids silently). */
int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                     char **out, size_t *len);

/* Incremental decoder for generated tokens: the concatenation of everything it returns
 * equals tokenizer_decode of all ids pushed. Bytes of a character split across tokens are
 * held back until the character is complete, so no piece ever ends in broken UTF-8. */
struct tokenizer_stream;
int tokenizer_stream_new(struct tokenizer_stream **out, const struct tokenizer *tok,
                         int skip_special);
/* Pushes one id; *text and *len receive the newly complete UTF-8 (possibly empty), valid until
 * the next call on the stream. */
int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the stream: held-back bytes come out as U+FFFD. The stream can then be reused. */
int tokenizer_stream_flush(struct tokenizer_stream *s, const char **text, size_t *len);
void tokenizer_stream_free(struct tokenizer_stream *s);

/* One past the largest id (vocabulary and added tokens). */
int32_t tokenizer_n_ids(const struct tokenizer *tok);

/* The id of a token by its exact text (added tokens first, then the BPE vocabulary, whose
 * entries are in byte-level form, e.g. "Ġthe"); -1 when there is none. */
int32_t tokenizer_token_id(const struct tokenizer *tok, const char *token);

/* 1 when id is an added token (special or not), else 0. Added tokens are split out of the
 * text before anything else, so the text between two of them is tokenized on its own. */
int tokenizer_is_added(const struct tokenizer *tok, int32_t id);

/* 1 when id is an added token marked special, else 0. */
int tokenizer_is_special(const struct tokenizer *tok, int32_t id);

/* End-of-sequence ids: tokenizer_config.json's eos_token, then generation_config.json's
 * eos_token_id (a number or a list), without repeats. Returns the count (0..MAX_EOS). */
int tokenizer_eos_ids(const struct tokenizer *tok, int32_t out[TOKENIZER_MAX_EOS]);

#endif
