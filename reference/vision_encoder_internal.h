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

/* The tables of a call's grids, on the host: pos [N, Hv] the interpolated position
 * embedding (NULL: not wanted), cos / sin [N, Dv/2] the 2-D rotary tables in merge-window
 * row order, cu_seqlens [segments + 1] (one segment per frame) (spec §6.2-§6.4). */
void vision_tables(const struct vision_encoder *e, const int64_t *grid_thw, int n_grids, float *pos,
                   float *cos_t, float *sin_t, int *cu_seqlens);

/* The vision block and merger written once (spec §6.4, §6.5), against a backend's ops: the
 * CPU's are reference/ops on the thread pool (vision_encoder.c), a device's its kernels
 * (runtime/stage/vision_cuda.c). Buffers are in the backend's memory; ops return 0 or a
 * negative STRATA_E* status. */
struct vision_ops {
    /* out [rows, dim] = LayerNorm(x) * w + b (eps VISION_LN_EPS). */
    int (*layernorm)(void *ctx, float *out, const float *x, const float *w, const float *b,
                     int rows, int dim);
    int (*matmul)(void *ctx, float *out, const float *x, const struct ops_weight *w, int rows);
    int (*add_bias)(void *ctx, float *y, const float *b, int rows, int dim);
    /* y = gelu(y + b): tanh's approximation, or erf's when erf is set. */
    int (*bias_gelu)(void *ctx, float *y, const float *b, int rows, int dim, int erf);
    /* y += b; acc += y. */
    int (*bias_residual)(void *ctx, float *y, float *acc, const float *b, int rows, int dim);
    /* RoPE on each row's `heads` heads at x + row * row_floats, row i's tables. */
    int (*rope_rows)(void *ctx, float *x, const float *cos_t, const float *sin_t, int rows,
                     int row_floats, int heads, int head_dim);
    /* out [rows, Hv] = attention within each segment of qkv [rows, 3Hv] (the backend keeps
     * the segments' bounds). */
    int (*attention)(void *ctx, float *out, const float *qkv, int segments, int rows);
};

struct vision_buffers {
    float *x, *norm, *qkv, *attn, *tmp, *mlp, *merged; /* as struct vision_encoder's */
    const float *cos_t, *sin_t;                        /* [N, Dv/2] */
};

/* x [N, Hv] = block(x). */
int vision_block_forward(const struct vision_ops *ops, void *ctx, const struct vision_encoder *e,
                         const struct vision_buffers *b, const struct vision_block *k, int N,
                         int segments);
/* out [T, O] = merger(x [N, Hv]), out in the backend's memory. */
int vision_merger_forward(const struct vision_ops *ops, void *ctx, const struct vision_encoder *e,
                          const struct vision_buffers *b, const struct vision_merger *mg,
                          float *out, int N);

#endif
