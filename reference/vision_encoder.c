/* The reference vision encoder's forward pass (contract in vision_encoder.h; math in shared
 * spec qwen3-architecture.md §6, from transformers' Qwen3VLVisionModel.forward). It reads top
 * to bottom like the PyTorch forward: patch embed + position embedding, rotary tables and
 * cu_seqlens, the blocks with their DeepStack taps, the main merger. Shape letters are those
 * of vision_encoder_internal.h; N = patches, T = merged tokens of the whole call. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "reference/ops.h"
#include "reference/ops_vision.h"
#include "reference/vision_encoder_internal.h"
#include "runtime/base/status.h"

#define VISION_LN_EPS 1e-6f /* every vision LayerNorm (spec §6.4, §6.5) */

/* Checks what the forward's math needs beyond what config.json parsing guarantees. */
static int check_config(const struct model_config *cfg) {
    const struct vision_config *v = &cfg->vision;
    if (!cfg->has_vision)
        return strata_set_error(STRATA_EINVAL, "vision encoder: model_type %s has no vision tower",
                                cfg->model_type_name);
    if (v->hidden_size % v->num_heads != 0 || (v->hidden_size / v->num_heads) % 4 != 0)
        return strata_set_error(STRATA_EINVAL,
                                "vision encoder: head_dim %d/%d must be a whole multiple of 4 "
                                "(2-D rotary over row and column halves, spec §6.3)",
                                v->hidden_size, v->num_heads);
    int g = 1;
    while ((int64_t)g * g < v->num_position_embeddings)
        ++g;
    if ((int64_t)g * g != v->num_position_embeddings)
        return strata_set_error(STRATA_EINVAL,
                                "vision encoder: num_position_embeddings %d is not a square",
                                v->num_position_embeddings);
    for (int j = 0; j < v->num_deepstack; ++j) {
        int idx = v->deepstack_visual_indexes[j];
        if (idx < 0 || idx >= v->depth)
            return strata_set_error(STRATA_EINVAL,
                                    "vision encoder: deepstack_visual_indexes[%d] = %d is not a "
                                    "block of the depth-%d tower",
                                    j, idx, v->depth);
        for (int k = 0; k < j; ++k)
            if (v->deepstack_visual_indexes[k] == idx)
                return strata_set_error(STRATA_EINVAL,
                                        "vision encoder: deepstack_visual_indexes lists block %d "
                                        "twice",
                                        idx);
    }
    return STRATA_OK;
}

static void set_shapes(struct vision_encoder *e) {
    const struct vision_config *v = &e->cfg;
    e->Hv = v->hidden_size;
    e->Iv = v->intermediate_size;
    e->nh = v->num_heads;
    e->Dv = e->Hv / e->nh;
    e->m = v->spatial_merge_size;
    e->Hm = e->Hv * e->m * e->m;
    e->O = v->out_hidden_size;
    e->P = v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    e->G = 1;
    while (e->G * e->G < v->num_position_embeddings)
        ++e->G;
    /* Patches per call are capped so every [N, width] element count fits the int sizes the
     * ops take (widest: qkv 3Hv, the MLP Iv, the patch row P). */
    int64_t widest = 3 * (int64_t)e->Hv;
    if (e->Iv > widest) widest = e->Iv;
    if (e->P > widest) widest = e->P;
    if (e->O > widest) widest = e->O;
    e->max_patches = INT_MAX / widest;
}

int vision_encoder_load(struct vision_encoder **out, const struct model_config *cfg,
                        const struct safetensors *st, int num_threads) {
    if (!out || !cfg || !st)
        return strata_set_error(STRATA_EINVAL, "vision_encoder_load: null argument");
    *out = NULL;
    int rc = check_config(cfg);
    if (rc) return rc;
    struct vision_encoder *e = calloc(1, sizeof *e);
    if (!e) return strata_set_error(STRATA_ENOMEM, "vision encoder: out of memory");
    e->cfg = cfg->vision;
    set_shapes(e);
    e->blocks = calloc((size_t)e->cfg.depth, sizeof *e->blocks);
    e->deepstack =
        calloc((size_t)(e->cfg.num_deepstack ? e->cfg.num_deepstack : 1), sizeof *e->deepstack);
    e->inv_freq = malloc((size_t)e->Dv / 4 * sizeof *e->inv_freq);
    if (!e->blocks || !e->deepstack || !e->inv_freq) {
        rc = strata_set_error(STRATA_ENOMEM, "vision encoder: out of memory");
        goto fail;
    }
    for (int j = 0; j < e->cfg.num_deepstack; ++j)
        e->deepstack[j].postshuffle = 1;
    /* inv_freq = 1 / 10000^(arange(0, dim, 2) / dim) with dim = Dv / 2 (spec §6.3). */
    rope_inv_freq(e->inv_freq, 10000.0f, e->Dv / 2);
    if ((rc = thread_pool_init(&e->pool, num_threads))) goto fail;
    if ((rc = vision_load_weights(e, cfg, st))) goto fail;
    *out = e;
    return STRATA_OK;
fail:
    vision_encoder_free(e);
    return rc;
}

static void free_scratch(struct vision_encoder *e) {
    float **bufs[] = {&e->x,   &e->norm,   &e->qkv,      &e->attn,     &e->tmp,
                      &e->mlp, &e->merged, &e->rope_cos, &e->rope_sin, &e->attn_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    free(e->cu_seqlens);
    e->cu_seqlens = NULL;
    e->cap_rows = 0;
    e->cap_segments = e->cap_longest = 0;
    e->scratch_bytes = 0;
}

void vision_encoder_free(struct vision_encoder *e) {
    if (!e) return;
    free_scratch(e);
    for (int i = 0; i < e->n_owned; ++i)
        free(e->owned[i]);
    free(e->owned);
    free(e->blocks);
    free(e->deepstack);
    free(e->inv_freq);
    thread_pool_free(e->pool);
    free(e);
}

const struct vision_config *vision_encoder_config(const struct vision_encoder *e) {
    return &e->cfg;
}
int vision_encoder_patch_dim(const struct vision_encoder *e) {
    return e->P;
}
int vision_encoder_out_hidden(const struct vision_encoder *e) {
    return e->O;
}
int vision_encoder_num_deepstack(const struct vision_encoder *e) {
    return e->cfg.num_deepstack;
}
int vision_encoder_num_threads(const struct vision_encoder *e) {
    return thread_pool_size(e->pool);
}
size_t vision_encoder_weight_bytes(const struct vision_encoder *e) {
    return e->weight_bytes;
}
size_t vision_encoder_extra_bytes(const struct vision_encoder *e) {
    return e->extra_bytes;
}
size_t vision_encoder_scratch_bytes(const struct vision_encoder *e) {
    return e->scratch_bytes;
}

int vision_encoder_count(const struct vision_encoder *e, const int64_t *grid_thw, int n_grids,
                         int64_t *n_patches, int64_t *n_tokens) {
    if (!e || (!grid_thw && n_grids > 0) || n_grids < 1)
        return strata_set_error(STRATA_EINVAL, "vision encoder: no image grid given");
    int64_t total = 0;
    const int64_t m = e->m, cap = e->max_patches;
    for (int i = 0; i < n_grids; ++i) {
        const int64_t t = grid_thw[3 * i], h = grid_thw[3 * i + 1], w = grid_thw[3 * i + 2];
        if (t < 1 || h < 1 || w < 1 || t > cap || h > cap || w > cap)
            return strata_set_error(STRATA_EINVAL,
                                    "vision encoder: image %d grid (t=%lld, h=%lld, w=%lld) has a "
                                    "side outside [1, %d]",
                                    i, (long long)t, (long long)h, (long long)w, (int)cap);
        if (h % m || w % m)
            return strata_set_error(STRATA_EINVAL,
                                    "vision encoder: image %d grid (t=%lld, h=%lld, w=%lld): h and "
                                    "w must be multiples of spatial_merge_size %lld",
                                    i, (long long)t, (long long)h, (long long)w, (long long)m);
        if (h * w > cap || t * h * w > cap - total)
            return strata_set_error(
                STRATA_EINVAL,
                "vision encoder: more than %lld patches in one call (image %d); "
                "encode the images in several calls",
                (long long)cap, i);
        total += t * h * w;
    }
    if (n_patches) *n_patches = total;
    if (n_tokens) *n_tokens = total / (m * m);
    return STRATA_OK;
}

/* Grows a float buffer to `count` floats; the old contents are not kept. */
static int grow(float **buf, size_t count, size_t *bytes) {
    float *p = realloc(*buf, (count ? count : 1) * sizeof(float));
    if (!p) return -1;
    *buf = p;
    *bytes += count * sizeof(float);
    return 0;
}

/* Makes the scratch hold N patch rows, `segments` attention segments of at most `longest` rows. */
static int reserve(struct vision_encoder *e, int64_t N, int segments, int longest) {
    if (N <= e->cap_rows && segments <= e->cap_segments && longest <= e->cap_longest)
        return STRATA_OK;
    if (N < e->cap_rows) N = e->cap_rows;
    if (segments < e->cap_segments) segments = e->cap_segments;
    if (longest < e->cap_longest) longest = e->cap_longest;
    free_scratch(e);
    const size_t n = (size_t)N, hv = (size_t)e->Hv, half = (size_t)e->Dv / 2;
    const size_t T = n / (size_t)(e->m * e->m);
    size_t bytes = 0;
    int fail =
        grow(&e->x, n * hv, &bytes) | grow(&e->norm, n * hv, &bytes) |
        grow(&e->qkv, 3 * n * hv, &bytes) | grow(&e->attn, n * hv, &bytes) |
        grow(&e->tmp, n * hv, &bytes) | grow(&e->mlp, n * (size_t)e->Iv, &bytes) |
        grow(&e->merged, T * (size_t)e->Hm, &bytes) | grow(&e->rope_cos, n * half, &bytes) |
        grow(&e->rope_sin, n * half, &bytes) |
        grow(&e->attn_scratch,
             vision_attention_scratch((int)N, longest, e->nh, e->Dv, thread_pool_size(e->pool)),
             &bytes);
    e->cu_seqlens = malloc(((size_t)segments + 1) * sizeof *e->cu_seqlens);
    if (fail || !e->cu_seqlens) {
        free_scratch(e);
        return strata_set_error(STRATA_ENOMEM, "vision encoder: out of memory for %lld patches",
                                (long long)N);
    }
    e->scratch_bytes = bytes + ((size_t)segments + 1) * sizeof *e->cu_seqlens;
    e->cap_rows = N;
    e->cap_segments = segments;
    e->cap_longest = longest;
    return STRATA_OK;
}

/* Bytes of input rows one matmul block reads: about half of a 512 KiB L2. */
#define VISION_MATMUL_BLOCK_BYTES (256u << 10)

/* out [n, w->rows] = x [n, w->cols] @ w^T in blocks of input rows that stay in L2, so the
 * weight is streamed once per block instead of all n input rows once per weight row (what one
 * matmul over hundreds of patches does). The same bits as one matmul: each output element is
 * one fixed-order dot whatever the block (ops.h). */
static void matmul_blocked(float *out, const float *x, const struct ops_weight *w, int n,
                           struct thread_pool *pool) {
    int block = (int)(VISION_MATMUL_BLOCK_BYTES / ((size_t)w->cols * sizeof(float)));
    block = block < 4 ? 4 : block & ~3;
    for (int t = 0; t < n; t += block)
        matmul(out + (size_t)t * (size_t)w->rows, x + (size_t)t * (size_t)w->cols, w,
               n - t < block ? n - t : block, pool);
}

/* The row-wise steps between matmuls, run on the pool in contiguous row ranges (each row whole
 * in one call, so the bits do not depend on the split). */
enum row_op {
    ROW_LAYERNORM,      /* y = LayerNorm(x) * w + b */
    ROW_BIAS,           /* y += b */
    ROW_BIAS_GELU_TANH, /* y = gelu_tanh(y + b) */
    ROW_BIAS_GELU_ERF,  /* y = gelu_erf(y + b) */
    ROW_BIAS_RESIDUAL   /* y += b; acc += y */
};

struct row_job {
    enum row_op op;
    float *y, *acc;     /* [n, dim] */
    const float *x;     /* [n, dim] (ROW_LAYERNORM) */
    const float *w, *b; /* [dim] */
    int dim;
};

static void row_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct row_job *j = ctx;
    const size_t off = (size_t)begin * (size_t)j->dim;
    const int n = end - begin;
    float *y = j->y + off;
    if (j->op == ROW_LAYERNORM) {
        layernorm(y, j->x + off, j->w, j->b, VISION_LN_EPS, n, j->dim);
        return;
    }
    add_bias(y, j->b, n, j->dim);
    if (j->op == ROW_BIAS_GELU_TANH) gelu_tanh(y, y, n * j->dim);
    if (j->op == ROW_BIAS_GELU_ERF) gelu_erf(y, y, n * j->dim);
    if (j->op == ROW_BIAS_RESIDUAL) vec_add(j->acc + off, y, n * j->dim);
}

static void rows(struct vision_encoder *e, enum row_op op, float *y, float *acc, const float *x,
                 const float *w, const float *b, int n, int dim) {
    struct row_job job = {op, y, acc, x, w, b, dim};
    thread_pool_run(e->pool, row_task, &job, n);
}

void vision_tables(const struct vision_encoder *e, const int64_t *grid_thw, int n_grids, float *pos,
                   float *cos_t, float *sin_t, int *cu_seqlens) {
    const int Hv = e->Hv, m = e->m, half = e->Dv / 2;
    size_t row = 0;
    int seg = 0;
    cu_seqlens[0] = 0;
    for (int g = 0; g < n_grids; ++g) {
        const int t = (int)grid_thw[3 * g], h = (int)grid_thw[3 * g + 1];
        const int w = (int)grid_thw[3 * g + 2];
        if (pos) vision_pos_embed(pos + row * (size_t)Hv, e->pos_embed, e->G, t, h, w, m, Hv);
        for (int f = 0; f < t; ++f) {
            for (int bh = 0; bh < h / m; ++bh)
                for (int bw = 0; bw < w / m; ++bw)
                    for (int ih = 0; ih < m; ++ih)
                        for (int iw = 0; iw < m; ++iw, ++row)
                            vision_rope_cos_sin(cos_t + row * (size_t)half,
                                                sin_t + row * (size_t)half, e->inv_freq,
                                                bh * m + ih, bw * m + iw, half / 2);
            cu_seqlens[seg + 1] = cu_seqlens[seg] + h * w;
            ++seg;
        }
    }
}

/* x [N, Hv] = patch rows @ W^T + b + interpolated position embedding (spec §6.1, §6.2); also
 * the rotary tables [N, Dv/2] and cu_seqlens (one segment per frame, spec §6.3, §6.4). */
static void embed(struct vision_encoder *e, const float *pixels, int N, const int64_t *grid_thw,
                  int n_grids) {
    matmul_blocked(e->x, pixels, &e->patch, N, e->pool);
    rows(e, ROW_BIAS, e->x, NULL, NULL, NULL, e->patch_b, N, e->Hv);
    vision_tables(e, grid_thw, n_grids, e->tmp, e->rope_cos, e->rope_sin, e->cu_seqlens);
    vec_add(e->x, e->tmp, N * e->Hv);
}

int vision_block_forward(const struct vision_ops *o, void *c, const struct vision_encoder *e,
                         const struct vision_buffers *b, const struct vision_block *k, int N,
                         int segments) {
    const int Hv = e->Hv;
    int rc;
    /* x = x + proj(attention(rope(qkv(LN1(x))))) within each frame */
    if ((rc = o->layernorm(c, b->norm, b->x, k->norm1_w, k->norm1_b, N, Hv)) ||
        (rc = o->matmul(c, b->qkv, b->norm, &k->qkv, N)) ||
        (rc = o->add_bias(c, b->qkv, k->qkv_b, N, 3 * Hv)) ||
        (rc = o->rope_rows(c, b->qkv, b->cos_t, b->sin_t, N, 3 * Hv, e->nh, e->Dv)) ||
        (rc = o->rope_rows(c, b->qkv + Hv, b->cos_t, b->sin_t, N, 3 * Hv, e->nh, e->Dv)) ||
        (rc = o->attention(c, b->attn, b->qkv, segments, N)) ||
        (rc = o->matmul(c, b->tmp, b->attn, &k->proj, N)) ||
        (rc = o->bias_residual(c, b->tmp, b->x, k->proj_b, N, Hv)))
        return rc;
    /* x = x + fc2(gelu_tanh(fc1(LN2(x)))) */
    if ((rc = o->layernorm(c, b->norm, b->x, k->norm2_w, k->norm2_b, N, Hv)) ||
        (rc = o->matmul(c, b->mlp, b->norm, &k->fc1, N)) ||
        (rc = o->bias_gelu(c, b->mlp, k->fc1_b, N, e->Iv, 0)) ||
        (rc = o->matmul(c, b->tmp, b->mlp, &k->fc2, N)))
        return rc;
    return o->bias_residual(c, b->tmp, b->x, k->fc2_b, N, Hv);
}

/* The m^2 consecutive patch rows of a merge window are one [Hm] row, normed after that
 * view (DeepStack) or per patch before it. */
int vision_merger_forward(const struct vision_ops *o, void *c, const struct vision_encoder *e,
                          const struct vision_buffers *b, const struct vision_merger *mg,
                          float *out, int N) {
    const int T = N / (e->m * e->m);
    int rc = mg->postshuffle ? o->layernorm(c, b->norm, b->x, mg->norm_w, mg->norm_b, T, e->Hm)
                             : o->layernorm(c, b->norm, b->x, mg->norm_w, mg->norm_b, N, e->Hv);
    if (rc || (rc = o->matmul(c, b->merged, b->norm, &mg->fc1, T)) ||
        (rc = o->bias_gelu(c, b->merged, mg->fc1_b, T, e->Hm, 1)) ||
        (rc = o->matmul(c, out, b->merged, &mg->fc2, T)))
        return rc;
    return o->add_bias(c, out, mg->fc2_b, T, e->O);
}

/* ---- the CPU's vision ops: reference/ops on the encoder's thread pool ---- */

static int op_layernorm(void *c, float *out, const float *x, const float *w, const float *b, int n,
                        int dim) {
    rows(c, ROW_LAYERNORM, out, NULL, x, w, b, n, dim);
    return STRATA_OK;
}

static int op_matmul(void *c, float *out, const float *x, const struct ops_weight *w, int n) {
    matmul_blocked(out, x, w, n, ((struct vision_encoder *)c)->pool);
    return STRATA_OK;
}

static int op_add_bias(void *c, float *y, const float *b, int n, int dim) {
    rows(c, ROW_BIAS, y, NULL, NULL, NULL, b, n, dim);
    return STRATA_OK;
}

static int op_bias_gelu(void *c, float *y, const float *b, int n, int dim, int erf) {
    rows(c, erf ? ROW_BIAS_GELU_ERF : ROW_BIAS_GELU_TANH, y, NULL, NULL, NULL, b, n, dim);
    return STRATA_OK;
}

static int op_bias_residual(void *c, float *y, float *acc, const float *b, int n, int dim) {
    rows(c, ROW_BIAS_RESIDUAL, y, acc, NULL, NULL, b, n, dim);
    return STRATA_OK;
}

static int op_rope_rows(void *c, float *x, const float *cos_t, const float *sin_t, int n,
                        int row_floats, int heads, int head_dim) {
    (void)c;
    const size_t half = (size_t)head_dim / 2;
    for (size_t r = 0; r < (size_t)n; ++r)
        rope_apply(x + r * (size_t)row_floats, cos_t + r * half, sin_t + r * half, heads, head_dim);
    return STRATA_OK;
}

static int op_attention(void *c, float *out, const float *qkv, int segments, int n) {
    struct vision_encoder *e = c;
    vision_attention(out, qkv, e->attn_scratch, e->cu_seqlens, segments, n, e->nh, e->Dv, e->pool);
    return STRATA_OK;
}

static const struct vision_ops cpu_vision_ops = {.layernorm = op_layernorm,
                                                 .matmul = op_matmul,
                                                 .add_bias = op_add_bias,
                                                 .bias_gelu = op_bias_gelu,
                                                 .bias_residual = op_bias_residual,
                                                 .rope_rows = op_rope_rows,
                                                 .attention = op_attention};

int vision_encoder_forward(struct vision_encoder *e, float *embeds, float *deepstack,
                           const float *pixel_values, int64_t n_patches, const int64_t *grid_thw,
                           int n_grids) {
    if (!e || !embeds || !pixel_values || (!deepstack && e->cfg.num_deepstack > 0))
        return strata_set_error(STRATA_EINVAL, "vision_encoder_forward: null argument");
    int64_t want = 0, tokens = 0;
    int rc = vision_encoder_count(e, grid_thw, n_grids, &want, &tokens);
    if (rc) return rc;
    if (n_patches != want)
        return strata_set_error(STRATA_EINVAL,
                                "vision encoder: %lld pixel_values rows, but the %d grid(s) "
                                "describe %lld patches",
                                (long long)n_patches, n_grids, (long long)want);
    int segments = 0, longest = 0;
    for (int g = 0; g < n_grids; ++g) {
        const int64_t hw = grid_thw[3 * g + 1] * grid_thw[3 * g + 2];
        segments += (int)grid_thw[3 * g];
        if (hw > longest) longest = (int)hw;
    }
    if ((rc = reserve(e, n_patches, segments, longest))) return rc;
    const int N = (int)n_patches;
    embed(e, pixel_values, N, grid_thw, n_grids);
    const size_t ds_stride = (size_t)tokens * (size_t)e->O;
    const struct vision_buffers b = {e->x,   e->norm,   e->qkv,      e->attn,    e->tmp,
                                     e->mlp, e->merged, e->rope_cos, e->rope_sin};
    for (int i = 0; i < e->cfg.depth && !rc; ++i) {
        rc = vision_block_forward(&cpu_vision_ops, e, e, &b, &e->blocks[i], N, segments);
        for (int j = 0; j < e->cfg.num_deepstack && !rc; ++j)
            if (e->cfg.deepstack_visual_indexes[j] == i)
                rc = vision_merger_forward(&cpu_vision_ops, e, e, &b, &e->deepstack[j],
                                           deepstack + (size_t)j * ds_stride, N);
    }
    if (!rc) rc = vision_merger_forward(&cpu_vision_ops, e, e, &b, &e->merger, embeds, N);
    return rc;
}
