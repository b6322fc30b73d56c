/* The answer's text as it streams, cut at OpenAI "stop" strings: the text ends before the
 * first stop string it contains, and while streaming, bytes that might still turn out to
 * start a stop string are held back (never whole characters split: pieces are UTF-8). */
#ifndef STRATA_RUNTIME_SERVE_SERVE_TEXT_H
#define STRATA_RUNTIME_SERVE_SERVE_TEXT_H

#include <stddef.h>

#include "runtime/serve/serve_json.h"
#include "runtime/serve/serve_request.h"

struct serve_text {
    struct serve_buf text; /* everything decoded so far (cut at the stop, once found) */
    size_t emitted;        /* bytes already handed out by serve_text_take */
    int stopped;           /* a stop string was found: the text is final */
    const char (*stops)[SERVE_MAX_STOP_LEN + 1];
    int n_stops;
    size_t max_stop; /* longest stop string */
};

void serve_text_init(struct serve_text *t, const struct serve_params *p);
void serve_text_free(struct serve_text *t);

/* Appends a decoded piece; returns 1 when the text now contains a stop string (it is cut
 * before it and later pieces are ignored), 0 otherwise, or a negative status. */
int serve_text_push(struct serve_text *t, const char *piece, size_t len);

/* The next bytes safe to send: *out [*len] (valid until the next push). final = no more
 * pieces come, so nothing is held back. */
void serve_text_take(struct serve_text *t, int final, const char **out, size_t *len);

#endif
