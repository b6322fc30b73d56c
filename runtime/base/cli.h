/* Small helpers the binaries (and their tests) share: checked integer (list) parsing, whole-file
 * reads, port files and a monotonic clock. They follow the one error idiom: a negative
 * STRATA_E* status with a strata_set_error() message; the caller's main() prints it. */
#ifndef STRATA_RUNTIME_BASE_CLI_H
#define STRATA_RUNTIME_BASE_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Parses all of `text` as a base-10 integer in [lo, hi] into *out (untouched on failure).
 * Empty text, trailing junk, overflow or a value outside the range is STRATA_EINVAL with
 * the message `needs an integer in [lo, hi], got "text"`, so a main prints
 * "prog: --flag <message>". */
int cli_parse_int(const char *text, long lo, long hi, int *out);

/* Parses comma-separated base-10 integers in [lo, hi] ("1,2,3"; a trailing comma is
 * allowed, empty text is no ids) into out [cap]: the count, or STRATA_EINVAL for a bad or
 * out-of-range value or more than cap of them (token id lists: --prompt, --stop, --grid). */
int cli_parse_ids(int32_t *out, int cap, const char *text, long lo, long hi);

/* Reads the whole file at `path` into a malloc'ed buffer with a terminating NUL (not
 * counted in *len), so text files can be parsed as strings. Missing or unopenable file:
 * STRATA_ENOTFOUND; anything but a regular file (a FIFO put in its place never blocks the
 * open), more than max_bytes or a failed read: STRATA_EIO; no memory: STRATA_ENOMEM. */
int cli_read_file_max(char **out, size_t *len, const char *path, size_t max_bytes);
/* cli_read_file_max without a size limit. */
int cli_read_file(char **out, size_t *len, const char *path);

/* Writes `data` to `path` through a temporary file and rename(), so a reader polling the
 * path never sees a partial file. STRATA_EIO on failure. */
int cli_write_file_atomic(const char *path, const void *data, size_t len);

/* A bound TCP port as a one-line text file ("5000\n"), written atomically: how a stage
 * started on port 0 tells its neighbours and tests where it listens. */
int cli_write_port_file(const char *path, int port);

/* Reads a port written by cli_write_port_file. STRATA_ENOTFOUND while the file does not
 * exist yet, STRATA_EFORMAT when it holds no port in [1, 65535]. */
int cli_read_port_file(const char *path, int *port);

/* A compute device as every binary names it: "cpu", "cuda" (device 0) or "cuda:N"
 * (0 <= N <= 999). One parser, so that every binary and the backends accept and refuse the
 * same strings. */
enum cli_device_kind { CLI_DEVICE_CPU = 0, CLI_DEVICE_CUDA = 1 };
struct cli_device {
    enum cli_device_kind kind;
    int index; /* the CUDA ordinal; 0 for the CPU */
};
/* NULL is the CPU. STRATA_EINVAL naming the string otherwise. */
int cli_parse_device(const char *text, struct cli_device *out);
/* 1 when `text` names a CUDA device (a valid one). */
int cli_device_is_cuda(const char *text);

/* CLOCK_MONOTONIC: for intervals and deadlines, never wall time. */
int64_t cli_now_ns(void);
int64_t cli_now_ms(void);
double cli_now_sec(void);

#endif
