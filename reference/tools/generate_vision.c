/* strata-generate's image path; see generate_vision.h. The steps are those of transformers'
 * Qwen3VLProcessor + Qwen3VLModel.forward for one prompt: each file is decoded (alpha onto
 * white) and preprocessed on its own (spec qwen3-vl-preprocessing.md §3-§7), the images are
 * encoded in one vision call (their patches concatenated in prompt order, as the processor
 * batches them), the prompt's image tokens are expanded (§8.2) and positioned (§8.3), and the
 * merger rows and DeepStack features are laid out on the image rows (architecture §5.4). */
#include "reference/tools/generate_vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/vision_encoder.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/vision/image.h"
#include "runtime/vision/preprocess.h"

/* The pixel values of every image, concatenated, and their grids. */
struct gen_pixels {
    float *values; /* [patches][row_len] */
    int64_t patches, row_len;
    int64_t (*grid)[3]; /* [n_images] */
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

static int append_image(struct gen_pixels *px, const struct vision_preproc_config *pc,
                        const char *file, int index) {
    struct image_rgb8 img = {0};
    struct vision_pixels one = {0};
    int rc = image_decode_file(&img, file, NULL);
    if (rc == STRATA_OK) rc = vision_preprocess(&one, pc, &img);
    image_rgb8_free(&img);
    if (rc != STRATA_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", strata_last_error());
        return strata_set_error(rc, "image %d (%s): %s", index + 1, file, msg);
    }
    size_t old = (size_t)px->patches * (size_t)one.row_len;
    size_t add = (size_t)one.num_patches * (size_t)one.row_len;
    float *grown = realloc(px->values, (old + add) * sizeof(float));
    if (!grown) {
        vision_pixels_free(&one);
        return strata_set_error(STRATA_ENOMEM, "out of memory for image %d's pixels", index + 1);
    }
    px->values = grown;
    memcpy(px->values + old, one.pixel_values, add * sizeof(float));
    px->patches += one.num_patches;
    px->row_len = one.row_len;
    memcpy(px->grid[index], one.grid_thw, sizeof px->grid[index]);
    vision_pixels_free(&one);
    return STRATA_OK;
}

/* Expands the prompt and computes its positions and image-row mask. */
static int assemble_prompt(struct gen_vision *v, const struct model_config *cfg,
                           const struct gen_pixels *px, const int32_t *prompt, int n_prompt,
                           int n_images) {
    struct vl_grid grids[VL_MAX_IMAGES];
    for (int i = 0; i < n_images; ++i)
        grids[i] = (struct vl_grid){(int32_t)px->grid[i][0], (int32_t)px->grid[i][1],
                                    (int32_t)px->grid[i][2]};
    struct vl_tokens tok = {cfg->image_token_id, cfg->video_token_id,
                            cfg->vision.spatial_merge_size};
    int64_t n_img;
    int rc = vl_total_image_tokens(&n_img, grids, n_images, tok.merge);
    if (rc) return rc;
    int cap = n_prompt + (int)n_img;
    v->ids = malloc((size_t)cap * sizeof *v->ids);
    v->positions = malloc(3 * (size_t)cap * sizeof *v->positions);
    v->mask = calloc((size_t)cap, 1);
    if (!v->ids || !v->positions || !v->mask)
        return strata_set_error(STRATA_ENOMEM, "out of memory for the prompt");
    rc = vl_expand_prompt(v->ids, cap, &v->n, prompt, n_prompt, &tok, grids, n_images);
    if (rc == STRATA_OK)
        rc = vl_rope_index(v->positions, &v->rope_delta, v->ids, v->n, &tok, grids, n_images);
    for (int i = 0; rc == STRATA_OK && i < v->n; ++i)
        v->mask[i] = v->ids[i] == tok.image_token_id;
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
                  const struct safetensors *st, const struct gen_pixels *px, int n_images,
                  int threads) {
    struct vision_encoder *enc = NULL;
    float *ds = NULL;
    int rc = vision_encoder_load(&enc, cfg, st, threads);
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
        rc = vision_encoder_forward(enc, v->embeds, ds, px->values, px->patches, &px->grid[0][0],
                                    n_images);
    if (rc == STRATA_OK) rc = spread_deepstack(v, ds, H);
    free(ds);
    vision_encoder_free(enc);
    return rc;
}

int gen_vision_prepare(struct gen_vision *v, const char *model_dir, const struct model_config *cfg,
                       const struct safetensors *st, const int32_t *prompt, int n_prompt,
                       const char *const *images, int n_images, int threads) {
    memset(v, 0, sizeof *v);
    if (!cfg->has_vision)
        return strata_set_error(STRATA_EINVAL, "--image: %s is a text-only model (%s)", model_dir,
                                "no vision_config in config.json");
    if (n_images < 1 || n_images > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "--image: 1 to %d images", VL_MAX_IMAGES);
    double t0 = cli_now_sec();
    struct vision_preproc_config pc;
    struct gen_pixels px = {0};
    px.grid = calloc((size_t)n_images, sizeof *px.grid);
    int rc = px.grid ? load_preproc(&pc, model_dir) : strata_set_error(STRATA_ENOMEM, "oom");
    for (int i = 0; rc == STRATA_OK && i < n_images; ++i)
        rc = append_image(&px, &pc, images[i], i);
    if (rc == STRATA_OK) rc = assemble_prompt(v, cfg, &px, prompt, n_prompt, n_images);
    if (rc == STRATA_OK) rc = encode(v, cfg, st, &px, n_images, threads);
    free(px.values);
    free(px.grid);
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
