/* The web console's static files (runtime/serve/console/), compiled into strata-serve by
 * embed_assets, and the URLs they answer: GET / (the chat page), GET /pipeline (the ring
 * drawn live) and GET /console/<file> (their scripts and style). The pages use only the
 * server's own API (/v1/chat/completions, /v1/stages, /metrics), load nothing from elsewhere,
 * and are served under a Content-Security-Policy that allows nothing else. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_CONSOLE_H
#define STRATA_RUNTIME_SERVE_SERVE_CONSOLE_H

struct serve_asset {
    const char *name; /* the file's basename */
    const unsigned char *data;
    long len;
};

/* The generated table (embed_assets). */
extern const struct serve_asset serve_console_assets[];
extern const int serve_console_num_assets;

/* Scripts and styles from this origin only; images and videos also from data: and blob: URLs
 * (the chat page's thumbnails of attached files); fetches to this origin only; no frames,
 * forms, plugins or base URL. No inline script or style is allowed, so the pages have none. */
#define SERVE_CONSOLE_CSP                                                                          \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "        \
    "media-src data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "             \
    "frame-ancestors 'none'"

/* The asset `url` names (query string excluded by the caller), with its Content-Type; NULL
 * when the URL is not the console's. */
const struct serve_asset *serve_console_find(const char *url, const char **content_type);

#endif
