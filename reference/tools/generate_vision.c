/* strata-generate's image and video path; see generate_vision.h. The steps are those of
 * transformers' Qwen3VLProcessor + Qwen3VLModel.forward for one prompt: each file is decoded
 * (images: alpha onto white) and preprocessed on its own (spec qwen3-vl-preprocessing.md
 * §3-§7; docs/qwen3-vl-video.md), everything is encoded in one vision call (patches
 * concatenated in prompt order), the prompt's video tokens are expanded with their timestamps
 * and its image tokens to their counts (§8.2), positioned (§8.3), and the merger rows and
 * DeepStack features are laid out on the image and video rows in prompt order (architecture
 * §5.4: HF scatters image and video features onto one joint mask). */
#include "reference/tools/generate_vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/vision_encoder.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/vision/image.h"
#include "runtime/text/tokenizer.h"
#include "runtime/vision/preprocess.h"
#include "runtime/vision/video_preprocess.h"
#include "runtime/vision/video_prompt.h"

/* The pixel values of every image and video in prompt order, concatenated, and their grids:
 * one per image, one (1, h, w) per temporal block of a video (a video's patches are already in
 * block order, and the tower attends within each block, so t blocks of (1, h, w) encode
 * exactly as one (t, h, w) grid). */
struct gen_pixels {
    float *values; /* [patches][row_len] */
    int64_t patches, row_len;
    struct vl_grid *grids; /* [n_grids] */
    int n_grids, cap_grids;
    struct video_prompt_item *videos; /* [n_videos], timestamps owned */
    int n_videos;
};

static int load_preproc(struct vision_preproc_config *pc, const char *model_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", model_dir);
    int rc = vision_preproc_config_load(pc, path);
    if (rc == STRATA_ENOTFOUND) { /* no file: Qwen3-VL's shipped values (spec §2) */
        *pc = vision_preproc_defaults();
        return STRATA_OK;
    }
    return rc;
}

static int append_rows(struct gen_pixels *px, const float *rows, int64_t n, int64_t row_len,
                       const int64_t grid[3], int64_t blocks) {
    if (px->patches && px->row_len != row_len)
        return strata_set_error(STRATA_EINVAL,
                                "the image and video configurations make patches of %lld and "
                                "%lld values",
                                (long long)px->row_len, (long long)row_len);
    size_t old = (size_t)px->patches * (size_t)row_len, add = (size_t)n * (size_t)row_len;
    float *grown = realloc(px->values, (old + add) * sizeof(float));
    if (!grown) return strata_set_error(STRATA_ENOMEM, "out of memory for the pixel values");
    px->values = grown;
    memcpy(px->values + old, rows, add * sizeof(float));
    px->patches += n;
    px->row_len = row_len;
    if (px->n_grids + blocks > px->cap_grids) {
        int cap = px->cap_grids * 2 + (int)blocks + 8;
        struct vl_grid *g = realloc(px->grids, (size_t)cap * sizeof *g);
        if (!g) return strata_set_error(STRATA_ENOMEM, "out of memory for the grids");
        px->grids = g;
        px->cap_grids = cap;
    }
    for (int64_t b = 0; b < blocks; b++)
        px->grids[px->n_grids++] = (struct vl_grid){1, (int32_t)grid[1], (int32_t)grid[2]};
    return STRATA_OK;
}

static int append_image(struct gen_pixels *px, const struct vision_preproc_config *pc,
                        const char *file, int index) {
    struct image_rgb8 img = {0};
    struct vision_pixels one = {0};
    int rc = image_decode_file(&img, file, NULL);
    if (rc == STRATA_OK) rc = vision_preprocess(&one, pc, &img);
    image_rgb8_free(&img);
    if (rc == STRATA_OK)
        rc = append_rows(px, one.pixel_values, one.num_patches, one.row_len, one.grid_thw, 1);
    vision_pixels_free(&one);
    return rc != STRATA_OK ? strata_wrap_error(rc, "image %d (%s)", index + 1, file) : STRATA_OK;
}

static int append_video(struct gen_pixels *px, const struct vision_video_config *vc,
                        const char *file, int index) {
    char *data = NULL;
    size_t len = 0;
    struct vision_video vv = {0};
    int rc = cli_read_file(&data, &len, file);
    if (rc == STRATA_OK) rc = vision_video_load(&vv, vc, data, len, NULL);
    free(data);
    if (rc == STRATA_OK)
        rc = append_rows(px, vv.pixel_values, vv.num_patches, vv.row_len, vv.grid_thw,
                         vv.grid_thw[0]);
    if (rc == STRATA_OK) {
        const int64_t merge = vc->pp.merge_size;
        struct video_prompt_item *it = &px->videos[px->n_videos++];
        it->blocks = (int)vv.grid_thw[0];
        it->tokens_per_block = vv.grid_thw[1] * vv.grid_thw[2] / (merge * merge);
        it->timestamps = vv.timestamps; /* kept: freed with the pixels */
        vv.timestamps = NULL;
    }
    vision_video_free(&vv);
    return rc != STRATA_OK ? strata_wrap_error(rc, "video %d (%s)", index + 1, file) : STRATA_OK;
}

static void free_pixels(struct gen_pixels *px) {
    for (int i = 0; i < px->n_videos; i++)
        free((void *)px->videos[i].timestamps);
    free(px->videos);
    free(px->values);
    free(px->grids);
}

/* Every image and video token of the prompt takes the next file of its kind, in prompt order. */
static int load_files(struct gen_pixels *px, const char *model_dir, const struct model_config *cfg,
                      const int32_t *prompt, int n_prompt, const struct gen_vision_files *f) {
    int pads = 0, vpads = 0, rc = STRATA_OK;
    for (int i = 0; i < n_prompt; i++) {
        pads += prompt[i] == cfg->image_token_id;
        vpads += prompt[i] == cfg->video_token_id;
    }
    if (pads != f->n_images)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt has %d image tokens (id %d) for %d --image file(s): "
                                "give one per image",
                                pads, cfg->image_token_id, f->n_images);
    if (vpads != f->n_videos)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt has %d video tokens (id %d) for %d --video file(s): "
                                "give one per video",
                                vpads, cfg->video_token_id, f->n_videos);
    struct vision_preproc_config pc;
    struct vision_video_config vc;
    px->videos = calloc((size_t)f->n_videos + 1, sizeof *px->videos);
    if (!px->videos) return strata_set_error(STRATA_ENOMEM, "out of memory");
    if (f->n_images) rc = load_preproc(&pc, model_dir);
    if (rc == STRATA_OK && f->n_videos) rc = vision_video_config_load_dir(&vc, model_dir);
    for (int i = 0, im = 0, vi = 0; rc == STRATA_OK && i < n_prompt; i++) {
        if (prompt[i] == cfg->image_token_id) {
            rc = append_image(px, &pc, f->images[im], im);
            im++;
        } else if (prompt[i] == cfg->video_token_id) {
            rc = append_video(px, &vc, f->videos[vi], vi);
            vi++;
        }
    }
    return rc;
}

/* The videos' timestamps and blocks written into the prompt with the model's tokenizer. */
static int expand_videos(struct tokenizer_ids *out, const char *dir, const struct model_config *cfg,
                         const int32_t *prompt, int n_prompt, const struct gen_pixels *px) {
    struct tokenizer *tok = NULL;
    int rc = tokenizer_load(&tok, dir);
    if (rc) return strata_wrap_error(rc, "--video needs the model's tokenizer for the timestamps");
    struct video_prompt_ids sp = {cfg->video_token_id, cfg->vision_start_token_id,
                                  cfg->vision_end_token_id};
    rc = video_prompt_expand(out, tok, &sp, prompt, n_prompt, px->videos, px->n_videos);
    tokenizer_free(tok);
    return rc;
}

/* Expands the prompt and computes its positions and visual-row mask. */
static int assemble_prompt(struct gen_vision *v, const struct model_config *cfg,
                           const struct gen_pixels *px, const int32_t *prompt, int n_prompt) {
    struct vl_tokens tok = {cfg->image_token_id, cfg->video_token_id,
                            cfg->vision.spatial_merge_size};
    int64_t n_img;
    int rc = vl_total_image_tokens(&n_img, px->grids, px->n_grids, tok.merge);
    if (rc) return rc;
    int cap = n_prompt + (int)n_img;
    v->ids = malloc((size_t)cap * sizeof *v->ids);
    v->positions = malloc(3 * (size_t)cap * sizeof *v->positions);
    v->mask = calloc((size_t)cap, 1);
    if (!v->ids || !v->positions || !v->mask)
        return strata_set_error(STRATA_ENOMEM, "out of memory for the prompt");
    rc = vl_expand_prompt(v->ids, cap, &v->n, prompt, n_prompt, &tok, px->grids, px->n_grids);
    if (rc == STRATA_OK)
        rc =
            vl_rope_index(v->positions, &v->rope_delta, v->ids, v->n, &tok, px->grids, px->n_grids);
    for (int i = 0; rc == STRATA_OK && i < v->n; ++i) {
        v->mask[i] = v->ids[i] == tok.image_token_id || v->ids[i] == tok.video_token_id;
        v->n_video_tokens += v->ids[i] == tok.video_token_id;
    }
    v->n_image_tokens = (int)n_img;
    return rc;
}

/* deepstack [K][n][H] from the encoder's [K][n_image_tokens][H], image rows in order. */
static int spread_deepstack(struct gen_vision *v, const float *per_token, int H) {
    size_t plane = (size_t)v->n * (size_t)H;
    v->deepstack = calloc((size_t)v->num_deepstack * plane + 1, sizeof(float));
    if (!v->deepstack) return strata_set_error(STRATA_ENOMEM, "out of memory for DeepStack");
    for (int k = 0; k < v->num_deepstack; ++k) {
        int t = 0;
        for (int i = 0; i < v->n; ++i)
            if (v->mask[i])
                memcpy(v->deepstack + (size_t)k * plane + (size_t)i * H,
                       per_token + ((size_t)k * (size_t)v->n_image_tokens + (size_t)t++) * H,
                       (size_t)H * sizeof(float));
    }
    return STRATA_OK;
}

static int encode(struct gen_vision *v, const struct model_config *cfg,
                  const struct safetensors *st, const struct gen_pixels *px, int threads) {
    struct vision_encoder *enc = NULL;
    float *ds = NULL;
    int64_t(*grid)[3] = calloc((size_t)px->n_grids, sizeof *grid);
    if (!grid) return strata_set_error(STRATA_ENOMEM, "out of memory for the grids");
    for (int i = 0; i < px->n_grids; i++) {
        grid[i][0] = px->grids[i].t;
        grid[i][1] = px->grids[i].h;
        grid[i][2] = px->grids[i].w;
    }
    int rc = vision_encoder_load(&enc, cfg, st, threads);
    if (rc) {
        free(grid);
        return rc;
    }
    if (rc) return rc;
    int H = vision_encoder_out_hidden(enc);
    v->num_deepstack = vision_encoder_num_deepstack(enc);
    v->embeds = malloc(((size_t)v->n_image_tokens * (size_t)H + 1) * sizeof(float));
    ds = malloc(((size_t)v->num_deepstack * v->n_image_tokens * (size_t)H + 1) * sizeof(float));
    if (!v->embeds || !ds)
        rc = strata_set_error(STRATA_ENOMEM, "out of memory for the vision outputs");
    if (rc == STRATA_OK && px->row_len != vision_encoder_patch_dim(enc))
        rc = strata_set_error(STRATA_EINVAL,
                              "preprocessor_config.json makes patches of %lld values but the "
                              "vision tower takes %d (patch or temporal size disagree)",
                              (long long)px->row_len, vision_encoder_patch_dim(enc));
    if (rc == STRATA_OK)
        rc = vision_encoder_forward(enc, v->embeds, ds, px->values, px->patches, &grid[0][0],
                                    px->n_grids);
    if (rc == STRATA_OK) rc = spread_deepstack(v, ds, H);
    free(ds);
    free(grid);
    vision_encoder_free(enc);
    return rc;
}

int gen_vision_prepare(struct gen_vision *v, const char *model_dir, const struct model_config *cfg,
                       const struct safetensors *st, const int32_t *prompt, int n_prompt,
                       const struct gen_vision_files *files, int threads) {
    memset(v, 0, sizeof *v);
    const char *what = files->n_videos ? "--video" : "--image";
    if (!cfg->has_vision)
        return strata_set_error(STRATA_EINVAL, "%s: %s is a text-only model (%s)", what, model_dir,
                                "no vision_config in config.json");
    if (files->n_images < 0 || files->n_videos < 0 || files->n_images + files->n_videos < 1 ||
        files->n_images > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "%s: 1 to %d images", what, VL_MAX_IMAGES);
    double t0 = cli_now_sec();
    struct gen_pixels px = {0};
    struct tokenizer_ids expanded = {0};
    int rc = load_files(&px, model_dir, cfg, prompt, n_prompt, files);
    if (rc == STRATA_OK && px.n_grids > VL_MAX_IMAGES)
        rc = strata_set_error(STRATA_EINVAL,
                              "%d images and video frame blocks: at most %d per request (lower "
                              "the video's fps or max_frames)",
                              px.n_grids, VL_MAX_IMAGES);
    if (rc == STRATA_OK && px.n_videos) {
        rc = expand_videos(&expanded, files->tokenizer_dir ? files->tokenizer_dir : model_dir, cfg,
                           prompt, n_prompt, &px);
        prompt = expanded.ids;
        n_prompt = (int)expanded.n;
    }
    if (rc == STRATA_OK) rc = assemble_prompt(v, cfg, &px, prompt, n_prompt);
    if (rc == STRATA_OK) rc = encode(v, cfg, st, &px, threads);
    tokenizer_ids_free(&expanded);
    free_pixels(&px);
    v->t_encode = cli_now_sec() - t0;
    return rc;
}

void gen_vision_free(struct gen_vision *v) {
    free(v->ids);
    free(v->positions);
    free(v->mask);
    free(v->embeds);
    free(v->deepstack);
    memset(v, 0, sizeof *v);
}
