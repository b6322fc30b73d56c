/* Shared command-line helpers (see cli.h). */
#include "runtime/base/cli.h"

#include <errno.h>
#include <sys/stat.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/status.h"

int cli_parse_int(const char *text, long lo, long hi, int *out) {
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    /* lo/hi may exceed int on LP64; the value must fit both the range and an int. */
    if (errno || end == text || *end || v < lo || v > hi || v < -2147483647L - 1 || v > 2147483647L)
        return strata_set_error(STRATA_EINVAL, "needs an integer in [%ld, %ld], got \"%s\"", lo, hi,
                                text);
    *out = (int)v;
    return 0;
}

int cli_parse_ids(int32_t *out, int cap, const char *text, long lo, long hi) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < lo || v > hi || v < INT32_MIN || v > INT32_MAX || n >= cap)
            return strata_set_error(STRATA_EINVAL,
                                    "needs comma-separated integers in [%ld, %ld] (at most %d), "
                                    "got \"%s\"",
                                    lo, hi, cap, text);
        out[n++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return strata_set_error(STRATA_EINVAL, "needs comma-separated integers, got \"%s\"",
                                    text);
    }
    return n;
}

int cli_read_file_max(char **out, size_t *len, const char *path, size_t max_bytes) {
    struct stat st;
    char *buf = NULL;
    int rc = STRATA_OK;
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO put in place of a file would otherwise wait for a writer
     * forever; fstat then refuses it, as it refuses a directory or a device. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return strata_set_error(STRATA_ENOTFOUND, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = strata_set_error(STRATA_EIO, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        rc = strata_set_error(STRATA_EIO, "%s: %lld bytes, more than the %zu MiB allowed", path,
                              (long long)st.st_size, max_bytes >> 20);
        goto done;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n + 1);
    if (!buf) {
        rc = strata_set_error(STRATA_ENOMEM, "no memory for the %zu bytes of %s", n, path);
        goto done;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got != n) {
        rc = strata_set_error(STRATA_EIO, "cannot read %s: short read", path);
        goto done;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
done:
    free(buf);
    close(fd);
    return rc;
}

int cli_read_file(char **out, size_t *len, const char *path) {
    return cli_read_file_max(out, len, path, SIZE_MAX);
}

int cli_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    FILE *f;
    /* The pid keeps two writers of the same path from sharing a temp file. */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "wb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (fwrite(data, 1, len, f) != len) {
        fclose(f);
        unlink(tmp);
        return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (fclose(f) != 0) {
        unlink(tmp);
        return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return strata_set_error(STRATA_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(err));
    }
    return 0;
}

int cli_write_port_file(const char *path, int port) {
    char text[32];
    int len = snprintf(text, sizeof text, "%d\n", port);
    return cli_write_file_atomic(path, text, (size_t)len);
}

int cli_read_port_file(const char *path, int *port) {
    FILE *f = fopen(path, "r");
    int v = -1;
    if (!f) return strata_set_error(STRATA_ENOTFOUND, "cannot open %s: %s", path, strerror(errno));
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    if (v < 1 || v > 65535)
        return strata_set_error(STRATA_EFORMAT, "%s holds no port in [1, 65535]", path);
    *port = v;
    return 0;
}

int cli_parse_device(const char *text, struct cli_device *out) {
    out->kind = CLI_DEVICE_CPU;
    out->index = 0;
    if (!text || strcmp(text, "cpu") == 0) return 0;
    if (strcmp(text, "cuda") == 0) {
        out->kind = CLI_DEVICE_CUDA;
        return 0;
    }
    int digits = 0;
    if (strncmp(text, "cuda:", 5) == 0)
        for (const char *p = text + 5; *p >= '0' && *p <= '9'; p++)
            digits++;
    if (digits < 1 || digits > 3 || text[5 + digits] != '\0')
        return strata_set_error(STRATA_EINVAL, "unknown device '%s' (cpu, cuda or cuda:N)", text);
    out->kind = CLI_DEVICE_CUDA;
    out->index = atoi(text + 5);
    return 0;
}

int cli_device_is_cuda(const char *text) {
    struct cli_device d;
    return text && cli_parse_device(text, &d) == 0 && d.kind == CLI_DEVICE_CUDA;
}

int64_t cli_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cli_now_ms(void) {
    return cli_now_ns() / 1000000;
}

double cli_now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
