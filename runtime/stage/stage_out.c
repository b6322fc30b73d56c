/* --out: a finished request's generated ids and last-stage logits, in the generation result
 * file format (runtime/model/generation_file.h). */
#include "runtime/model/generation_file.h"
#include "runtime/stage/stage_server.h"

int stage_write_out(const char *path, const struct stage_result *result) {
    return generation_file_write(path, result->prompt_len, result->tokens, result->n_tokens,
                                 result->logits, result->vocab);
}
