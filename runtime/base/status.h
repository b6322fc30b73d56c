/* Strata's one error idiom.
 *
 * Every library function returns an int status: 0 on success, a negative STRATA_E* code
 * on failure. The failing function records a human-readable message with
 * strata_set_error(); callers read it with strata_last_error(). The message buffer is
 * thread-local, so stage threads in the simulator never see each other's errors. Only
 * main() prints and exits. */
#ifndef STRATA_RUNTIME_BASE_STATUS_H
#define STRATA_RUNTIME_BASE_STATUS_H

enum {
    STRATA_OK = 0,
    STRATA_EINVAL = -1,     /* bad argument or malformed input */
    STRATA_ENOMEM = -2,     /* allocation failed */
    STRATA_EIO = -3,        /* file or socket I/O failed */
    STRATA_EFORMAT = -4,    /* file or frame does not follow its format */
    STRATA_ENOTFOUND = -5,  /* a named tensor, field or file is missing */
    STRATA_ERANGE = -6,     /* index, shard or sequence out of range */
    STRATA_EVERSION = -7,   /* incompatible protocol or format version */
    STRATA_ETIMEOUT = -8,   /* a deadline passed */
    STRATA_EAUTH = -9,      /* peer failed authentication */
    STRATA_ECLOSED = -10,   /* peer closed the connection */
    STRATA_EBUSY = -11,     /* capacity exhausted (admission control) */
    STRATA_ECANCELED = -12, /* request was cancelled */
    STRATA_EDEVICE = -13,   /* CUDA / device failure, or no device */
    STRATA_EPEER = -14      /* a remote stage reported an error */
};

/* Records a printf-style message for the current thread and returns `code`, so a
 * failure reads `return strata_set_error(STRATA_EINVAL, "bad %s", name);`. */
int strata_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Adds context in front of this thread's current message: the message becomes
 * "<formatted>: <message before>" and `code` is returned, so a caller passing a callee's
 * failure on reads `return strata_wrap_error(rc, "loading %s", path);`. Why not
 * strata_set_error(rc, "loading %s: %s", path, strata_last_error()): that formats into the
 * buffer it reads (strata_set_error copes, but the wrapping belongs in one place). */
int strata_wrap_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message recorded by the last failing call on this thread ("" if none). */
const char *strata_last_error(void);

/* A short fixed name for a status code ("EINVAL", ...). */
const char *strata_status_name(int code);

/* Process exit codes used by every Strata binary's main(). */
enum {
    STRATA_EXIT_OK = 0,
    STRATA_EXIT_FAILURE = 1, /* runtime failure (I/O, peer, timeout, mismatch) */
    STRATA_EXIT_USAGE = 2,   /* bad command line */
    STRATA_EXIT_INPUT = 3    /* bad model, config or weights */
};

#endif
