#include "runtime/base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for `more` bytes and the NUL after them, doubling; 0, or -1 with `failed` set. */
static int reserve(struct strbuf *b, size_t more) {
    if (b->failed) return -1;
    if (b->len + more + 1 <= b->cap && b->s) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + more + 1) {
        if (cap > (size_t)-1 / 2) {
            b->failed = 1;
            return -1;
        }
        cap *= 2;
    }
    char *s = realloc(b->s, cap);
    if (!s) {
        b->failed = 1;
        return -1;
    }
    b->s = s;
    b->cap = cap;
    return 0;
}

void strbuf_put(struct strbuf *b, const char *s, size_t n) {
    if (n > (size_t)-1 - b->len - 1) b->failed = 1;
    if (reserve(b, n)) return;
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void strbuf_puts(struct strbuf *b, const char *s) {
    strbuf_put(b, s, strlen(s));
}

/* Formats into the spare room first and again only when it did not fit: the JSON writers'
 * many short pieces are formatted once. */
void strbuf_printf(struct strbuf *b, const char *fmt, ...) {
    if (reserve(b, 0)) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        b->s[b->len] = '\0';
        return;
    }
    if ((size_t)n >= b->cap - b->len) {
        if (reserve(b, (size_t)n)) {
            b->s[b->len] = '\0';
            return;
        }
        va_start(ap, fmt);
        vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void strbuf_free(struct strbuf *b) {
    free(b->s);
    *b = (struct strbuf){0};
}
