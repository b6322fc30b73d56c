/* The console's URLs over the embedded files (see serve_console.h). */
#include "runtime/serve/serve_console.h"

#include <string.h>

static const char *type_of(const char *name) {
    static const struct {
        const char *ext, *type;
    } types[] = {{".html", "text/html; charset=utf-8"},
                 {".css", "text/css; charset=utf-8"},
                 {".js", "text/javascript; charset=utf-8"},
                 {".svg", "image/svg+xml"},
                 {".png", "image/png"}};
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof *types; i++)
        if (!strcmp(dot, types[i].ext)) return types[i].type;
    return "application/octet-stream";
}

const struct serve_asset *serve_console_find(const char *url, const char **content_type) {
    const char *name = NULL;
    if (!strcmp(url, "/"))
        name = "index.html";
    else if (!strcmp(url, "/pipeline"))
        name = "pipeline.html";
    else if (!strncmp(url, "/console/", 9) && !strstr(url + 9, ".html")) /* pages: by URL */
        name = url + 9;
    if (!name || !*name || strchr(name, '/')) return NULL;
    for (int i = 0; i < serve_console_num_assets; i++)
        if (!strcmp(serve_console_assets[i].name, name)) {
            *content_type = type_of(name);
            return &serve_console_assets[i];
        }
    return NULL;
}
