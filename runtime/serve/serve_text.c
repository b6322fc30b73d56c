/* Stop strings over streamed text (see serve_text.h). */
#include "runtime/serve/serve_text.h"

#include <string.h>

void serve_text_init(struct serve_text *t, const struct serve_params *p) {
    memset(t, 0, sizeof *t);
    t->stops = p->stops;
    t->n_stops = p->n_stops;
    for (int i = 0; i < p->n_stops; i++)
        if (strlen(p->stops[i]) > t->max_stop) t->max_stop = strlen(p->stops[i]);
}

void serve_text_free(struct serve_text *t) {
    serve_buf_free(&t->text);
}

/* Earliest position of a stop string at or after `from`, or -1. memmem, not strstr: decoded
 * text may hold NUL bytes. */
static long find_stop(const struct serve_text *t, size_t from) {
    long best = -1;
    for (int i = 0; i < t->n_stops; i++) {
        size_t n = strlen(t->stops[i]);
        const char *hit = memmem(t->text.data + from, t->text.len - from, t->stops[i], n);
        if (hit && (best < 0 || hit - t->text.data < best)) best = hit - t->text.data;
    }
    return best;
}

int serve_text_push(struct serve_text *t, const char *piece, size_t len) {
    if (t->stopped || len == 0) return t->stopped;
    size_t old = t->text.len;
    int rc = serve_buf_append(&t->text, piece, len);
    if (rc < 0) return rc;
    if (t->n_stops == 0) return 0;
    /* A stop string found now ends in the new piece, so it starts at most max_stop - 1
     * bytes before it. */
    size_t from = old > t->max_stop ? old - t->max_stop + 1 : 0;
    long at = find_stop(t, from);
    if (at < 0) return 0;
    t->text.len = (size_t)at;
    t->text.data[at] = '\0';
    t->stopped = 1;
    return 1;
}

void serve_text_take(struct serve_text *t, int final, const char **out, size_t *len) {
    size_t end = t->text.len;
    if (!final && !t->stopped && t->max_stop > 1) {
        /* Hold back the last max_stop - 1 bytes (a stop string may be starting there),
         * moved back to a character boundary so no piece splits a character. */
        end = end > t->max_stop - 1 ? end - (t->max_stop - 1) : 0;
        while (end > t->emitted && ((unsigned char)t->text.data[end] & 0xC0) == 0x80)
            end--;
    }
    if (end < t->emitted) end = t->emitted;
    *out = t->text.data ? t->text.data + t->emitted : "";
    *len = end - t->emitted;
    t->emitted = end;
}
