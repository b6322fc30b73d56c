/* Thread-local stream capture for the host emulations (emulated_capture.h). */
#include "tests/backend_ops/emulated_capture.h"

#include <stddef.h>

#include "runtime/base/status.h"

static _Thread_local void *capturing; /* the stream this thread captures, or NULL */
static _Thread_local int spoiled;     /* a call failed during the capture */
static _Thread_local int nodes;       /* operations recorded by the capture */

int emulated_capture_begin(void *stream) {
    if (!stream)
        return strata_set_error(STRATA_EINVAL, "emulated cuda_graph_capture_begin: NULL stream");
    if (capturing)
        return strata_set_error(STRATA_EDEVICE, "emulated capture_begin: already capturing");
    capturing = stream;
    spoiled = 0;
    nodes = 0;
    return 0;
}

void emulated_capture_abort(void *stream) {
    if (capturing == stream) capturing = NULL;
}

int emulated_capture_end(void *stream, int *out_nodes) {
    *out_nodes = 0;
    if (!stream || capturing != stream)
        return strata_set_error(STRATA_EDEVICE, "emulated capture_end: stream is not capturing");
    capturing = NULL;
    if (spoiled)
        return strata_set_error(STRATA_EDEVICE, "emulated capture_end: capture invalidated");
    *out_nodes = nodes;
    return 0;
}

int emulated_capture_spoil(int rc) {
    if (capturing) spoiled = 1;
    return rc;
}

int emulated_capture_enqueue(const char *fn, void *stream) {
    if (!capturing) return 0;
    if (stream != capturing)
        return emulated_capture_spoil(strata_set_error(
            STRATA_EDEVICE, "emulated %s: stream %p is not the capturing stream", fn, stream));
    nodes++;
    return 0;
}

int emulated_capture_sync(const char *fn) {
    if (!capturing) return 0;
    return emulated_capture_spoil(strata_set_error(
        STRATA_EDEVICE, "emulated %s: operation not permitted when stream is capturing", fn));
}

int emulated_capturing(void) {
    return capturing != NULL;
}
