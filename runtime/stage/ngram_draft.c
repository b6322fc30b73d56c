/* ngram_draft; see ngram_draft.h. */
#include "runtime/stage/ngram_draft.h"

#include <string.h>

int ngram_draft(const int32_t *seq, int n, int k, int32_t *out) {
    if (!seq || n < 2 || k < 1) return 0;
    for (int m = n - 1 < NGRAM_DRAFT_MAX_N ? n - 1 : NGRAM_DRAFT_MAX_N; m >= 1; --m) {
        const int32_t *suffix = seq + n - m;
        /* The latest start i < n - m whose m tokens equal the suffix: what followed it last
         * time is the likeliest continuation now. */
        for (int i = n - m - 1; i >= 0; --i) {
            if (seq[i + m - 1] != suffix[m - 1] || memcmp(seq + i, suffix, sizeof *seq * m))
                continue;
            /* What followed it, and past the sequence's end the drafts themselves: the
             * continuation of a loop (period n - i - m) is the loop again, as an LZ77 copy
             * that overlaps its own output. */
            const int period = n - (i + m);
            for (int j = 0; j < k; j++)
                out[j] = j < period ? seq[i + m + j] : out[j - period];
            return k;
        }
    }
    return 0;
}
