/* Tiny complete checkpoints for tests (see tiny_checkpoint.h). */
#include "tests/runtime/model/tiny_checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/stage_tensors.h"
#include "tests/runtime/model/st_writer.h"

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* float -> bf16 with round-to-nearest-even (inputs here are finite). */
static uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* float -> IEEE half for the small normal values written here (|f| in [2^-14, 2]). */
static uint16_t float_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t sign = (bits >> 16) & 0x8000;
    int32_t exp = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
    uint32_t mant = bits & 0x7fffff;
    if (exp <= 0) return (uint16_t)sign; /* flush tiny values to zero */
    uint32_t half = sign | (uint32_t)exp << 10 | mant >> 13;
    if ((mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (half & 1))) ++half;
    return (uint16_t)half;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int tiny_checkpoint_write(const char *dir, const char *config_json,
                          const struct tiny_checkpoint_options *opt) {
    char path[4096];
    struct model_config *cfg = calloc(1, sizeof *cfg);
    struct stage_tensor_list list = {0};
    struct st_write_tensor *out = NULL;
    int count = 0, rc;
    if (!cfg) return strata_set_error(STRATA_ENOMEM, "tiny checkpoint: out of memory");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        rc = strata_set_error(STRATA_EIO, "mkdir %s: %s", dir, strerror(errno));
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = st_write_text(path, config_json))) goto done;
    if ((rc = model_config_parse(cfg, config_json, strlen(config_json), path))) goto done;
    struct stage_role all = {0, cfg->num_layers, 1, 1, opt->with_vision};
    if ((rc = stage_tensor_list_build(&list, cfg, &all, NULL))) goto done;
    out = calloc((size_t)list.count, sizeof *out);
    if (!out) {
        rc = strata_set_error(STRATA_ENOMEM, "tiny checkpoint: out of memory");
        goto done;
    }
    uint64_t rng = opt->seed;
    size_t elem = st_dtype_size(opt->dtype);
    for (int i = 0; i < list.count; ++i) {
        const struct stage_tensor *t = &list.items[i];
        if (opt->omit_lm_head && strcmp(t->name, "lm_head.weight") == 0) continue;
        if (opt->omit_suffix && ends_with(t->name, opt->omit_suffix)) continue;
        struct st_write_tensor *w = &out[count++];
        w->name = t->name;
        w->dtype = opt->dtype;
        w->ndim = t->ndim;
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; ++d) {
            w->shape[d] = t->shape[d];
            numel *= (uint64_t)t->shape[d];
        }
        unsigned char *data = malloc(numel > 0 ? numel * elem : 1);
        if (!data) {
            rc = strata_set_error(STRATA_ENOMEM, "tiny checkpoint: out of memory");
            goto done;
        }
        w->data = data;
        int is_norm = ends_with(t->name, "norm.weight") || ends_with(t->name, "layernorm.weight");
        for (uint64_t k = 0; k < numel; ++k) {
            /* uniform in [-0.25, 0.25), or 1 ± 0.125 for norm weights */
            float u = (float)(splitmix64(&rng) >> 40) / 16777216.0f - 0.5f;
            float v = is_norm ? 1.0f + 0.25f * u : 0.5f * u;
            if (opt->dtype == ST_F32) {
                memcpy(data + 4 * k, &v, 4);
            } else {
                uint16_t h = opt->dtype == ST_BF16 ? float_to_bf16(v) : float_to_f16(v);
                data[2 * k] = (unsigned char)h;
                data[2 * k + 1] = (unsigned char)(h >> 8);
            }
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = st_write(path, out, count);
done:
    for (int i = 0; out && i < count; ++i)
        free((void *)out[i].data);
    free(out);
    stage_tensor_list_free(&list);
    free(cfg);
    return rc;
}
