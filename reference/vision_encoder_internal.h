/* Private layout of struct vision_encoder, shared by vision_encoder.c (forward pass) and
 * vision_encoder_load.c (tensor loading). Not part of the contract in vision_encoder.h. */
#ifndef STRATA_REFERENCE_VISION_ENCODER_INTERNAL_H
#define STRATA_REFERENCE_VISION_ENCODER_INTERNAL_H

#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "reference/vision_encoder.h"

/* One pre-norm vision block (spec §6.4). */
struct vision_block {
    const float *norm1_w, *norm1_b; /* [Hv] */
    const float *norm2_w, *norm2_b; /* [Hv] */
    struct ops_weight qkv;          /* [3Hv, Hv]: q rows, then k, then v */
    const float *qkv_b;             /* [3Hv] */
    struct ops_weight proj;         /* [Hv, Hv] */
    const float *proj_b;            /* [Hv] */
    struct ops_weight fc1;          /* [Iv, Hv] */
    const float *fc1_b;             /* [Iv] */
    struct ops_weight fc2;          /* [Hv, Iv] */
    const float *fc2_b;             /* [Hv] */
};

/* A patch merger (spec §6.5): LayerNorm, then FC1 -> GELU(erf) -> FC2 on merged rows. */
struct vision_merger {
    int postshuffle;              /* DeepStack: norm over Hm after the view, else over Hv before */
    const float *norm_w, *norm_b; /* [Hv] main, [Hm] DeepStack */
    struct ops_weight fc1;        /* [Hm, Hm] */
    const float *fc1_b;           /* [Hm] */
    struct ops_weight fc2;        /* [O, Hm] */
    const float *fc2_b;           /* [O] */
};

struct vision_encoder {
    struct vision_config cfg;
    struct thread_pool *pool;
    /* Shape letters (spec §2.3): Hv hidden, Iv MLP width, nh heads, Dv = Hv / nh, m merge,
     * Hm = Hv * m^2, O out hidden, P = C*Tp*p*p patch row, G = sqrt(num_position_embeddings). */
    int Hv, Iv, nh, Dv, m, Hm, O, P, G;
    int64_t max_patches; /* per forward call, so every [N, width] count fits an int */

    struct ops_weight patch;         /* [Hv, P] the Conv3d kernel flattened (C, Tp, py, px) */
    const float *patch_b;            /* [Hv] */
    const float *pos_embed;          /* [G*G, Hv] */
    struct vision_block *blocks;     /* [depth] */
    struct vision_merger merger;     /* main, after the last block */
    struct vision_merger *deepstack; /* [num_deepstack], tapped after deepstack_visual_indexes */
    float *inv_freq;                 /* [Dv/4] 2-D rotary frequencies */

    void **owned; /* heap copies made at load (f32 widenings) */
    int n_owned, cap_owned;
    size_t weight_bytes, extra_bytes;

    /* Activation scratch, grown on demand (N = patches, T = N / m^2 merged tokens). */
    int64_t cap_rows;
    int cap_segments, cap_longest;
    size_t scratch_bytes;
    float *x;            /* [N, Hv] residual stream */
    float *norm;         /* [N, Hv] LayerNorm output (also [T, Hm] for a DeepStack merger) */
    float *qkv;          /* [N, 3Hv] */
    float *attn;         /* [N, Hv] */
    float *tmp;          /* [N, Hv] projection outputs and the position embedding */
    float *mlp;          /* [N, Iv] */
    float *merged;       /* [T, Hm] merger FC1 output */
    float *rope_cos;     /* [N, Dv/2] */
    float *rope_sin;     /* [N, Dv/2] */
    float *attn_scratch; /* vision_attention_scratch(N, longest segment, nh, Dv, threads) */
    int *cu_seqlens;     /* [segments + 1] */
};

int vision_load_weights(struct vision_encoder *e, const struct model_config *cfg,
                        const struct safetensors *st);

#endif
