/* Which checkpoint tensors one pipeline stage needs, and whether a checkpoint has them.
 *
 * A stage owns the decoder layers [layer_start, layer_end), plus the token embedding
 * when it is the first stage and the final norm + LM head when it is the last (shared
 * spec qwen3-architecture.md §2). The list is computed from the config alone, with the
 * checkpoint consulted only where the spec leaves a choice: whether `lm_head.weight` is
 * present (else the tied embedding serves as the head) and whether a MoE layer stores
 * per-expert or fused expert tensors. It is the one manifest of a checkpoint: the
 * reference loader places tensors by walking it (slot, layer, expert), strata-plan and
 * strata-stage check checkpoints with it, and the benchmark writers write exactly it. Checking a
 * list against a checkpoint reports every missing or mis-shaped tensor in one message, so an
 * operator fixes a bad shard in one pass instead of one name per restart. */
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

/* The one rule for a role's layers (stage_role.c): [layer_start, layer_end) is a non-empty
 * range within [0, num_layers). With a place in a ring (num_stages >= 1), also: the index
 * is within [0, num_stages), stage 0 starts at 0 and holds the embedding, the last stage
 * ends at num_layers and holds the head, and no other stage holds either (num_stages 0:
 * the range alone, for a backend that does not know its place). STRATA_ERANGE, or
 * STRATA_EINVAL for the embedding / head, with the message. */
int stage_role_check(const struct stage_role *role, int num_layers, int stage_index,
                     int num_stages);

/* How a tensor is used; lets planners group tensors without parsing names. */
enum stage_tensor_kind {
    STAGE_TENSOR_EMBED = 0,   /* embed_tokens, also when it serves as the tied LM head */
    STAGE_TENSOR_LAYER = 1,   /* one decoder layer's tensor (see .layer) */
    STAGE_TENSOR_NORM = 2,    /* final RMSNorm */
    STAGE_TENSOR_LM_HEAD = 3, /* untied lm_head.weight */
    STAGE_TENSOR_VISION = 4   /* vision tower */
};

/* Which weight a tensor is, so a loader places it by (slot, layer, expert) and never builds
 * or parses a name itself. */
enum stage_tensor_slot {
    STAGE_SLOT_EMBED = 0,       /* [V, H] */
    STAGE_SLOT_FINAL_NORM,      /* [H] */
    STAGE_SLOT_LM_HEAD,         /* [V, H] untied head */
    STAGE_SLOT_VISION,          /* any vision tower tensor (by name; the decoder ignores them) */
    STAGE_SLOT_INPUT_NORM,      /* [H] */
    STAGE_SLOT_POST_NORM,       /* [H] post_attention_layernorm */
    STAGE_SLOT_Q_NORM,          /* [D] */
    STAGE_SLOT_K_NORM,          /* [D] */
    STAGE_SLOT_Q,               /* [nh*D, H] */
    STAGE_SLOT_K,               /* [nkv*D, H] */
    STAGE_SLOT_V,               /* [nkv*D, H] */
    STAGE_SLOT_O,               /* [H, nh*D] */
    STAGE_SLOT_Q_BIAS,          /* [nh*D] (attention_bias only) */
    STAGE_SLOT_K_BIAS,          /* [nkv*D] */
    STAGE_SLOT_V_BIAS,          /* [nkv*D] */
    STAGE_SLOT_O_BIAS,          /* [H] */
    STAGE_SLOT_GATE,            /* dense MLP [F, H] */
    STAGE_SLOT_UP,              /* dense MLP [F, H] */
    STAGE_SLOT_DOWN,            /* dense MLP [H, F] */
    STAGE_SLOT_ROUTER,          /* MoE [E, H] */
    STAGE_SLOT_EXPERT_GATE,     /* per-expert [I, H] (see .expert) */
    STAGE_SLOT_EXPERT_UP,       /* per-expert [I, H] */
    STAGE_SLOT_EXPERT_DOWN,     /* per-expert [H, I] */
    STAGE_SLOT_EXPERTS_GATE_UP, /* fused, all experts: gate rows then up rows (see .layout) */
    STAGE_SLOT_EXPERTS_DOWN     /* fused, all experts (see .layout) */
};

/* How a fused expert tensor lays out each expert's matrix. */
enum stage_tensor_layout {
    STAGE_LAYOUT_PLAIN = 0, /* not fused: the shape is the matrix (rows = outputs) */
    STAGE_LAYOUT_OUT_MAJOR, /* [E, out, in]: nn.Linear rows (gate_up [E,2I,H], down [E,H,I]) */
    STAGE_LAYOUT_IN_MAJOR   /* [E, in, out]: grouped-GEMM (gate_up [E,H,2I], down [E,I,H]) */
};

/* Which vision tower weight a STAGE_SLOT_VISION entry is (spec §2.3), so the vision encoder's
 * loader places it by (part, vision_index) and never parses a name. vision_index is the block
 * for STAGE_VIS_NORM1_W..STAGE_VIS_FC2_B, the DeepStack merger j (or -1 for the main merger) for
 * STAGE_VIS_MERGER_*, and -1 otherwise. Shapes with C = in_channels, Tp, p = patch, Hv, Iv,
 * Hm = Hv * merge^2, O = out_hidden_size. */
enum stage_vision_part {
    STAGE_VIS_NONE = 0,      /* not a vision tower tensor */
    STAGE_VIS_PATCH_W,       /* [Hv, C, Tp, p, p] Conv3d */
    STAGE_VIS_PATCH_B,       /* [Hv] */
    STAGE_VIS_POS_EMBED,     /* [num_position_embeddings, Hv] */
    STAGE_VIS_NORM1_W,       /* [Hv] */
    STAGE_VIS_NORM1_B,       /* [Hv] */
    STAGE_VIS_NORM2_W,       /* [Hv] */
    STAGE_VIS_NORM2_B,       /* [Hv] */
    STAGE_VIS_QKV_W,         /* [3Hv, Hv] */
    STAGE_VIS_QKV_B,         /* [3Hv] */
    STAGE_VIS_PROJ_W,        /* [Hv, Hv] */
    STAGE_VIS_PROJ_B,        /* [Hv] */
    STAGE_VIS_FC1_W,         /* [Iv, Hv] */
    STAGE_VIS_FC1_B,         /* [Iv] */
    STAGE_VIS_FC2_W,         /* [Hv, Iv] */
    STAGE_VIS_FC2_B,         /* [Hv] */
    STAGE_VIS_MERGER_NORM_W, /* [Hv] main merger, [Hm] DeepStack merger */
    STAGE_VIS_MERGER_NORM_B, /* same */
    STAGE_VIS_MERGER_FC1_W,  /* [Hm, Hm] */
    STAGE_VIS_MERGER_FC1_B,  /* [Hm] */
    STAGE_VIS_MERGER_FC2_W,  /* [O, Hm] */
    STAGE_VIS_MERGER_FC2_B   /* [O] */
};

/* Accepted stored dtypes, a mask of (1u << enum st_dtype). */
#define STAGE_DTYPES_FLOAT ((1u << ST_BF16) | (1u << ST_F16) | (1u << ST_F32))
/* Fused experts are read in place or transposed element by element, never widened. */
#define STAGE_DTYPES_FUSED ((1u << ST_BF16) | (1u << ST_F32))

struct stage_tensor {
    char name[STAGE_TENSOR_NAME_MAX];
    enum stage_tensor_kind kind;
    enum stage_tensor_slot slot;
    int layer;  /* decoder layer for STAGE_TENSOR_LAYER, else -1 */
    int expert; /* expert for STAGE_SLOT_EXPERT_*, else -1 */
    int ndim;
    int64_t shape[STAGE_TENSOR_MAX_DIMS]; /* expected shape */
    unsigned dtypes;                      /* accepted stored dtypes (STAGE_DTYPES_*) */
    enum stage_tensor_layout layout;      /* of `shape`; PLAIN unless fused experts */
    /* 1 when dims 1 and 2 may be stored swapped, i.e. in the other fused layout: qwen3_moe
     * fused experts are stored [E, 2I, H] or [E, H, 2I] depending on the writer. */
    int swap_ok;
    enum stage_vision_part vision; /* STAGE_VIS_NONE unless slot == STAGE_SLOT_VISION */
    int vision_index;              /* see enum stage_vision_part; -1 when unused */
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

/* Checks every listed tensor exists in `st` with the expected shape and an accepted dtype.
 * On failure (STRATA_ENOTFOUND if any is missing, else STRATA_EFORMAT) the one error message
 * gives the counts and names all missing and mis-shaped tensors (each list truncated past
 * ~440 chars with "... and N more"). `source` names the checkpoint in the message. This is
 * the only missing-tensor report: loaders call it first and then rely on it. */
int stage_tensor_list_check(const struct stage_tensor_list *list, const struct safetensors *st,
                            const char *source);

/* Writes every missing or mis-shaped tensor to `out`, one per line ("missing NAME",
 * "wrong shape NAME is [..], expected [..]" or "wrong dtype NAME is F16, expected BF16 or
 * F32"), for callers that want the untruncated list.
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

/* The layout `got` is stored in, for an entry that passed the check: want->layout, or the
 * other fused layout when the stored dims 1 and 2 are swapped (swap_ok). */
enum stage_tensor_layout stage_tensor_stored_layout(const struct stage_tensor *want,
                                                    const struct st_tensor *got);

#endif
