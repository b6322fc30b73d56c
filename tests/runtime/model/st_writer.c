/* Minimal safetensors writer used only by tests and tools (see st_writer.h). */
#include "tests/runtime/model/st_writer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

int st_write_raw(const char *path, uint64_t header_len_field, const char *header,
                 size_t header_bytes, const void *data, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot create %s", path);
    unsigned char len8[8];
    for (int i = 0; i < 8; ++i)
        len8[i] = (unsigned char)(header_len_field >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, header_bytes, f) == header_bytes;
    if (ok && data_len) ok = fwrite(data, 1, data_len, f) == data_len;
    if (fclose(f) != 0) ok = 0;
    return ok ? STRATA_OK : strata_set_error(STRATA_EIO, "cannot write %s", path);
}

int st_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot create %s", path);
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    return ok ? STRATA_OK : strata_set_error(STRATA_EIO, "cannot write %s", path);
}

/* Appends printf output to a growing string. */
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return -1;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        size_t cap2 = (*cap + (size_t)n + 1) * 2;
        char *b = realloc(*buf, cap2);
        if (!b) return -1;
        *buf = b;
        *cap = cap2;
    }
}

int st_write(const char *path, const struct st_write_tensor *tensors, int count) {
    char *header = NULL;
    size_t len = 0, cap = 0;
    unsigned char *data = NULL;
    uint64_t offset = 0;
    int rc = STRATA_ENOMEM;
    if (append(&header, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\"}")) goto done;
    for (int i = 0; i < count; ++i) {
        const struct st_write_tensor *t = &tensors[i];
        uint64_t numel = 1;
        if (append(&header, &len, &cap, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                   st_dtype_name(t->dtype)))
            goto done;
        for (int d = 0; d < t->ndim; ++d) {
            numel *= (uint64_t)t->shape[d];
            if (append(&header, &len, &cap, "%s%lld", d ? "," : "", (long long)t->shape[d]))
                goto done;
        }
        uint64_t nbytes = numel * st_dtype_size(t->dtype);
        if (append(&header, &len, &cap, "],\"data_offsets\":[%llu,%llu]}",
                   (unsigned long long)offset, (unsigned long long)(offset + nbytes)))
            goto done;
        offset += nbytes;
    }
    if (append(&header, &len, &cap, "}")) goto done;
    while (len % 8)
        if (append(&header, &len, &cap, " ")) goto done;
    data = calloc(1, offset ? offset : 1);
    if (!data) goto done;
    offset = 0;
    for (int i = 0; i < count; ++i) {
        const struct st_write_tensor *t = &tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; ++d)
            numel *= (uint64_t)t->shape[d];
        uint64_t nbytes = numel * st_dtype_size(t->dtype);
        if (t->data && nbytes) memcpy(data + offset, t->data, nbytes);
        offset += nbytes;
    }
    rc = st_write_raw(path, len, header, len, data, offset);
done:
    if (rc == STRATA_ENOMEM) strata_set_error(rc, "st_write: out of memory");
    free(header);
    free(data);
    return rc;
}
