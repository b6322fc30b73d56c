/* Random-weight bf16 checkpoints for the reference benchmarks: a model.safetensors holding
 * exactly the tensors of a manifest list (runtime/model/stage_tensors.h), so a benchmark
 * writes what the loaders will ask for and nothing else. Values: 1-D tensors 1 ± 0.1 (norm
 * weights near 1), matrices uniform in ±sqrt(3 / fan_in) with fan_in = numel / shape[0]
 * (unit output variance; a Conv3d kernel counts all of C·Tp·p·p). Deterministic for a seed. */
#ifndef STRATA_REFERENCE_TOOLS_RANDOM_CHECKPOINT_H
#define STRATA_REFERENCE_TOOLS_RANDOM_CHECKPOINT_H

#include <stdint.h>

#include "runtime/model/stage_tensors.h"

/* Writes dir/model.safetensors (dir must exist). STRATA_EIO / STRATA_ENOMEM on failure. */
int random_checkpoint_write(const char *dir, const struct stage_tensor_list *list, uint64_t seed);

/* Removes dir/model.safetensors, dir/config.json and then dir itself (0, or -1 with errno). */
int random_checkpoint_remove(const char *dir);

#endif
