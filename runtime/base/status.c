/* Thread-local error messages behind strata_set_error()/strata_last_error(). */
#include "runtime/base/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int strata_set_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
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
