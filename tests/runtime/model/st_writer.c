/* Minimal safetensors writer used only by tests and tools (see st_writer.h). */
#include "tests/runtime/model/st_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/safetensors_write.h"

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

int st_write(const char *path, const struct st_write_tensor *tensors, int count) {
    struct st_write_entry *entries = calloc((size_t)count + 1, sizeof *entries);
    static const char *const format[2] = {"format", "pt"};
    if (!entries) return strata_set_error(STRATA_ENOMEM, "st_write: out of memory");
    for (int i = 0; i < count; ++i)
        entries[i] = (struct st_write_entry){
            .name = tensors[i].name, .dtype = tensors[i].dtype, .ndim = tensors[i].ndim};
    for (int i = 0; i < count; ++i)
        memcpy(entries[i].shape, tensors[i].shape, sizeof(int64_t) * (size_t)tensors[i].ndim);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(entries);
        return strata_set_error(STRATA_EIO, "cannot create %s", path);
    }
    int rc = safetensors_write_header(f, entries, count, format, 1, NULL);
    static const unsigned char zeros[4096];
    for (int i = 0; rc == 0 && i < count; ++i) {
        uint64_t left = st_write_entry_bytes(&entries[i]);
        const unsigned char *data = tensors[i].data;
        while (rc == 0 && left) { /* NULL data: zeros */
            const size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
            if (fwrite(data ? data : zeros, 1, n, f) != n)
                rc = strata_set_error(STRATA_EIO, "cannot write %s", path);
            if (data) data += n;
            left -= n;
        }
    }
    if (fclose(f) != 0 && rc == 0) rc = strata_set_error(STRATA_EIO, "cannot write %s", path);
    free(entries);
    return rc;
}
