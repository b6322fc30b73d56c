/* Read-only, mmap-backed access to safetensors checkpoints.
 *
 * Opens a single `model.safetensors`, a directory holding one, or a sharded checkpoint
 * described by `model.safetensors.index.json`. Every header is bounds-checked before use:
 * header length within the file, well-formed JSON, every data_offsets pair inside the data
 * section, equal to numel × dtype size, and no two tensors overlapping. Tensor data is
 * never copied: `data` points into the mapping. */
#ifndef STRATA_RUNTIME_MODEL_SAFETENSORS_H
#define STRATA_RUNTIME_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 8

enum st_dtype { ST_BF16 = 0, ST_F16 = 1, ST_F32 = 2, ST_I64 = 3, ST_I32 = 4, ST_U8 = 5 };

struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    int64_t numel;
    const void *data; /* little-endian payload inside the mapping */
    size_t nbytes;
};

struct safetensors; /* opaque: one or more mapped files and their tensor tables */

/* Bytes per element of a dtype; "BF16" <-> ST_BF16 name conversion. */
size_t st_dtype_size(enum st_dtype dtype);
const char *st_dtype_name(enum st_dtype dtype);

/* Opens a file or directory (see above). On failure *out is NULL. */
int safetensors_open(struct safetensors **out, const char *path);
void safetensors_close(struct safetensors *st);

/* NULL when no tensor has that name. */
const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
int safetensors_count(const struct safetensors *st);
const struct st_tensor *safetensors_at(const struct safetensors *st, int index);

/* Validates one in-memory safetensors file image (header + data) without keeping it; used
 * by the libFuzzer target and by safetensors_open. Returns 0 when the whole file is
 * well-formed. */
int safetensors_validate(const uint8_t *file, size_t len, const char *source_name);

/* Widens a tensor to f32 (BF16, F16, F32 only): out must hold numel floats. */
int st_tensor_to_f32(float *out, const struct st_tensor *t);

#endif
