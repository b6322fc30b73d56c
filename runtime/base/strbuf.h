/* A growing string for writers that assemble text from many pieces (a safetensors header,
 * a chat template's rendering). Appends report nothing: the first allocation failure sticks
 * in `failed`, later appends do nothing, and the owner checks the flag once at the end (and
 * reports STRATA_ENOMEM its own way), instead of checking every call. */
#ifndef STRATA_RUNTIME_BASE_STRBUF_H
#define STRATA_RUNTIME_BASE_STRBUF_H

#include <stddef.h>

/* Zero-initialise ({0}) before use. While !failed and after any append, s is non-NULL and
 * s[len] == '\0'. */
struct strbuf {
    char *s;
    size_t len, cap;
    int failed;
};

/* Appends n bytes of s (which may hold NULs); n == 0 still allocates the empty string. */
void strbuf_put(struct strbuf *b, const char *s, size_t n);
/* Appends the NUL-terminated s. */
void strbuf_puts(struct strbuf *b, const char *s);
/* Appends printf's rendering of fmt; a format error sets `failed` too. */
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees the text and zeroes b (accepts a zeroed b). */
void strbuf_free(struct strbuf *b);

#endif
