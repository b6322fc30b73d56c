/* Stage core, Qwen3-VL side: a request's vision inputs carried through the pipeline.
 *
 * Entry: a client, or the vision stage through stage 0's vision link (its blocks assembled
 * by runtime/stage/stage_server_vision.h), sends a Request with image grids, the merged
 * vision embeddings [n_img, H] and the DeepStack features [K, n_img, H] (wire/strata.fbs).
 * Stage 0 checks them against the model, expands the prompt (one image-pad id per image
 * -> t*h*w/merge^2 rows) and computes the M-RoPE positions itself with get_rope_index
 * (runtime/model/vl_prompt.h): positions are a function of the expanded ids and the
 * grids, so taking them from the sender would only add a way to disagree. The Request it
 * forwards down the ring carries the expanded prompt and no vision tensors: later stages
 * need only prompt_len, and the image rows reach them as hidden states.
 *
 * Stage 0 embeds each prompt chunk, substitutes the image rows, and every Activation of
 * the request carries what the later layers need, sliced to its rows (spec
 * qwen3-architecture.md §5):
 *   - position_ids I32 [3, T]: the prompt's M-RoPE rows, and for a decode row cache index
 *     + rope_delta on all three rows (§5.3). Positions rather than the delta travel, so
 *     later stages keep no per-request M-RoPE state.
 *   - deepstack F32 [K - e, T, H] and visual_mask U8 [T], prefill chunks with image rows
 *     only, where e is the sender's layer_end = the receiver's layer_start: the features of
 *     the layers not yet run (absolute layers e .. K-1). A stage whose layers all lie at or
 *     beyond K receives none; no decode activation carries any (decode rows are text,
 *     §5.4.5).
 * A text request on a VL model sends neither: 1-D positions equal M-RoPE with t = h = w. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/stage/stage_core_internal.h"
#include "wire/codec.h"

static int num_deepstack(const struct stage_core *core) {
    const struct model_config *c = core->be->cfg;
    return c->has_vision ? c->vision.num_deepstack : 0;
}

int stage_vl_init(struct stage_core *core) {
    size_t T = (size_t)core->opt.max_batch_tokens, K = (size_t)num_deepstack(core);
    if (!core->is_first || !core->be->cfg->has_vision) return 0;
    core->vl_positions = malloc(sizeof(int32_t) * 3 * T);
    core->vl_visual = malloc(T);
    core->vl_deepstack = K ? malloc(sizeof(float) * K * T * (size_t)core->hidden_size) : NULL;
    if (!core->vl_positions || !core->vl_visual || (K && !core->vl_deepstack))
        return strata_set_error(STRATA_ENOMEM, "out of memory for the vision rows");
    return 0;
}

void stage_vl_free_core(struct stage_core *core) {
    free(core->vl_positions);
    free(core->vl_visual);
    free(core->vl_deepstack);
}

void stage_vl_free(struct stage_vl *vl) {
    free(vl);
}

/* A Request tensor of f32 values (any codec) of exactly the given shape. */
static int check_f32(const struct wire_tensor *t, const char *name, int ndim, const int64_t *shape,
                     const char *layout) {
    int same = t->defined && t->dtype == WIRE_DTYPE_F32 && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (same) return 0;
    if (!t->defined) return strata_set_error(STRATA_EINVAL, "the request has no %s", name);
    char got[96] = "";
    for (int i = 0, n = 0; i < t->ndim && n < (int)sizeof got - 24; i++)
        n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "",
                      (long long)t->shape[i]);
    return strata_set_error(STRATA_EINVAL, "%s must be F32 %s, got %s [%s]", name, layout,
                            wire_dtype_name(t->dtype), got);
}

/* The vision tensors against the model: embeddings [n_img, H], DeepStack [K, n_img, H]. */
static int check_tensors(const struct model_config *c, const struct wire_request *msg,
                         int64_t n_img) {
    int K = c->vision.num_deepstack;
    int rc = check_f32(&msg->vision_embeds, "vision_embeds", 2,
                       (const int64_t[]){n_img, c->hidden_size}, "[image tokens, H]");
    if (rc < 0) return rc;
    if (msg->deepstack.defined && msg->deepstack.ndim == 3 && msg->deepstack.shape[0] != K)
        return strata_set_error(STRATA_EINVAL,
                                "deepstack holds features for %lld layers, the model takes %d "
                                "(deepstack_visual_indexes; it has %d decoder layers)",
                                (long long)msg->deepstack.shape[0], K, c->num_layers);
    if (K == 0) {
        if (msg->deepstack.defined)
            return strata_set_error(STRATA_EINVAL, "the model takes no DeepStack features");
        return 0;
    }
    return check_f32(&msg->deepstack, "deepstack", 3, (const int64_t[]){K, n_img, c->hidden_size},
                     "[K, image tokens, H]");
}

/* Fills vl->ids with the expanded prompt: as sent when it holds every image's run, else
 * each image's single pad expanded (the processor's rule, spec §8.2). */
static int expand(struct stage_vl *vl, const struct wire_request *msg, const struct vl_tokens *tok,
                  const struct vl_grid *grids, int n_images) {
    int len;
    if ((size_t)vl->prompt_len == msg->prompt_len) {
        memcpy(vl->ids, msg->prompt, sizeof(int32_t) * msg->prompt_len);
        return 0;
    }
    return vl_expand_prompt(vl->ids, vl->prompt_len, &len, msg->prompt, (int)msg->prompt_len, tok,
                            grids, n_images);
}

/* The expanded prompt length: every grid's run expanded (image and video tokens add up to
 * the grids' token count), or one pad per image, each video's blocks already written in (the
 * vision stage writes their timestamps with the tokenizer; vl_prompt.h). */
static int expanded_len(int64_t *len, const struct wire_request *msg, const struct vl_tokens *tok,
                        int n_images, int64_t n_img) {
    int64_t pads = 0, video = 0, runs = 0;
    for (size_t i = 0; i < msg->prompt_len; i++) {
        pads += msg->prompt[i] == tok->image_token_id;
        video += msg->prompt[i] == tok->video_token_id;
        runs += msg->prompt[i] == tok->video_token_id &&
                (i == 0 || msg->prompt[i - 1] != tok->video_token_id);
    }
    if (pads + video == n_img) {
        *len = (int64_t)msg->prompt_len;
        return 0;
    }
    if (pads + runs == n_images) {
        *len = (int64_t)msg->prompt_len - pads + (n_img - video);
        return 0;
    }
    if (runs == 0)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt holds %lld image tokens (id %d) for %d image(s): "
                                "expected %d (one per image) or %lld (the images' grids expanded)",
                                (long long)pads, tok->image_token_id, n_images, n_images,
                                (long long)n_img);
    return strata_set_error(STRATA_EINVAL,
                            "the prompt holds %lld image tokens and %lld video frame blocks for %d "
                            "grid(s): expected one per grid (or every grid's run expanded)",
                            (long long)pads, (long long)runs, n_images);
}

int stage_vl_prepare(const struct stage_core *core, struct stage_vl **out, int *prompt_len,
                     const struct wire_request *msg) {
    const struct model_config *c = core->be->cfg;
    int has = msg->num_images || msg->vision_embeds.defined || msg->deepstack.defined;
    int n_images = (int)msg->num_images, H = core->hidden_size, K = num_deepstack(core);
    const struct vl_grid *grids = (const struct vl_grid *)msg->image_grids;
    struct vl_tokens tok = {c->image_token_id, c->video_token_id, c->vision.spatial_merge_size};
    int64_t n_img = 0, len = 0;
    int rc;
    *out = NULL;
    if (msg->num_image_files)
        return strata_set_error(STRATA_EINVAL,
                                "the request carries %zu image file(s): image files are decoded "
                                "and encoded by a vision stage (strata-stage --role vision) in "
                                "front of stage 0, not by stage 0",
                                msg->num_image_files);
    /* A request without images is text, image-pad ids included: transformers embeds them
     * as ordinary tokens and gives text positions when no pixel values come (4.57
     * Qwen3VLModel.forward / get_rope_index), and so does this runtime. */
    if (!has) return 0;
    if (!c->has_vision)
        return strata_set_error(STRATA_EINVAL,
                                "the request carries images but model %s has no "
                                "vision tower",
                                c->model_type_name);
    if (msg->num_images < 1 || msg->num_images > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "the request has %zu image grids (need 1..%d)",
                                msg->num_images, VL_MAX_IMAGES);
    rc = vl_total_image_tokens(&n_img, grids, n_images, tok.merge);
    if (rc == 0) rc = expanded_len(&len, msg, &tok, n_images, n_img);
    if (rc == 0) rc = check_tensors(c, msg, n_img);
    if (rc < 0) return rc;
    if (len > core->max_seq)
        return strata_set_error(STRATA_ERANGE,
                                "the expanded prompt has %lld tokens, --max-seq is %d",
                                (long long)len, core->max_seq);
    size_t floats = (size_t)n_img * (size_t)H * (size_t)(1 + K);
    struct stage_vl *vl =
        malloc(sizeof *vl + sizeof(float) * floats + sizeof(struct vl_grid) * (size_t)n_images +
               sizeof(int32_t) * 4 * (size_t)len);
    if (!vl)
        return strata_set_error(STRATA_ENOMEM, "out of memory for %lld image rows",
                                (long long)n_img);
    vl->prompt_len = (int)len;
    vl->n_image_tokens = (int)n_img;
    vl->num_deepstack = K;
    /* floats first, then the grids and ids (alignment: each part's is at most the one before) */
    vl->embeds = (float *)(vl + 1);
    vl->deepstack = vl->embeds + (size_t)n_img * H;
    vl->n_images = n_images;
    vl->grids = (struct vl_grid *)(vl->embeds + floats);
    memcpy(vl->grids, grids, sizeof(struct vl_grid) * (size_t)n_images);
    vl->ids = (int32_t *)(vl->grids + n_images);
    vl->positions = vl->ids + len;
    rc = expand(vl, msg, &tok, grids, n_images);
    if (rc == 0)
        rc = vl_rope_index(vl->positions, &vl->rope_delta, vl->ids, vl->prompt_len, &tok, grids,
                           n_images);
    if (rc == 0) rc = wire_tensor_decode_f32(vl->embeds, &msg->vision_embeds);
    if (rc == 0 && K) rc = wire_tensor_decode_f32(vl->deepstack, &msg->deepstack);
    if (rc < 0) {
        free(vl);
        return rc;
    }
    *out = vl;
    *prompt_len = vl->prompt_len;
    return 0;
}

void stage_vl_forward_fields(const struct stage_req *req, struct wire_request *fwd) {
    fwd->prompt = req->prompt;
    fwd->prompt_len = (size_t)req->params.prompt_len;
    fwd->image_grids = NULL;
    fwd->num_images = 0;
    memset(&fwd->vision_embeds, 0, sizeof fwd->vision_embeds);
    memset(&fwd->deepstack, 0, sizeof fwd->deepstack);
}

/* Stage 0: the image rows of prefill chunk `it` (rows at `hidden`, microbatch row
 * `row_off`): embeddings substituted, and positions, mask and DeepStack rows laid out in
 * the core's microbatch scratch for the forward item `fi`. Decode rows get positions only.
 * A recovery replay's prefill (stage_recovery.c) runs past the prompt into the generated
 * tokens: those rows are text rows at the positions their decode steps had. */
void stage_vl_fill(struct stage_core *core, const struct stage_req *req,
                   const struct stage_item *it, float *hidden, int row_off,
                   struct forward_item *fi) {
    const struct stage_vl *vl = req->vl;
    int n = it->n_tokens, H = core->hidden_size, K = vl->num_deepstack, img = 0, first;
    int in_prompt = vl->prompt_len - it->pos < n ? vl->prompt_len - it->pos : n;
    int32_t *pos = core->vl_positions + 3 * (size_t)row_off;
    fi->mrope_positions = pos;
    if (it->step > 0) {
        vl_decode_positions(pos, n, it->pos, vl->rope_delta);
        return;
    }
    uint8_t *mask = core->vl_visual + row_off;
    float *ds = K ? core->vl_deepstack + (size_t)K * (size_t)row_off * H : NULL;
    const struct model_config *c = core->be->cfg;
    const struct vl_tokens tok = {c->image_token_id, c->video_token_id, 0};
    for (int i = 0; i < it->pos; i++)
        img += vl_is_visual(&tok, req->prompt[i]);
    first = img;
    if (in_prompt < 0) in_prompt = 0;
    for (int r = 0; r < 3; r++) {
        memcpy(pos + r * n, vl->positions + (size_t)r * vl->prompt_len + it->pos,
               sizeof(int32_t) * in_prompt);
        for (int i = in_prompt; i < n; i++) /* replayed generated tokens (spec §5.3) */
            pos[r * n + i] = it->pos + i + vl->rope_delta;
    }
    for (int i = 0; i < n; i++) {
        mask[i] = i < in_prompt && vl_is_visual(&tok, req->prompt[it->pos + i]);
        for (int k = 0; k < K; k++) {
            float *dst = ds + ((size_t)k * n + i) * H;
            if (mask[i])
                memcpy(dst, vl->deepstack + ((size_t)k * vl->n_image_tokens + img) * H,
                       sizeof(float) * H);
            else
                memset(dst, 0, sizeof(float) * H);
        }
        if (mask[i])
            memcpy(hidden + (size_t)i * H, vl->embeds + (size_t)img++ * H, sizeof(float) * H);
    }
    /* A chunk without image rows needs no DeepStack (it is added on image rows only), so
     * its activations carry none. */
    if (K && img > first) {
        fi->deepstack = ds;
        fi->visual_mask = mask;
        fi->num_deepstack = K;
    }
}

/* Stages r > 0: the vision rows of an activation of `rows` rows (see the file comment). */
int stage_vl_check_activation(const struct stage_core *core, const struct wire_activation *msg,
                              int rows) {
    const struct wire_tensor *p = &msg->position_ids, *d = &msg->deepstack, *m = &msg->visual_mask;
    int start = core->be->role.layer_start, L = core->be->cfg->num_layers;
    if (p->defined && (p->dtype != WIRE_DTYPE_I32 || p->codec != WIRE_CODEC_NONE || p->ndim != 2 ||
                       p->shape[0] != 3 || p->shape[1] != rows))
        return strata_set_error(STRATA_EFORMAT,
                                "activation position_ids must be I32 [3, %d] (got %s rank %d)",
                                rows, wire_dtype_name(p->dtype), p->ndim);
    if (!d->defined) return 0;
    if (msg->step != 0)
        return strata_set_error(STRATA_EFORMAT, "a decode activation carries DeepStack features");
    if (d->dtype != WIRE_DTYPE_F32 || d->ndim != 3 || d->shape[0] < 1 || d->shape[0] > L - start ||
        d->shape[1] != rows || d->shape[2] != core->hidden_size)
        return strata_set_error(STRATA_EFORMAT,
                                "activation deepstack must be F32 [k, %d, %d] with 1 <= k <= %d "
                                "(layers from %d on; got %s rank %d, k %lld)",
                                rows, core->hidden_size, L - start, start,
                                wire_dtype_name(d->dtype), d->ndim,
                                d->ndim ? (long long)d->shape[0] : 0LL);
    if (!m->defined || m->dtype != WIRE_DTYPE_U8 || m->codec != WIRE_CODEC_NONE || m->ndim != 1 ||
        m->shape[0] != rows)
        return strata_set_error(STRATA_EFORMAT, "activation deepstack needs a visual_mask U8 [%d]",
                                rows);
    return 0;
}

/* Grows an item buffer of `elem`-byte values to `count` (kept across recycling). */
static int reserve(void **buf, size_t *cap, size_t count, size_t elem) {
    if (count <= *cap) return 0;
    void *grown = realloc(*buf, count * elem);
    if (!grown) return strata_set_error(STRATA_ENOMEM, "out of memory for vision rows");
    *buf = grown;
    *cap = count;
    return 0;
}

int stage_vl_take_activation(struct stage_core *core, struct stage_item *it,
                             const struct wire_activation *msg) {
    size_t n = (size_t)it->n_tokens, H = (size_t)core->hidden_size;
    int start = core->be->role.layer_start, rc;
    if (msg->position_ids.defined) {
        rc = reserve((void **)&it->positions, &it->positions_cap, 3 * n, sizeof(int32_t));
        if (rc < 0) return rc;
        memcpy(it->positions, msg->position_ids.data, sizeof(int32_t) * 3 * n);
        it->has_positions = 1;
    }
    if (!msg->deepstack.defined) return 0;
    size_t K = (size_t)start + (size_t)msg->deepstack.shape[0];
    rc = reserve((void **)&it->deepstack, &it->deepstack_cap, K * n * H, sizeof(float));
    if (rc == 0) rc = reserve((void **)&it->visual, &it->visual_cap, n, 1);
    if (rc == 0)
        rc = wire_tensor_decode_f32(it->deepstack + (size_t)start * n * H, &msg->deepstack);
    if (rc < 0) return rc;
    memcpy(it->visual, msg->visual_mask.data, n);
    it->num_deepstack = (int)K;
    return 0;
}

void stage_vl_item(const struct stage_core *core, const struct stage_item *it,
                   struct forward_item *fi) {
    (void)core;
    if (it->has_positions) fi->mrope_positions = it->positions;
    if (it->num_deepstack) {
        fi->deepstack = it->deepstack;
        fi->visual_mask = it->visual;
        fi->num_deepstack = it->num_deepstack;
    }
}

/* The vision rows of an outgoing activation: positions always, DeepStack (with its mask)
 * only for the layers from the next stage's first layer (our layer_end) to K. */
void stage_vl_attach(const struct stage_core *core, const struct forward_item *fi,
                     struct wire_activation *msg) {
    int n = fi->n_tokens, H = core->hidden_size, end = core->be->role.layer_end;
    if (fi->mrope_positions)
        msg->position_ids = (struct wire_tensor){.defined = 1,
                                                 .dtype = WIRE_DTYPE_I32,
                                                 .ndim = 2,
                                                 .shape = {3, n},
                                                 .data = fi->mrope_positions,
                                                 .nbytes = sizeof(int32_t) * 3 * (size_t)n};
    if (!fi->deepstack || end >= fi->num_deepstack) return;
    msg->deepstack = (struct wire_tensor){
        .defined = 1,
        .dtype = WIRE_DTYPE_F32,
        .ndim = 3,
        .shape = {fi->num_deepstack - end, n, H},
        .data = fi->deepstack + (size_t)end * n * H,
        .nbytes = sizeof(float) * (size_t)(fi->num_deepstack - end) * (size_t)n * (size_t)H};
    msg->visual_mask = (struct wire_tensor){.defined = 1,
                                            .dtype = WIRE_DTYPE_U8,
                                            .ndim = 1,
                                            .shape = {n},
                                            .data = fi->visual_mask,
                                            .nbytes = (size_t)n};
}

int stage_core_submit(struct stage_core *core, uint32_t client_id,
                      const struct stage_request *req) {
    struct wire_arena arena; /* not the core's: stage 0 builds the forwarded Request there */
    if (!core->is_first)
        return strata_set_error(STRATA_EINVAL, "stage %d: requests enter at stage 0",
                                core->opt.stage_index);
    int rc = wire_arena_init(&arena, 0);
    if (rc == 0) rc = request_build(&arena, req);
    if (rc == 0)
        rc = stage_core_on_frame(core, STAGE_LINK_CLIENT, client_id, wire_arena_frame(&arena),
                                 wire_arena_frame_len(&arena));
    wire_arena_free(&arena);
    return rc;
}
