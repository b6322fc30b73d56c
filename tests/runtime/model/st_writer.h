/* Minimal safetensors writer for tests and the tiny-checkpoint generator: lets tests
 * build valid and deliberately corrupted files at run time instead of committing blobs. */
#ifndef STRATA_TESTS_RUNTIME_ST_WRITER_H
#define STRATA_TESTS_RUNTIME_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/safetensors.h"

struct st_write_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data; /* numel × dtype size bytes; NULL writes zeros */
};

/* Writes a well-formed file: tensors packed in order, header padded with spaces to a
 * multiple of 8. Returns 0 or a negative STRATA_E* code. */
int st_write(const char *path, const struct st_write_tensor *tensors, int count);

/* Writes exactly: 8-byte little-endian `header_len_field`, `header` (header_bytes), data. */
int st_write_raw(const char *path, uint64_t header_len_field, const char *header,
                 size_t header_bytes, const void *data, size_t data_len);

/* Writes `text` to `path`. */
int st_write_text(const char *path, const char *text);

#endif
