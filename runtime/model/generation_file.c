/* The generation result file; see generation_file.h. */
#include "runtime/model/generation_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "runtime/model/safetensors_write.h"

int generation_file_write(const char *path, int prompt_len, const int32_t *tokens, int n_tokens,
                          const float *logits, int vocab) {
    const struct st_write_entry entries[2] = {
        {.name = "tokens", .dtype = ST_I32, .ndim = 1, .shape = {n_tokens}},
        {.name = "logits", .dtype = ST_F32, .ndim = 2, .shape = {n_tokens, vocab}},
    };
    const size_t tokens_bytes = sizeof(int32_t) * (size_t)n_tokens;
    const size_t logits_bytes = logits ? sizeof(float) * (size_t)n_tokens * (size_t)vocab : 0;
    char prompt[16], tmp[4096];
    snprintf(prompt, sizeof prompt, "%d", prompt_len);
    const char *const metadata[2] = {"prompt_len", prompt};
    /* written beside the target and renamed over it: a reader never sees half a file */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (safetensors_write_header(f, entries, logits ? 2 : 1, metadata, 1, NULL) < 0 ||
        (tokens_bytes && fwrite(tokens, 1, tokens_bytes, f) != tokens_bytes) ||
        (logits_bytes && fwrite(logits, 1, logits_bytes, f) != logits_bytes)) {
        fclose(f);
        unlink(tmp);
        return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return strata_set_error(STRATA_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}
