/* The vision tower on a CUDA device (contract in vision_cuda.h): reference/vision_encoder.c's
 * forward pass with the kernels/ twins, read top to bottom in the same order. Shape letters
 * are vision_encoder_internal.h's; N = patches, T = merged tokens of the call. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/ops_vision.h"
#include "kernels/rope_apply.h"
#include "kernels/vec_add.h"
#include "reference/ops_vision.h"
#include "reference/vision_encoder_internal.h"
#include "runtime/base/status.h"
#include "runtime/stage/vision_cuda.h"

#define VISION_LN_EPS 1e-6f /* every vision LayerNorm (spec §6.4, §6.5), as the reference */

struct vision_cuda {
    const struct vision_encoder *enc; /* host: shapes, config, pos_embed, inv_freq */
    struct vision_block *blocks;      /* [depth], device weights */
    struct vision_merger merger, *deepstack;
    struct ops_weight patch;
    const float *patch_b;
    void **owned; /* device allocations */
    int n_owned, cap_owned, device;
    size_t bytes;
};

/* A device copy of `bytes` at src, owned by g (NULL src stays NULL). */
static int upload(struct vision_cuda *g, const void **dst, const void *src, size_t bytes) {
    *dst = NULL;
    if (!src) return 0;
    if (g->n_owned == g->cap_owned) {
        int cap = g->cap_owned ? 2 * g->cap_owned : 64;
        void **p = realloc(g->owned, (size_t)cap * sizeof *p);
        if (!p) return strata_set_error(STRATA_ENOMEM, "vision cuda: out of host memory");
        g->owned = p;
        g->cap_owned = cap;
    }
    void *d = NULL;
    int rc = cuda_malloc(&d, bytes);
    if (rc) return rc;
    g->owned[g->n_owned++] = d;
    g->bytes += bytes;
    if ((rc = cuda_memcpy_to_device(d, src, bytes))) return rc;
    *dst = d;
    return 0;
}

static int upload_weight(struct vision_cuda *g, struct ops_weight *dst,
                         const struct ops_weight *src) {
    *dst = *src;
    if (src->dtype != OPS_F32 && src->dtype != OPS_BF16)
        return strata_set_error(STRATA_EINVAL, "vision cuda: weight dtype %d (f32 / bf16 only)",
                                (int)src->dtype);
    size_t bytes = (size_t)src->rows * (size_t)src->cols * (src->dtype == OPS_BF16 ? 2 : 4);
    return upload(g, &dst->data, src->data, bytes);
}

static int upload_vec(struct vision_cuda *g, const float **dst, const float *src, int n) {
    return upload(g, (const void **)dst, src, (size_t)n * sizeof(float));
}

static int upload_merger(struct vision_cuda *g, struct vision_merger *d,
                         const struct vision_merger *s) {
    const struct vision_encoder *e = g->enc;
    int rc;
    *d = *s;
    if ((rc = upload_vec(g, &d->norm_w, s->norm_w, s->postshuffle ? e->Hm : e->Hv)) ||
        (rc = upload_vec(g, &d->norm_b, s->norm_b, s->postshuffle ? e->Hm : e->Hv)) ||
        (rc = upload_weight(g, &d->fc1, &s->fc1)) ||
        (rc = upload_vec(g, &d->fc1_b, s->fc1_b, e->Hm)) ||
        (rc = upload_weight(g, &d->fc2, &s->fc2)))
        return rc;
    return upload_vec(g, &d->fc2_b, s->fc2_b, e->O);
}

static int upload_block(struct vision_cuda *g, struct vision_block *d,
                        const struct vision_block *s) {
    const int Hv = g->enc->Hv, Iv = g->enc->Iv;
    int rc;
    if ((rc = upload_vec(g, &d->norm1_w, s->norm1_w, Hv)) ||
        (rc = upload_vec(g, &d->norm1_b, s->norm1_b, Hv)) ||
        (rc = upload_vec(g, &d->norm2_w, s->norm2_w, Hv)) ||
        (rc = upload_vec(g, &d->norm2_b, s->norm2_b, Hv)) ||
        (rc = upload_weight(g, &d->qkv, &s->qkv)) ||
        (rc = upload_vec(g, &d->qkv_b, s->qkv_b, 3 * Hv)) ||
        (rc = upload_weight(g, &d->proj, &s->proj)) ||
        (rc = upload_vec(g, &d->proj_b, s->proj_b, Hv)) ||
        (rc = upload_weight(g, &d->fc1, &s->fc1)) ||
        (rc = upload_vec(g, &d->fc1_b, s->fc1_b, Iv)) || (rc = upload_weight(g, &d->fc2, &s->fc2)))
        return rc;
    return upload_vec(g, &d->fc2_b, s->fc2_b, Hv);
}

int vision_cuda_open(struct vision_cuda **out, const struct vision_encoder *enc, int device) {
    if (!out || !enc) return strata_set_error(STRATA_EINVAL, "vision_cuda_open: null argument");
    *out = NULL;
    char why[256];
    if (device < 0 || !cuda_device_available(why, sizeof why))
        return strata_set_error(STRATA_EDEVICE, "device 'cuda:%d' is not available: %s", device,
                                device < 0 ? "negative index" : why);
    struct vision_cuda *g = calloc(1, sizeof *g);
    if (!g) return strata_set_error(STRATA_ENOMEM, "vision cuda: out of host memory");
    g->enc = enc;
    g->device = device;
    const int depth = enc->cfg.depth, nds = enc->cfg.num_deepstack;
    g->blocks = calloc((size_t)(depth > 0 ? depth : 1), sizeof *g->blocks);
    g->deepstack = calloc((size_t)(nds > 0 ? nds : 1), sizeof *g->deepstack);
    int rc = cuda_set_device(device);
    if (!rc && (!g->blocks || !g->deepstack))
        rc = strata_set_error(STRATA_ENOMEM, "vision cuda: out of host memory");
    if (!rc) rc = upload_weight(g, &g->patch, &enc->patch);
    if (!rc) rc = upload_vec(g, &g->patch_b, enc->patch_b, enc->Hv);
    for (int i = 0; i < depth && !rc; ++i)
        rc = upload_block(g, &g->blocks[i], &enc->blocks[i]);
    if (!rc) rc = upload_merger(g, &g->merger, &enc->merger);
    for (int j = 0; j < nds && !rc; ++j)
        rc = upload_merger(g, &g->deepstack[j], &enc->deepstack[j]);
    if (rc) {
        vision_cuda_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void vision_cuda_free(struct vision_cuda *g) {
    if (!g) return;
    for (int i = 0; i < g->n_owned; ++i)
        cuda_free(g->owned[i]);
    free(g->owned);
    free(g->blocks);
    free(g->deepstack);
    free(g);
}

size_t vision_cuda_weight_bytes(const struct vision_cuda *g) {
    return g ? g->bytes : 0;
}

/* One forward's buffers: device activations and the host tables sent up. */
struct vbufs {
    float *x, *norm, *qkv, *attn, *tmp, *mlp, *merged, *cos, *sin, *scores, *pixels, *out;
    float *h_pos, *h_cos, *h_sin; /* host [N, Hv], [N, Dv/2] x 2 */
    int *cu;                      /* host [segments + 1] */
    int nh, dv;                   /* the encoder's heads and head width (attention) */
};

static void vbufs_free(struct vbufs *b) {
    float **dev[] = {&b->x,      &b->norm, &b->qkv, &b->attn,   &b->tmp,    &b->mlp,
                     &b->merged, &b->cos,  &b->sin, &b->scores, &b->pixels, &b->out};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i)
        cuda_free(*dev[i]);
    free(b->h_pos);
    free(b->h_cos);
    free(b->h_sin);
    free(b->cu);
    memset(b, 0, sizeof *b);
}

static int vbufs_alloc(struct vbufs *b, const struct vision_encoder *e, size_t N, size_t T,
                       int segments, int longest) {
    const size_t hv = (size_t)e->Hv, half = (size_t)e->Dv / 2;
    struct {
        float **p;
        size_t n;
    } dev[] = {
        {&b->x, N * hv},
        {&b->norm, N * hv},
        {&b->qkv, 3 * N * hv},
        {&b->attn, N * hv},
        {&b->tmp, N * hv},
        {&b->mlp, N * (size_t)e->Iv},
        {&b->merged, T * (size_t)e->Hm},
        {&b->cos, N * half},
        {&b->sin, N * half},
        {&b->scores, cuda_vision_attention_scratch(longest, e->nh)},
        {&b->pixels, N * (size_t)e->P},
        {&b->out, T * (size_t)e->O},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0] && !rc; ++i)
        rc = cuda_malloc((void **)dev[i].p, (dev[i].n ? dev[i].n : 1) * sizeof(float));
    b->h_pos = malloc(N * hv * sizeof(float));
    b->h_cos = malloc(N * half * sizeof(float));
    b->h_sin = malloc(N * half * sizeof(float));
    b->cu = malloc(((size_t)segments + 1) * sizeof(int));
    if (!rc && (!b->h_pos || !b->h_cos || !b->h_sin || !b->cu))
        rc = strata_set_error(STRATA_ENOMEM, "vision cuda: out of host memory for %zu patches", N);
    return rc;
}

/* Host tables of the embed step (reference embed()): position embedding [N, Hv], rotary
 * tables [N, Dv/2], cu_seqlens (one segment per frame). */
/* ---- the device's vision ops (reference/vision_encoder_internal.h): the kernels ---- */

static int op_layernorm(void *ctx, float *out, const float *x, const float *w, const float *b,
                        int n, int dim) {
    (void)ctx;
    return cuda_layernorm(out, x, w, b, VISION_LN_EPS, n, dim, NULL);
}

static int op_matmul(void *ctx, float *out, const float *x, const struct ops_weight *w, int n) {
    (void)ctx;
    return cuda_matmul(out, x, w, n, NULL);
}

static int op_add_bias(void *ctx, float *y, const float *b, int n, int dim) {
    (void)ctx;
    return cuda_add_bias(y, b, n, dim, NULL);
}

static int op_bias_gelu(void *ctx, float *y, const float *b, int n, int dim, int erf) {
    (void)ctx;
    int rc = cuda_add_bias(y, b, n, dim, NULL);
    if (rc) return rc;
    return erf ? cuda_gelu_erf(y, y, n * dim, NULL) : cuda_gelu_tanh(y, y, n * dim, NULL);
}

static int op_bias_residual(void *ctx, float *y, float *acc, const float *b, int n, int dim) {
    (void)ctx;
    int rc = cuda_add_bias(y, b, n, dim, NULL);
    return rc ? rc : cuda_vec_add(acc, y, n * dim, NULL);
}

static int op_rope_rows(void *ctx, float *x, const float *cos_t, const float *sin_t, int n,
                        int row_floats, int heads, int head_dim) {
    (void)ctx;
    return cuda_rope_apply_rows(x, cos_t, sin_t, n, row_floats, heads, head_dim, NULL);
}

/* ctx: the call's buffers (the segments' bounds on the host, the scores' scratch). */
static int op_attention(void *ctx, float *out, const float *qkv, int segments, int n) {
    struct vbufs *b = ctx;
    return cuda_vision_attention(out, qkv, b->scores, b->cu, segments, n, b->nh, b->dv, NULL);
}

static const struct vision_ops cuda_vision_ops = {.layernorm = op_layernorm,
                                                  .matmul = op_matmul,
                                                  .add_bias = op_add_bias,
                                                  .bias_gelu = op_bias_gelu,
                                                  .bias_residual = op_bias_residual,
                                                  .rope_rows = op_rope_rows,
                                                  .attention = op_attention};

/* host out [T, O] = merger(x [N, Hv]): on the device into b->out, then copied back. */
static int run_merger(const struct vision_encoder *e, const struct vision_merger *mg,
                      struct vbufs *b, const struct vision_buffers *vb, float *out, int N) {
    const int T = N / (e->m * e->m);
    int rc = vision_merger_forward(&cuda_vision_ops, b, e, vb, mg, b->out, N);
    if (!rc) rc = cuda_synchronize();
    return rc ? rc : cuda_memcpy_to_host(out, b->out, (size_t)T * (size_t)e->O * sizeof(float));
}

int vision_cuda_forward(struct vision_cuda *g, float *embeds, float *deepstack,
                        const float *pixel_values, int64_t n_patches, const int64_t *grid_thw,
                        int n_grids) {
    if (!g || !embeds || !pixel_values || (!deepstack && g->enc->cfg.num_deepstack > 0))
        return strata_set_error(STRATA_EINVAL, "vision_cuda_forward: null argument");
    const struct vision_encoder *e = g->enc;
    int64_t want = 0, tokens = 0;
    int rc = vision_encoder_count(e, grid_thw, n_grids, &want, &tokens);
    if (rc) return rc;
    if (n_patches != want)
        return strata_set_error(STRATA_EINVAL,
                                "vision encoder: %lld pixel_values rows, but the %d grid(s) "
                                "describe %lld patches",
                                (long long)n_patches, n_grids, (long long)want);
    int segments = 0, longest = 0;
    for (int i = 0; i < n_grids; ++i) {
        const int64_t hw = grid_thw[3 * i + 1] * grid_thw[3 * i + 2];
        segments += (int)grid_thw[3 * i];
        if (hw > longest) longest = (int)hw;
    }
    const int N = (int)n_patches;
    const size_t hv = (size_t)e->Hv, half = (size_t)e->Dv / 2;
    struct vbufs b = {0};
    if ((rc = cuda_set_device(g->device)) ||
        (rc = vbufs_alloc(&b, e, (size_t)N, (size_t)tokens, segments, longest)))
        goto done;
    vision_tables(e, grid_thw, n_grids, b.h_pos, b.h_cos, b.h_sin, b.cu);
    b.nh = e->nh;
    b.dv = e->Dv;
    /* Embed (reference embed()): patch matmul + bias + position embedding. */
    if ((rc = cuda_memcpy_to_device(b.pixels, pixel_values,
                                    (size_t)N * (size_t)e->P * sizeof(float))) ||
        (rc = cuda_memcpy_to_device(b.tmp, b.h_pos, (size_t)N * hv * sizeof(float))) ||
        (rc = cuda_memcpy_to_device(b.cos, b.h_cos, (size_t)N * half * sizeof(float))) ||
        (rc = cuda_memcpy_to_device(b.sin, b.h_sin, (size_t)N * half * sizeof(float))) ||
        (rc = cuda_matmul(b.x, b.pixels, &g->patch, N, NULL)) ||
        (rc = cuda_add_bias(b.x, g->patch_b, N, e->Hv, NULL)) ||
        (rc = cuda_vec_add(b.x, b.tmp, (int)((size_t)N * hv), NULL)))
        goto done;
    const size_t ds_stride = (size_t)tokens * (size_t)e->O;
    const struct vision_buffers vb = {b.x,   b.norm,   b.qkv, b.attn, b.tmp,
                                      b.mlp, b.merged, b.cos, b.sin};
    for (int i = 0; i < e->cfg.depth && !rc; ++i) {
        rc = vision_block_forward(&cuda_vision_ops, &b, e, &vb, &g->blocks[i], N, segments);
        for (int j = 0; j < e->cfg.num_deepstack && !rc; ++j)
            if (e->cfg.deepstack_visual_indexes[j] == i)
                rc = run_merger(e, &g->deepstack[j], &b, &vb, deepstack + (size_t)j * ds_stride, N);
    }
    if (!rc) rc = run_merger(e, &g->merger, &b, &vb, embeds, N);
done:
    vbufs_free(&b);
    return rc;
}
