/* One decoder layer's weights as the forward pass reads them (spec qwen3-architecture.md
 * §3-§4), and where each manifest slot (runtime/model/stage_tensors.h) lands in it. Shared
 * by the CPU loader (reference/model_load.c) and the CUDA backend's upload
 * (runtime/stage/backend_cuda_weights.c): the pointers are host or device memory, the
 * layout and the slot mapping are the same. */
#ifndef STRATA_REFERENCE_LAYER_WEIGHTS_H
#define STRATA_REFERENCE_LAYER_WEIGHTS_H

#include "reference/ops.h"
#include "runtime/model/stage_tensors.h"

struct layer_weights {
    int index; /* absolute layer index */
    int is_moe;
    const float *input_norm, *post_norm;            /* [H] */
    const float *q_norm, *k_norm;                   /* [D] */
    const float *q_bias, *k_bias, *v_bias, *o_bias; /* NULL unless attention_bias */
    struct ops_weight q, k, v;                      /* [nh*D, H], [nkv*D, H], [nkv*D, H] */
    struct ops_weight o;                            /* [H, nh*D] */
    struct ops_weight gate, up, down;               /* dense: [F, H], [F, H], [H, F] */
    struct ops_weight router;                       /* MoE: [E, H] */
    struct ops_weight *expert_gate;                 /* MoE: [E] of [I, H] */
    struct ops_weight *expert_up;                   /* MoE: [E] of [I, H] */
    struct ops_weight *expert_down;                 /* MoE: [E] of [H, I] */
};

/* The f32 vector a layer slot fills, or NULL when the slot is a matrix. */
const float **layer_weights_vector(struct layer_weights *L, enum stage_tensor_slot slot);

/* The matrix a layer slot fills (per-expert slots by want->expert), or NULL when the slot is
 * a vector or a fused expert block. */
struct ops_weight *layer_weights_matrix(struct layer_weights *L, const struct stage_tensor *want);

#endif
