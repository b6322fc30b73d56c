/* The teacher-forced golden run shared by golden_test (stored weights against transformers'
 * logits) and q8_golden_test (q8 weights, the measured error): one owner for how a golden
 * case is replayed, so the two tests compare the same thing. */
#ifndef STRATA_TESTS_REFERENCE_GOLDEN_RUN_H
#define STRATA_TESTS_REFERENCE_GOLDEN_RUN_H

#include "reference/model.h"
#include "tests/reference/golden_case.h"

#define GOLDEN_RUN_MAX_STAGES 8

/* Runs the golden token stream through stages [bounds[i], bounds[i+1]) (embed on the first,
 * head on the last) with the weights as `dtype`, and returns logits [n_steps, V] (the
 * caller frees them); ids are teacher-forced from the golden (prompt, then each recorded
 * id), so one early divergence does not cascade. Qwen3-VL cases replay HF's prefill without
 * a vision tower: the image pad embeddings are replaced by the recorded merger outputs, the
 * prompt uses HF's M-RoPE position ids, and the recorded DeepStack features are added after
 * the first layers; decode positions are cache index + rope_delta. Any failure fails the
 * running cmocka test. */
float *golden_run(const struct golden_case *gc, const int *bounds, int n_stages, int threads,
                  enum reference_weights_dtype dtype);
/* The same with the KV cache stored as kv_dtype (OPS_F32, OPS_BF16, OPS_F16). */
float *golden_run_kv(const struct golden_case *gc, const int *bounds, int n_stages, int threads,
                     enum reference_weights_dtype dtype, enum ops_dtype kv_dtype);

#endif
