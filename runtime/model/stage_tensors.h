/* Which checkpoint tensors one pipeline stage needs, and whether a checkpoint has them.
 *
 * A stage owns the decoder layers [layer_start, layer_end), plus the token embedding
 * when it is the first stage and the final norm + LM head when it is the last (shared
 * spec qwen3-architecture.md §2). The list is computed from the config alone, with the
 * checkpoint consulted only where the spec leaves a choice: whether `lm_head.weight` is
 * present (else the tied embedding serves as the head) and whether a qwen3_moe layer
 * stores per-expert or fused expert tensors. Checking a list against a checkpoint
 * reports every missing or mis-shaped tensor in one message, so an operator fixes a bad
 * shard in one pass instead of one name per restart. */
#ifndef STRATA_RUNTIME_MODEL_STAGE_TENSORS_H
#define STRATA_RUNTIME_MODEL_STAGE_TENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

#define STAGE_TENSOR_NAME_MAX 160
#define STAGE_TENSOR_MAX_DIMS 5

struct stage_role {
    int layer_start; /* first owned decoder layer */
    int layer_end;   /* one past the last; layer_start == layer_end allowed (no layers) */
    int with_embed;  /* first stage: embed_tokens */
    int with_head;   /* last stage: final norm + lm_head (or the tied embedding) */
    int with_vision; /* first stage of a VL model: the vision tower (model.visual.*) */
};

/* How a tensor is used; lets loaders and planners group tensors without parsing names. */
enum stage_tensor_kind {
    STAGE_TENSOR_EMBED = 0,   /* embed_tokens, also when it serves as the tied LM head */
    STAGE_TENSOR_LAYER = 1,   /* one decoder layer's tensor (see .layer) */
    STAGE_TENSOR_NORM = 2,    /* final RMSNorm */
    STAGE_TENSOR_LM_HEAD = 3, /* untied lm_head.weight */
    STAGE_TENSOR_VISION = 4   /* vision tower */
};

struct stage_tensor {
    char name[STAGE_TENSOR_NAME_MAX];
    enum stage_tensor_kind kind;
    int layer; /* decoder layer for STAGE_TENSOR_LAYER, else -1 */
    int ndim;
    int64_t shape[STAGE_TENSOR_MAX_DIMS]; /* expected shape */
    /* 1 when only numel and shape[0] are checked: fused qwen3_moe experts may be stored
     * [E, 2I, H] or [E, H, 2I] depending on the writer. */
    int numel_only;
};

struct stage_tensor_list {
    struct stage_tensor *items; /* [count] */
    int count;
    int cap;
    int head_is_embed; /* the LM head is embed_tokens (tied, or lm_head.weight absent) */
};

/* Fills `list` with the tensors `role` needs under `cfg`. `st` may be NULL (plan from the
 * config alone: untied models then expect lm_head.weight and qwen3_moe expects per-expert
 * tensors). Fails on an out-of-range role. Free with stage_tensor_list_free. */
int stage_tensor_list_build(struct stage_tensor_list *list, const struct model_config *cfg,
                            const struct stage_role *role, const struct safetensors *st);

/* Accepts a zeroed or half-built list. */
void stage_tensor_list_free(struct stage_tensor_list *list);

/* Checks every listed tensor exists in `st` with the expected shape. On failure
 * (STRATA_ENOTFOUND if any is missing, else STRATA_EFORMAT) the one error message gives
 * the counts and names all missing and mis-shaped tensors (each list truncated past ~440 chars
 * with "... and N more"). `source` names the checkpoint in the message. */
int stage_tensor_list_check(const struct stage_tensor_list *list, const struct safetensors *st,
                            const char *source);

/* Writes every missing or mis-shaped tensor to `out`, one per line ("missing NAME" or
 * "wrong shape NAME is [..], expected [..]"), for callers that want the untruncated list.
 * Returns how many lines were written. */
int stage_tensor_list_report(FILE *out, const struct stage_tensor_list *list,
                             const struct safetensors *st);

/* Sum of the stored byte sizes of the listed tensors found in `st` (missing ones count
 * 0; check first). */
uint64_t stage_tensor_list_bytes(const struct stage_tensor_list *list,
                                 const struct safetensors *st);

/* Bytes of the listed tensors computed from the expected shapes with `dtype_bytes` per
 * element (planning without a checkpoint). */
uint64_t stage_tensor_list_bytes_estimate(const struct stage_tensor_list *list, size_t dtype_bytes);

/* Index of `name` in the list, or -1. */
int stage_tensor_list_find(const struct stage_tensor_list *list, const char *name);

#endif
