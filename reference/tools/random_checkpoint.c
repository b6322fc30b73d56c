/* Random bf16 checkpoints for benchmarks (see random_checkpoint.h). The header is written
 * first, then each tensor's values streamed in 16 MiB chunks, so a model of any size needs
 * only a small buffer. */
#include "reference/tools/random_checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "runtime/model/safetensors_write.h"

static size_t tensor_bytes(const struct stage_tensor *t) {
    size_t n = 2; /* bf16 */
    for (int d = 0; d < t->ndim; ++d)
        n *= (size_t)t->shape[d];
    return n;
}

static void fill_bf16(uint16_t *out, size_t n, const struct stage_tensor *t, uint64_t *rng) {
    float fan_in = t->ndim == 1 ? 1.0f : (float)(tensor_bytes(t) / 2 / (size_t)t->shape[0]);
    float scale = t->ndim == 1 ? 0.1f : 1.7320508f / sqrtf(fan_in);
    float base = t->ndim == 1 ? 1.0f : 0.0f;
    for (size_t i = 0; i < n; ++i) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((*rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
        out[i] = f32_to_bf16(base + scale * u);
    }
}

int random_checkpoint_write(const char *dir, const struct stage_tensor_list *list, uint64_t seed) {
    struct st_write_entry *entries = calloc((size_t)list->count + 1, sizeof *entries);
    uint16_t *buf = malloc((size_t)1 << 24);
    int rc = STRATA_OK;
    if (!entries || !buf) {
        rc = strata_set_error(STRATA_ENOMEM, "random checkpoint: out of memory");
        goto done;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        rc = strata_set_error(STRATA_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    for (int i = 0; i < list->count; ++i) {
        const struct stage_tensor *t = &list->items[i];
        entries[i] = (struct st_write_entry){.name = t->name, .dtype = ST_BF16, .ndim = t->ndim};
        memcpy(entries[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    static const char *const format[2] = {"format", "pt"};
    uint64_t rng = seed;
    if ((rc = safetensors_write_header(f, entries, list->count, format, 1, NULL)) < 0) {
        fclose(f);
        goto done;
    }
    int ok = 1;
    for (int i = 0; ok && i < list->count; ++i) {
        size_t left = tensor_bytes(&list->items[i]) / 2;
        while (ok && left) {
            size_t chunk = left < ((size_t)1 << 23) ? left : ((size_t)1 << 23);
            fill_bf16(buf, chunk, &list->items[i], &rng);
            ok = fwrite(buf, 2, chunk, f) == chunk;
            left -= chunk;
        }
    }
    if (fclose(f) || !ok) rc = strata_set_error(STRATA_EIO, "%s: write failed (disk full?)", path);
done:
    free(entries);
    free(buf);
    return rc;
}

int random_checkpoint_remove(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    return rmdir(dir);
}
