/* The generation result file (`--out` of strata-stage's last stage and of strata-generate):
 * a safetensors file with "tokens" I32 [n] and, when given, "logits" F32 [n, V] (row s = the
 * logits that chose token s), metadata prompt_len. Nothing else (no nonce, no time) goes in,
 * so the same generation gives the same bytes from any split or binary: tests compare the
 * files with cmp, and Python reads them with safetensors.numpy.load_file. */
#ifndef STRATA_RUNTIME_MODEL_GENERATION_FILE_H
#define STRATA_RUNTIME_MODEL_GENERATION_FILE_H

#include <stdint.h>

/* Writes atomically (a temporary file renamed over `path`). logits may be NULL. */
int generation_file_write(const char *path, int prompt_len, const int32_t *tokens, int n_tokens,
                          const float *logits, int vocab);

#endif
