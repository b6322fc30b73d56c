/* Writing safetensors files, the format safetensors.h reads: the header, then the caller's
 * tensor bytes in the order the header lists them. One writer for every file Strata makes:
 * the benchmark checkpoints, a draft model's weights, the generation result file, and the
 * tests' checkpoints. */
#ifndef STRATA_RUNTIME_MODEL_SAFETENSORS_WRITE_H
#define STRATA_RUNTIME_MODEL_SAFETENSORS_WRITE_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/model/safetensors.h"

struct st_write_entry {
    const char *name; /* no quote, backslash or control character */
    enum st_dtype dtype;
    int ndim; /* 0 .. SAFETENSORS_MAX_DIMS */
    int64_t shape[SAFETENSORS_MAX_DIMS];
};

/* Bytes of one entry's data (numel x its dtype's size). */
uint64_t st_write_entry_bytes(const struct st_write_entry *e);

/* Writes to f the header's length (8 bytes, little-endian) and the JSON header of entries
 * [count] laid out back to back in their order, with "__metadata__" holding the string pairs
 * metadata [2 * n_metadata] (key, value, ...; none when n_metadata is 0), padded with spaces so
 * that the data begins 8-aligned. The caller then writes each entry's bytes in order;
 * *data_bytes (may be NULL) is their total. STRATA_EINVAL (a name or string the header cannot
 * hold, a rank out of range, a negative dimension), STRATA_ENOMEM, STRATA_EIO. */
int safetensors_write_header(FILE *f, const struct st_write_entry *entries, int count,
                             const char *const *metadata, int n_metadata, uint64_t *data_bytes);

#endif
