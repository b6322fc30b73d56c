/* Video prompt expansion with timestamps (see video_prompt.h). */
#include "runtime/vision/video_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/vision/video_preprocess.h"

static int push(struct tokenizer_ids *out, int32_t id) {
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 256;
        int32_t *grown = realloc(out->ids, cap * sizeof *grown);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "out of memory expanding the prompt");
        out->ids = grown;
        out->cap = cap;
    }
    out->ids[out->n++] = id;
    return 0;
}

/* The timestamp text of the first block, encoded together with the text already in *out since
 * its last added token, as HF's tokenizer sees the replaced string. */
static int first_timestamp(struct tokenizer_ids *out, const struct tokenizer *tok,
                           const char *stamp) {
    size_t start = out->n;
    while (start > 0 && !tokenizer_is_added(tok, out->ids[start - 1]))
        start--;
    char *text = NULL;
    size_t len = 0;
    int rc = tokenizer_decode(tok, out->ids + start, out->n - start, 0, &text, &len);
    if (rc) return rc;
    size_t slen = strlen(stamp);
    char *joined = malloc(len + slen + 1);
    if (!joined) {
        free(text);
        return strata_set_error(STRATA_ENOMEM, "out of memory expanding the prompt");
    }
    memcpy(joined, text, len);
    memcpy(joined + len, stamp, slen + 1);
    free(text);
    size_t keep = out->n;
    out->n = start;
    rc = tokenizer_encode(tok, joined, len + slen, out);
    if (rc) out->n = keep;
    free(joined);
    return rc;
}

static int expand_one(struct tokenizer_ids *out, const struct tokenizer *tok,
                      const struct video_prompt_ids *sp, const struct video_prompt_item *v) {
    int rc = 0;
    for (int b = 0; rc == 0 && b < v->blocks; b++) {
        char stamp[64];
        vision_video_timestamp_text(stamp, sizeof stamp, v->timestamps[b]);
        rc = b == 0 ? first_timestamp(out, tok, stamp)
                    : tokenizer_encode(tok, stamp, strlen(stamp), out);
        if (rc == 0) rc = push(out, sp->vision_start);
        for (int64_t k = 0; rc == 0 && k < v->tokens_per_block; k++)
            rc = push(out, sp->video_pad);
        if (rc == 0) rc = push(out, sp->vision_end);
    }
    return rc;
}

int video_prompt_expand(struct tokenizer_ids *out, const struct tokenizer *tok,
                        const struct video_prompt_ids *sp, const int32_t *ids, int n,
                        const struct video_prompt_item *videos, int n_videos) {
    int pads = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] != sp->video_pad) continue;
        if (i + 1 < n && ids[i + 1] == sp->video_pad)
            return strata_set_error(STRATA_EINVAL,
                                    "prompt position %d: two video tokens in a row; give ONE "
                                    "<|video_pad|> (id %d) per video, Strata expands it",
                                    i + 1, sp->video_pad);
        pads++;
    }
    if (pads != n_videos)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt has %d video tokens (id %d) for %d video(s): expected "
                                "one per video",
                                pads, sp->video_pad, n_videos);
    size_t keep = out->n;
    int rc = 0, v = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (ids[i] != sp->video_pad) {
            rc = push(out, ids[i]);
            continue;
        }
        /* <|vision_start|><|video_pad|><|vision_end|> is replaced whole (the placeholder
         * brings a start and an end per block); a bare pad is replaced alone. */
        int triple =
            i > 0 && ids[i - 1] == sp->vision_start && i + 1 < n && ids[i + 1] == sp->vision_end;
        if (triple) out->n--; /* the <|vision_start|> just pushed */
        rc = expand_one(out, tok, sp, &videos[v++]);
        if (triple) i++; /* and its <|vision_end|> */
    }
    if (rc) out->n = keep;
    return rc;
}
