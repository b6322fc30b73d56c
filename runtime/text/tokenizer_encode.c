/* text -> ids, in HF tokenizers' order (tokenizer/added_vocabulary.rs extract_and_normalize,
 * then pre_tokenizers/split.rs, pre_tokenizers/byte_level.rs, models/bpe/word.rs). */
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/text/nfc.h"
#include "runtime/text/tokenizer_internal.h"

struct bpe_entry {
    int32_t rank, pos, merged;
};

/* Per-call scratch: one encode call is independent of every other, so a shared tokenizer
 * needs no lock. */
struct encode_ctx {
    const struct tokenizer *tok;
    struct tokenizer_ids *out;
    pcre2_match_data *md;
    int32_t *sym, *prev, *next; /* BPE symbols of the current word, a linked list */
    struct bpe_entry *heap;
    size_t cap, heap_n;
};

static int push_id(struct encode_ctx *c, int32_t id) {
    struct tokenizer_ids *o = c->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *p = realloc(o->ids, cap * sizeof *p);
        if (!p) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (%zu ids)", cap);
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

static int reserve_word(struct encode_ctx *c, size_t n) {
    if (n <= c->cap) return 0;
    size_t cap = c->cap ? c->cap : 64;
    while (cap < n)
        cap *= 2;
    free(c->sym);
    free(c->prev);
    free(c->next);
    free(c->heap);
    c->sym = malloc(cap * sizeof *c->sym);
    c->prev = malloc(cap * sizeof *c->prev);
    c->next = malloc(cap * sizeof *c->next);
    c->heap = malloc(3 * cap * sizeof *c->heap); /* n - 1 initial pairs + 2 per merge */
    c->cap = cap;
    if (!c->sym || !c->prev || !c->next || !c->heap) {
        c->cap = 0;
        return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (word of %zu bytes)", n);
    }
    return 0;
}

/* Min-heap on (rank, pos): word.rs pops the lowest rank, the leftmost among equal ranks. */
static int entry_less(const struct bpe_entry *a, const struct bpe_entry *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push_pair(struct encode_ctx *c, int32_t left) {
    if (left < 0 || c->next[left] < 0) return;
    const struct tok_merge_slot *m =
        tok_merge_map_get(&c->tok->merges, c->sym[left], c->sym[c->next[left]]);
    if (!m) return;
    size_t i = c->heap_n++;
    c->heap[i] = (struct bpe_entry){m->rank, left, m->merged};
    while (i > 0 && entry_less(&c->heap[i], &c->heap[(i - 1) / 2])) {
        struct bpe_entry t = c->heap[i];
        c->heap[i] = c->heap[(i - 1) / 2];
        c->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static struct bpe_entry heap_pop(struct encode_ctx *c) {
    struct bpe_entry top = c->heap[0];
    c->heap[0] = c->heap[--c->heap_n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < c->heap_n && entry_less(&c->heap[l], &c->heap[m])) m = l;
        if (r < c->heap_n && entry_less(&c->heap[r], &c->heap[m])) m = r;
        if (m == i) break;
        struct bpe_entry t = c->heap[i];
        c->heap[i] = c->heap[m];
        c->heap[m] = t;
        i = m;
    }
    return top;
}

/* ignore_merges (models/bpe/model.rs tokenize_with_cache): a word that is itself in the
 * vocabulary is one token. Returns its id or -1. */
static int32_t whole_word(struct encode_ctx *c, const uint8_t *s, size_t n) {
    struct tok_buf w = {0};
    int32_t id = -1;
    for (size_t i = 0; i < n; ++i) {
        char u[4];
        if (tok_buf_append(&w, u, (size_t)tok_utf8_put(u, tok_byte_to_cp(s[i]))) != 0) break;
        if (i + 1 == n) id = tok_str_map_get(&c->tok->vocab, &c->tok->strings, w.data, w.len);
    }
    free(w.data);
    return id;
}

/* One pre-token: its bytes become byte-level symbols, then the pair with the lowest merge
 * rank is merged until none is left (word.rs merge_all, without dropout). */
static int bpe_word(struct encode_ctx *c, const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    if (c->tok->ignore_merges) {
        int32_t id = whole_word(c, s, n);
        if (id >= 0) return push_id(c, id);
    }
    int st = reserve_word(c, n);
    if (st != 0) return st;
    for (size_t i = 0; i < n; ++i) {
        c->sym[i] = c->tok->byte_id[s[i]];
        c->prev[i] = (int32_t)i - 1;
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    c->heap_n = 0;
    for (size_t i = 0; i + 1 < n; ++i)
        heap_push_pair(c, (int32_t)i);
    while (c->heap_n > 0) {
        struct bpe_entry e = heap_pop(c);
        int32_t r = c->next[e.pos];
        if (c->sym[e.pos] < 0 || r < 0) continue;
        /* A stale entry: the pair at pos changed since it was pushed (word.rs checks the
         * same: the pair must still merge into the id it was queued with). */
        const struct tok_merge_slot *m =
            tok_merge_map_get(&c->tok->merges, c->sym[e.pos], c->sym[r]);
        if (!m || m->merged != e.merged) continue;
        c->sym[e.pos] = e.merged;
        c->sym[r] = -1;
        c->next[e.pos] = c->next[r];
        if (c->next[r] >= 0) c->prev[c->next[r]] = e.pos;
        heap_push_pair(c, c->prev[e.pos]);
        heap_push_pair(c, e.pos);
    }
    for (int32_t i = 0; i >= 0 && st == 0; i = c->next[i])
        st = push_id(c, c->sym[i]);
    return st;
}

/* The Split pre-tokenizer with behaviour Isolated (pre_tokenizers/split.rs): every match and
 * every gap between matches is a pre-token of its own. */
static int split_and_bpe(struct encode_ctx *c, const char *s, size_t n) {
    const pcre2_code *re = c->tok->split_re;
    if (!re) return bpe_word(c, (const uint8_t *)s, n);
    size_t gap = 0, off = 0;
    while (off < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return strata_set_error(STRATA_EINVAL, "tokenizer: split regex failed: %s",
                                    (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        if (ov[1] == ov[0]) { /* empty match: skip one character, it stays in the gap */
            off = ov[0] + 1;
            while (off < n && ((uint8_t)s[off] & 0xC0) == 0x80)
                ++off;
            continue;
        }
        int st = bpe_word(c, (const uint8_t *)s + gap, ov[0] - gap);
        if (st == 0) st = bpe_word(c, (const uint8_t *)s + ov[0], ov[1] - ov[0]);
        if (st != 0) return st;
        gap = off = ov[1];
    }
    return bpe_word(c, (const uint8_t *)s + gap, n - gap);
}

/* Leftmost-longest match of an added token (HF builds an Aho-Corasick automaton with
 * MatchKind::LeftmostLongest) among those with the given `normalized` flag, at or after
 * `from`. Returns the index into tok->added, or -1; *at receives the start. */
static int find_added(const struct tokenizer *tok, int normalized, const char *s, size_t n,
                      size_t from, size_t *at) {
    for (size_t i = from; i < n; ++i) {
        if (!tok->added_first[normalized][(uint8_t)s[i]]) continue;
        for (int k = 0; k < tok->n_added; ++k) { /* longest first */
            const struct tok_added *a = &tok->added[k];
            if (a->normalized != normalized || a->len > n - i) continue;
            if (memcmp(s + i, tok->strings.data + a->off, a->len) == 0) {
                *at = i;
                return k;
            }
        }
    }
    return -1;
}

typedef int (*segment_fn)(struct encode_ctx *c, const char *s, size_t n);

/* Splits s around added tokens: each token becomes its id, each text between goes to fn. */
static int split_added(struct encode_ctx *c, int normalized, const char *s, size_t n,
                       segment_fn fn) {
    size_t pos = 0, at;
    int k, st;
    while ((k = find_added(c->tok, normalized, s, n, pos, &at)) >= 0) {
        if (at > pos && (st = fn(c, s + pos, at - pos)) != 0) return st;
        if ((st = push_id(c, c->tok->added[k].id)) != 0) return st;
        pos = at + c->tok->added[k].len;
    }
    return pos < n ? fn(c, s + pos, n - pos) : 0;
}

/* A piece between non-normalized added tokens: NFC as HF computes it (normalizers/unicode.rs,
 * NFC; runtime/text/nfc.h), then added tokens that match normalized text, then the
 * pre-tokenizer and BPE. */
static int normalize_piece(struct encode_ctx *c, const char *s, size_t n) {
    if (!c->tok->nfc) return split_added(c, 1, s, n, split_and_bpe);
    char *nfc;
    size_t m;
    int st = nfc_hf(&nfc, &m, s, n); /* s is valid UTF-8: only ENOMEM can fail here */
    if (st != 0) return st;
    st = split_added(c, 1, nfc, m, split_and_bpe);
    free(nfc);
    return st;
}

void tokenizer_ids_free(struct tokenizer_ids *ids) {
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                     struct tokenizer_ids *ids) {
    int st = tok_utf8_validate(text, len);
    if (st != 0) return st;
    struct encode_ctx c = {.tok = tok, .out = ids};
    size_t old_n = ids->n;
    if (tok->split_re) {
        c.md = pcre2_match_data_create_from_pattern(tok->split_re, NULL);
        if (!c.md) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (regex)");
    }
    st = split_added(&c, 0, text, len, normalize_piece);
    pcre2_match_data_free(c.md);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.heap);
    if (st != 0) ids->n = old_n;
    return st;
}
