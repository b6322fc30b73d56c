/* Building blocks of the tokenizer: byte buffers, the two hash maps, GPT-2's byte-level
 * alphabet, UTF-8 checks and lossy conversion, and the Oniguruma -> PCRE2 pattern rewrite. */
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/text/tokenizer_internal.h"

int tok_buf_append(struct tok_buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (%zu bytes)", cap);
        b->data = p;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = 0; /* always NUL-terminated, so results can be returned as strings */
    return 0;
}

/* tokenizers/src/pre_tokenizers/byte_level.rs bytes_char(): bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF map to themselves; the remaining 68 bytes map to 256, 257, ... in byte order. */
static int printable_byte(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (printable_byte(b)) return b;
    uint32_t n = 0;
    for (unsigned i = 0; i < b; ++i)
        n += !printable_byte(i);
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return printable_byte(cp) ? (int)cp : -1;
    uint32_t n = 256;
    for (unsigned b = 0; b < 256; ++b) {
        if (printable_byte(b)) continue;
        if (n++ == cp) return (int)b;
    }
    return -1;
}

int tok_utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint64_t hash_bytes(const char *s, size_t n) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < expected * 2)
        n *= 2; /* load factor <= 1/2 */
    return n;
}

int tok_str_map_init(struct tok_str_map *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (vocab map)");
    for (size_t i = 0; i < n; ++i)
        m->slots[i].len = UINT32_MAX;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

void tok_str_map_free(struct tok_str_map *m) {
    free(m->slots);
    m->slots = NULL;
}

int tok_str_map_put(struct tok_str_map *m, const struct tok_buf *arena, uint32_t off, uint32_t len,
                    int32_t value, int32_t *existing) {
    *existing = -1;
    if ((m->count + 1) * 2 > m->mask + 1)
        return strata_set_error(STRATA_EINVAL, "tokenizer: vocab map over capacity");
    size_t i = hash_bytes(arena->data + off, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        struct tok_str_slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) {
            s->off = off;
            s->len = len;
            s->value = value;
            m->count++;
            return 0;
        }
        if (s->len == len && memcmp(arena->data + s->off, arena->data + off, len) == 0) {
            *existing = s->value;
            return 0;
        }
    }
}

int32_t tok_str_map_get(const struct tok_str_map *m, const struct tok_buf *arena, const char *key,
                        size_t len) {
    size_t i = hash_bytes(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const struct tok_str_slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) return -1;
        if (s->len == len && memcmp(arena->data + s->off, key, len) == 0) return s->value;
    }
}

int tok_merge_map_init(struct tok_merge_map *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = malloc(n * sizeof *m->slots);
    if (!m->slots) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (merge map)");
    for (size_t i = 0; i < n; ++i)
        m->slots[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->count = 0;
    return 0;
}

void tok_merge_map_free(struct tok_merge_map *m) {
    free(m->slots);
    m->slots = NULL;
}

void tok_merge_map_put(struct tok_merge_map *m, int32_t left, int32_t right, int32_t rank,
                       int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = hash_u64(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX) m->count++;
    m->slots[i].key = key;
    m->slots[i].rank = rank;
    m->slots[i].merged = merged;
}

const struct tok_merge_slot *tok_merge_map_get(const struct tok_merge_map *m, int32_t left,
                                               int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = hash_u64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == UINT64_MAX) return NULL;
    }
}

/* Length of the valid UTF-8 sequence at in[0..n): > 0 complete, 0 a valid but incomplete
 * prefix running into the end, < 0 invalid with -(length of the maximal subpart). The
 * second-byte ranges are those of the Unicode Standard's table 3-7, which is what makes the
 * subparts "maximal" as Rust's from_utf8_lossy counts them. */
static int utf8_seq(const uint8_t *in, size_t n) {
    uint8_t b = in[0];
    if (b < 0x80) return 1;
    int width = b >= 0xC2 && b <= 0xDF   ? 2
                : b >= 0xE0 && b <= 0xEF ? 3
                : b >= 0xF0 && b <= 0xF4 ? 4
                                         : 0;
    if (!width) return -1;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
    for (int k = 1; k < width; ++k) {
        if ((size_t)k >= n) return 0;
        if (in[k] < lo || in[k] > hi) return -k;
        lo = 0x80;
        hi = 0xBF;
    }
    return width;
}

int tok_utf8_validate(const char *text, size_t len) {
    const uint8_t *p = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        int k = utf8_seq(p + i, len - i);
        if (k <= 0)
            return strata_set_error(STRATA_EINVAL, "invalid UTF-8 at byte offset %zu (byte 0x%02X)",
                                    i, p[i]);
        i += (size_t)k;
    }
    return 0;
}

long tok_utf8_lossy(struct tok_buf *out, const uint8_t *in, size_t n, int final) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the pending valid bytes */
    while (i < n) {
        int k = utf8_seq(in + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_buf_append(out, in + run, i - run) != 0) return STRATA_ENOMEM;
        if (k == 0 && !final) return (long)i; /* hold the incomplete tail back */
        if (tok_buf_append(out, fffd, 3) != 0) return STRATA_ENOMEM;
        i += k == 0 ? n - i : (size_t)-k;
        run = i;
    }
    if (tok_buf_append(out, in + run, i - run) != 0) return STRATA_ENOMEM;
    return (long)i;
}

/* Copies an Oniguruma (?i:...) group whose body is plain literals and alternation, writing
 * each ASCII letter as a class [xX]. HF tokenizers compiles the pattern with Oniguruma, whose
 * (?i) folds ASCII letters only here (HF encodes "'ſ" (U+017F) as "'" + "ſ", not as the
 * contraction "'s"), while PCRE2 10.42 with UCP would also fold ſ to s and K (U+212A) to k.
 * Returns the bytes consumed after "(?i:", or 0 when the body is not that simple. */
static size_t ascii_caseless_group(const char *p, size_t n, struct tok_buf *out) {
    size_t i = 0;
    for (; i < n && p[i] != ')'; ++i)
        if (strchr("\\[(.*+?{", p[i])) return 0;
    if (i == n) return 0;
    if (tok_buf_append(out, "(?:", 3) != 0) return 0;
    for (size_t k = 0; k < i; ++k) {
        char c = p[k], cls[4] = {'[', c, c, ']'};
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            cls[1] = (char)(c | 0x20);
            cls[2] = (char)(c & ~0x20);
            if (tok_buf_append(out, cls, 4) != 0) return 0;
        } else if (tok_buf_append(out, &c, 1) != 0) {
            return 0;
        }
    }
    return tok_buf_append(out, ")", 1) == 0 ? i + 1 : 0;
}

/* Oniguruma's \s (and \S) is the Unicode White_Space property; PCRE2's \s under UCP is
 * \p{Z} plus \h and \v, which also holds U+180E (MONGOLIAN VOWEL SEPARATOR, no longer
 * White_Space since Unicode 6.3). PCRE2 >= 10.40 names the property itself, inside a
 * class as well. */
int tok_regex_translate(const char *onig, size_t len, char **out) {
    struct tok_buf b = {0};
    int st = tok_buf_append(&b, "", 0);
    for (size_t i = 0; st == 0 && i < len; ++i) {
        if (onig[i] == '\\' && i + 1 < len) {
            char c = onig[++i];
            if (c == 's')
                st = tok_buf_append(&b, "\\p{White_Space}", 15);
            else if (c == 'S')
                st = tok_buf_append(&b, "\\P{White_Space}", 15);
            else
                st = tok_buf_append(&b, onig + i - 1, 2);
        } else if (len - i >= 4 && memcmp(onig + i, "(?i:", 4) == 0) {
            size_t used = ascii_caseless_group(onig + i + 4, len - i - 4, &b);
            if (used)
                i += 3 + used;
            else
                st = tok_buf_append(&b, onig + i, 1);
        } else {
            st = tok_buf_append(&b, onig + i, 1);
        }
    }
    if (st != 0) {
        free(b.data);
        return st;
    }
    *out = b.data;
    return 0;
}
