/* Slot -> field of struct layer_weights; see layer_weights.h. */
#include "reference/layer_weights.h"

#include <stddef.h>

const float **layer_weights_vector(struct layer_weights *L, enum stage_tensor_slot slot) {
    switch (slot) {
    case STAGE_SLOT_INPUT_NORM: return &L->input_norm;
    case STAGE_SLOT_POST_NORM: return &L->post_norm;
    case STAGE_SLOT_Q_NORM: return &L->q_norm;
    case STAGE_SLOT_K_NORM: return &L->k_norm;
    case STAGE_SLOT_Q_BIAS: return &L->q_bias;
    case STAGE_SLOT_K_BIAS: return &L->k_bias;
    case STAGE_SLOT_V_BIAS: return &L->v_bias;
    case STAGE_SLOT_O_BIAS: return &L->o_bias;
    default: return NULL;
    }
}

struct ops_weight *layer_weights_matrix(struct layer_weights *L, const struct stage_tensor *want) {
    switch (want->slot) {
    case STAGE_SLOT_Q: return &L->q;
    case STAGE_SLOT_K: return &L->k;
    case STAGE_SLOT_V: return &L->v;
    case STAGE_SLOT_O: return &L->o;
    case STAGE_SLOT_GATE: return &L->gate;
    case STAGE_SLOT_UP: return &L->up;
    case STAGE_SLOT_DOWN: return &L->down;
    case STAGE_SLOT_ROUTER: return &L->router;
    case STAGE_SLOT_EXPERT_GATE: return &L->expert_gate[want->expert];
    case STAGE_SLOT_EXPERT_UP: return &L->expert_up[want->expert];
    case STAGE_SLOT_EXPERT_DOWN: return &L->expert_down[want->expert];
    default: return NULL;
    }
}
