/* libFuzzer target for the HTTP front's request-body decoder (runtime/serve/serve_request:
 * POST /v1/chat/completions and /v1/completions bodies): any bytes must parse into checked
 * parameters or fail with a 4xx and a message, never crash, leak or read out of bounds. The
 * first byte picks the endpoint; an accepted body is re-checked against the ranges it was
 * accepted under. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/serve/serve_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const struct serve_limits limits = {"qwen3", 4096};
    struct serve_params p;
    struct serve_error err;
    if (size < 1) return 0;
    enum serve_kind kind = (data[0] & 1) ? SERVE_CHAT : SERVE_COMPLETION;
    memset(&p, 0, sizeof p);
    int rc = serve_params_parse(&p, kind, (const char *)data + 1, size - 1, &limits, &err);
    if (rc == 0) {
        if (serve_params_check(&p, &limits, &err) != 0) __builtin_trap();
        if (kind == SERVE_CHAT ? !p.messages_json : !p.prompt) __builtin_trap();
        if (p.n_stops < 0 || p.n_stops > SERVE_MAX_STOPS) __builtin_trap();
    } else if (err.http_status < 400 || err.http_status >= 500 || !err.message[0] ||
               strlen(err.message) >= sizeof err.message) {
        __builtin_trap();
    }
    serve_params_free(&p);
    return 0;
}
