/* The generation result file; see generation_file.h. */
#include "runtime/model/generation_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/status.h"

int generation_file_write(const char *path, int prompt_len, const int32_t *tokens, int n_tokens,
                          const float *logits, int vocab) {
    char header[1024], tmp[4096];
    size_t tokens_bytes = sizeof(int32_t) * (size_t)n_tokens;
    size_t logits_bytes = logits ? sizeof(float) * (size_t)n_tokens * (size_t)vocab : 0;
    int len;
    uint64_t header_len;
    uint8_t prefix[8];
    FILE *f;
    if (logits)
        len =
            snprintf(header, sizeof header,
                     "{\"__metadata__\":{\"prompt_len\":\"%d\"},"
                     "\"tokens\":{\"dtype\":\"I32\",\"shape\":[%d],\"data_offsets\":[0,%zu]},"
                     "\"logits\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
                     prompt_len, n_tokens, tokens_bytes, n_tokens, vocab, tokens_bytes,
                     tokens_bytes + logits_bytes);
    else
        len = snprintf(header, sizeof header,
                       "{\"__metadata__\":{\"prompt_len\":\"%d\"},"
                       "\"tokens\":{\"dtype\":\"I32\",\"shape\":[%d],\"data_offsets\":[0,%zu]}}",
                       prompt_len, n_tokens, tokens_bytes);
    if (len < 0 || (size_t)len + 8 >= sizeof header)
        return strata_set_error(STRATA_EINVAL, "--out header too long");
    while ((len + 8) % 8 != 0) /* data starts 8-aligned: pad the header with spaces */
        header[len++] = ' ';
    header_len = (uint64_t)len;
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)(header_len >> (8 * i));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "wb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (fwrite(prefix, 1, 8, f) != 8 || fwrite(header, 1, (size_t)len, f) != (size_t)len ||
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
