/* Writes small but complete checkpoints (config.json + model.safetensors) for tests:
 * every tensor a model of that config needs (runtime/stage_tensors), filled with
 * deterministic pseudo-random values, so tests never depend on downloaded weights. */
#ifndef STRATA_TESTS_RUNTIME_TINY_CHECKPOINT_H
#define STRATA_TESTS_RUNTIME_TINY_CHECKPOINT_H

#include <stdint.h>

#include "runtime/model/safetensors.h"

struct tiny_checkpoint_options {
    enum st_dtype dtype;     /* ST_BF16, ST_F16 or ST_F32 */
    uint64_t seed;           /* value stream */
    int with_vision;         /* write the vision tower of a VL config */
    int omit_lm_head;        /* leave lm_head.weight out even if the config is untied */
    const char *omit_suffix; /* leave out every tensor whose name ends with this (or NULL) */
};

/* Creates `dir` if needed and writes dir/config.json (= config_json) and
 * dir/model.safetensors. */
int tiny_checkpoint_write(const char *dir, const char *config_json,
                          const struct tiny_checkpoint_options *opt);

#endif
