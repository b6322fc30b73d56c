/* Private to the CUDA stage backend (backend_cuda.c: forward, KV, open; backend_cuda_weights.c:
 * the weight upload). Not for other modules: use runtime/stage/backend.h. */
#ifndef STRATA_RUNTIME_STAGE_BACKEND_CUDA_INTERNAL_H
#define STRATA_RUNTIME_STAGE_BACKEND_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "reference/layer_weights.h"
#include "reference/ops.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/stage/backend.h"

/* Attention scores: at least this many floats (queries are chunked to fit them), and
 * always room for one query's nh x max_seq scores. */
#define ATTN_SCRATCH_FLOATS ((size_t)1 << 24)
/* Gathers and combines launch one grid row per token: at most this many per launch. */
#define MAX_GRID_ROWS 65535

struct cuda_context {
    int device;
    char device_name[160];
    const struct model_config *cfg;
    struct stage_role role;

    /* Weights (device). */
    struct ops_weight embed, lm_head;
    const float *final_norm;
    struct layer_weights *layers;
    int n_layers;
    float *inv_freq; /* host [D/2] */
    void **owned;    /* device allocations */
    int n_owned, cap_owned;
    size_t weight_bytes, device_weight_bytes;
    int num_tensors;

    /* KV cache (device data, host bookkeeping). */
    float *k_cache, *v_cache;
    int *len;
    unsigned char *in_use;
    size_t slot_floats; /* per slot: layers x kv_heads x max_seq x head_dim */
    size_t head_floats; /* per (slot, layer, kv head): max_seq x head_dim */
    size_t score_floats;

    /* Device scratch for `cap_rows` rows. */
    int cap_rows, cap_logit_rows;
    float *hidden, *norm, *proj, *q, *k, *v, *attn, *ffn_gate, *ffn_up, *rope_cos, *rope_sin;
    float *router, *moe_x, *moe_y, *moe_w, *scores, *logits, *deepstack;
    int32_t *moe_row, *tokens;
    /* Host scratch. */
    float *h_cos, *h_sin, *h_router, *h_route_w, *h_moe_w;
    int *h_route_e;
    int32_t *h_moe_row;
    int *h_expert_count;
};

static inline struct cuda_context *ctx(const struct stage_backend *be) {
    return be->context;
}

/* Uploads the role's weights (the manifest's tensors) into `c` (backend_cuda_weights.c). */
int backend_cuda_load_weights(struct cuda_context *c, const struct safetensors *st);

#endif
