/* Thread-local error messages behind strata_set_error()/strata_last_error(). */
#include "runtime/base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERROR_CAP 1024

static _Thread_local char last_error[ERROR_CAP];

/* Formats into a buffer of its own first: an argument may be strata_last_error() itself,
 * and vsnprintf into the buffer it reads is undefined (in practice a garbled message). */
int strata_set_error(int code, const char *fmt, ...) {
    char msg[ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return code;
}

int strata_wrap_error(int code, const char *fmt, ...) {
    char msg[ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    /* ": " and the message before, as far as they fit. */
    const char *parts[2] = {last_error[0] ? ": " : "", last_error};
    for (int p = 0; p < 2; p++)
        for (const char *c = parts[p]; *c && len + 1 < sizeof msg; c++)
            msg[len++] = *c;
    msg[len] = 0;
    memcpy(last_error, msg, sizeof msg);
    return code;
}

const char *strata_last_error(void) {
    return last_error;
}

const char *strata_status_name(int code) {
    switch (code) {
    case STRATA_OK: return "OK";
    case STRATA_EINVAL: return "EINVAL";
    case STRATA_ENOMEM: return "ENOMEM";
    case STRATA_EIO: return "EIO";
    case STRATA_EFORMAT: return "EFORMAT";
    case STRATA_ENOTFOUND: return "ENOTFOUND";
    case STRATA_ERANGE: return "ERANGE";
    case STRATA_EVERSION: return "EVERSION";
    case STRATA_ETIMEOUT: return "ETIMEOUT";
    case STRATA_EAUTH: return "EAUTH";
    case STRATA_ECLOSED: return "ECLOSED";
    case STRATA_EBUSY: return "EBUSY";
    case STRATA_ECANCELED: return "ECANCELED";
    case STRATA_EDEVICE: return "EDEVICE";
    case STRATA_EPEER: return "EPEER";
    default: return "EUNKNOWN";
    }
}
