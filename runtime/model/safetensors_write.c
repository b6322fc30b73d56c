/* The safetensors writer (see safetensors_write.h). */
#include "runtime/model/safetensors_write.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/base/strbuf.h"

uint64_t st_write_entry_bytes(const struct st_write_entry *e) {
    uint64_t n = st_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; ++d)
        n *= (uint64_t)e->shape[d];
    return n;
}

/* A string the header can hold as it is (no escapes needed). */
static int plain(const char *s) {
    if (!s) return 0;
    for (; *s; ++s)
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) return 0;
    return 1;
}

int safetensors_write_header(FILE *f, const struct st_write_entry *entries, int count,
                             const char *const *metadata, int n_metadata, uint64_t *data_bytes) {
    struct strbuf t = {0};
    uint64_t offset = 0;
    for (int i = 0; i < 2 * n_metadata; ++i)
        if (!plain(metadata[i]))
            return strata_set_error(STRATA_EINVAL, "safetensors: metadata string %d is not plain",
                                    i);
    strbuf_puts(&t, "{");
    for (int i = 0; i < n_metadata; ++i)
        strbuf_printf(&t, "%s\"%s\":\"%s\"", i ? "," : "\"__metadata__\":{", metadata[2 * i],
                      metadata[2 * i + 1]);
    if (n_metadata > 0) strbuf_puts(&t, "}");
    for (int i = 0; i < count; ++i) {
        const struct st_write_entry *e = &entries[i];
        if (!plain(e->name) || !*e->name || e->ndim < 0 || e->ndim > SAFETENSORS_MAX_DIMS) {
            strbuf_free(&t);
            return strata_set_error(STRATA_EINVAL, "safetensors: tensor %d: name or rank invalid",
                                    i);
        }
        strbuf_printf(&t, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i || n_metadata > 0 ? "," : "",
                      e->name, st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; ++d) {
            if (e->shape[d] < 0) {
                strbuf_free(&t);
                return strata_set_error(STRATA_EINVAL, "safetensors: %s: dimension %d is %lld",
                                        e->name, d, (long long)e->shape[d]);
            }
            strbuf_printf(&t, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        }
        const uint64_t bytes = st_write_entry_bytes(e);
        strbuf_printf(&t, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                      (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    strbuf_puts(&t, "}");
    while (!t.failed && t.len % 8) /* the data begins 8-aligned */
        strbuf_puts(&t, " ");
    if (t.failed) {
        strbuf_free(&t);
        return strata_set_error(STRATA_ENOMEM, "safetensors: no memory for the header");
    }
    uint8_t prefix[8];
    for (int i = 0; i < 8; ++i)
        prefix[i] = (uint8_t)((uint64_t)t.len >> (8 * i));
    const int ok = fwrite(prefix, 1, 8, f) == 8 && fwrite(t.s, 1, t.len, f) == t.len;
    strbuf_free(&t);
    if (!ok) return strata_set_error(STRATA_EIO, "safetensors: cannot write the header");
    if (data_bytes) *data_bytes = offset;
    return 0;
}
