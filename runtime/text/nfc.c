/* HF tokenizers' NFC: utf8proc's NFC run on the text between the code points HF's older
 * tables do not know (nfc_table.c), those kept as they are (see nfc.h for why that is exact).
 * Text without such a code point (nearly all) is one utf8proc_map call, as before. */
#include "runtime/text/nfc.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "runtime/base/status.h"

int nfc_hf_is_inert(int32_t cp) {
    size_t lo = 0, hi = nfc_hf_inert_n;
    if (cp < nfc_hf_inert[0].lo) return 0;
    while (lo < hi) { /* first range whose hi >= cp */
        size_t mid = (lo + hi) / 2;
        if (nfc_hf_inert[mid].hi < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nfc_hf_inert_n && nfc_hf_inert[lo].lo <= cp;
}

/* Byte offset of the next inert code point at or after `i` (n if none), its length in *k.
 * Only lead bytes are decoded; ASCII and continuation bytes are stepped over. */
static int next_inert(size_t *at, size_t *k, const char *s, size_t n, size_t i) {
    while (i < n) {
        if ((uint8_t)s[i] < 0xC0) {
            ++i;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t m =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (m < 0)
            return strata_set_error(STRATA_EINVAL, "NFC: invalid UTF-8 at byte offset %zu", i);
        if (nfc_hf_is_inert(cp)) {
            *at = i;
            *k = (size_t)m;
            return 0;
        }
        i += (size_t)m;
    }
    *at = n;
    *k = 0;
    return 0;
}

static int map_nfc(utf8proc_uint8_t **out, utf8proc_ssize_t *out_len, const char *s, size_t n) {
    *out_len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, out,
                            UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (*out_len >= 0) return 0;
    return strata_set_error(*out_len == UTF8PROC_ERROR_NOMEM ? STRATA_ENOMEM : STRATA_EINVAL,
                            "NFC: %s", utf8proc_errmsg(*out_len));
}

/* Appends n bytes to the malloc'ed buffer *b (length *len, capacity *cap, one byte kept for
 * the NUL). */
static int append(char **b, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (*len + n + 1 > c)
            c *= 2;
        char *nb = realloc(*b, c);
        if (!nb) return strata_set_error(STRATA_ENOMEM, "NFC: out of memory (%zu bytes)", c);
        *b = nb;
        *cap = c;
    }
    memcpy(*b + *len, p, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

int nfc_hf(char **out, size_t *out_len, const char *s, size_t n) {
    size_t at, k, pos = 0, len = 0, cap = 0;
    utf8proc_uint8_t *seg = NULL;
    utf8proc_ssize_t m;
    char *b = NULL;
    int st = next_inert(&at, &k, s, n, 0);
    if (st == 0 && at == n && (st = map_nfc(&seg, &m, s, n)) == 0) { /* the usual case */
        *out = (char *)seg;
        *out_len = (size_t)m;
        return 0;
    }
    while (st == 0) {
        if (at > pos && (st = map_nfc(&seg, &m, s + pos, at - pos)) == 0) {
            st = append(&b, &len, &cap, seg, (size_t)m);
            free(seg);
        }
        if (st == 0) st = append(&b, &len, &cap, s + at, k); /* the inert code point */
        if (st != 0 || at == n) break;
        pos = at + k;
        st = next_inert(&at, &k, s, n, pos);
    }
    if (st != 0) {
        free(b);
        return st;
    }
    *out = b;
    *out_len = len;
    return 0;
}
