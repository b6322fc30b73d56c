/* Fixture reader for tests/golden (see golden_case.h). golden.json is parsed with cJSON;
 * logits.f32 is read raw (little-endian float32, the only byte order we build for). */
#include "tests/reference/golden_case.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "tests/test_util.h"

const char *const golden_case_names[] = {
    "qwen3_gqa_tied",    "qwen3_mha_untied", "qwen3_deep8",  "qwen3_moe", "qwen3_moe_nonorm",
    "qwen3_long_prompt", "qwen3_vl",         "qwen3_vl_moe", NULL,
};

static int read_file(char **out, size_t *len, const char *path) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return strata_set_error(STRATA_EIO, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return strata_set_error(STRATA_EIO, "cannot read %s", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return STRATA_OK;
}

static int int_array(int32_t **out, int *n, const cJSON *root, const char *key) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsArray(arr))
        return strata_set_error(STRATA_EFORMAT, "golden.json: no array %s", key);
    *n = cJSON_GetArraySize(arr);
    *out = calloc((size_t)(*n ? *n : 1), sizeof **out);
    if (!*out) return strata_set_error(STRATA_ENOMEM, "out of memory");
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, arr)(*out)[i++] = (int32_t)item->valueint;
    return STRATA_OK;
}

/* Reads a float32 file of exactly `count` values. */
static int read_floats(float **out, const char *dir, const char *file, size_t count) {
    char path[4200], *raw = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = read_file(&raw, &len, path);
    if (rc) return rc;
    if (len != count * sizeof(float)) {
        free(raw);
        return strata_set_error(STRATA_EFORMAT, "%s: %zu bytes, want %zu", path, len,
                                count * sizeof(float));
    }
    *out = (float *)raw;
    return STRATA_OK;
}

/* The vision tower's input: pixel_values.f32 [pixel_values_shape] and image_grid_thw. */
static int read_pixels(struct golden_case *gc, const cJSON *vision, const char *dir) {
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(vision, "pixel_values_shape");
    const cJSON *grid = cJSON_GetObjectItemCaseSensitive(vision, "image_grid_thw");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 2 || !cJSON_IsArray(grid) ||
        cJSON_GetArraySize(grid) < 1)
        return strata_set_error(STRATA_EFORMAT,
                                "%s/golden.json: no pixel_values_shape / image_grid_thw", dir);
    gc->n_patches = cJSON_GetArrayItem(shape, 0)->valueint;
    gc->patch_dim = cJSON_GetArrayItem(shape, 1)->valueint;
    gc->n_images = cJSON_GetArraySize(grid);
    gc->image_grid_thw = calloc(3 * (size_t)gc->n_images, sizeof *gc->image_grid_thw);
    if (!gc->image_grid_thw) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int i = 0; i < gc->n_images; ++i) {
        const cJSON *row = cJSON_GetArrayItem(grid, i);
        if (cJSON_GetArraySize(row) != 3)
            return strata_set_error(STRATA_EFORMAT, "%s/golden.json: image_grid_thw row %d", dir,
                                    i);
        for (int k = 0; k < 3; ++k)
            gc->image_grid_thw[3 * i + k] = cJSON_GetArrayItem(row, k)->valueint;
    }
    return read_floats(&gc->pixel_values, dir, "pixel_values.f32",
                       (size_t)gc->n_patches * (size_t)gc->patch_dim);
}

static int read_vision(struct golden_case *gc, const cJSON *vision, const char *dir) {
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(vision, "position_ids");
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(vision, "rope_delta");
    const cJSON *image = cJSON_GetObjectItemCaseSensitive(vision, "image_token_id");
    const cJSON *ds_shape = cJSON_GetObjectItemCaseSensitive(vision, "deepstack_shape");
    if (!cJSON_IsArray(pos) || cJSON_GetArraySize(pos) != 3 || !cJSON_IsNumber(delta) ||
        !cJSON_IsNumber(image) || !cJSON_IsArray(ds_shape) || cJSON_GetArraySize(ds_shape) != 3)
        return strata_set_error(STRATA_EFORMAT, "%s/golden.json: incomplete \"vision\" object",
                                dir);
    gc->has_vision = 1;
    gc->rope_delta = delta->valueint;
    gc->image_token_id = image->valueint;
    gc->position_ids = calloc(3 * (size_t)gc->n_prompt, sizeof *gc->position_ids);
    if (!gc->position_ids) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int r = 0; r < 3; ++r) {
        const cJSON *row = cJSON_GetArrayItem(pos, r);
        if (cJSON_GetArraySize(row) != gc->n_prompt)
            return strata_set_error(
                STRATA_EFORMAT, "%s/golden.json: position_ids row %d has the wrong length", dir, r);
        for (int i = 0; i < gc->n_prompt; ++i)
            gc->position_ids[r * gc->n_prompt + i] = cJSON_GetArrayItem(row, i)->valueint;
    }
    for (int i = 0; i < gc->n_prompt; ++i)
        gc->n_visual += gc->prompt[i] == gc->image_token_id;
    gc->num_deepstack = cJSON_GetArrayItem(ds_shape, 0)->valueint;
    size_t H = (size_t)gc->cfg.hidden_size, nv = (size_t)gc->n_visual;
    int rc = read_floats(&gc->vision_embeds, dir, "vision_embeds.f32", nv * H);
    if (!rc)
        rc = read_floats(&gc->deepstack, dir, "deepstack.f32", (size_t)gc->num_deepstack * nv * H);
    if (!rc) rc = read_pixels(gc, vision, dir);
    return rc;
}

int golden_case_open(struct golden_case *gc, const char *name) {
    memset(gc, 0, sizeof *gc);
    snprintf(gc->name, sizeof gc->name, "%s", name);
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden"));
    size_t dl = strlen(dir);
    snprintf(dir + dl, sizeof dir - dl, "/%s", name);
    int rc;
    char *text = NULL, *raw = NULL;
    size_t len = 0, raw_len = 0;
    cJSON *root = NULL;
    if ((rc = model_config_load(&gc->cfg, dir))) goto fail;
    if ((rc = safetensors_open(&gc->st, dir))) goto fail;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if ((rc = read_file(&text, &len, path))) goto fail;
    root = cJSON_ParseWithLength(text, len);
    if (!root) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: not JSON", path);
        goto fail;
    }
    if ((rc = int_array(&gc->prompt, &gc->n_prompt, root, "prompt_ids"))) goto fail;
    if ((rc = int_array(&gc->generated, &gc->n_steps, root, "generated_ids"))) goto fail;
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    if ((rc = read_file(&raw, &raw_len, path))) goto fail;
    size_t want = (size_t)gc->n_steps * (size_t)gc->cfg.vocab_size * sizeof(float);
    if (raw_len != want) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: %zu bytes, want %zu", path, raw_len, want);
        goto fail;
    }
    gc->logits = (float *)raw;
    raw = NULL;
    const cJSON *vision = cJSON_GetObjectItemCaseSensitive(root, "vision");
    if (vision && (rc = read_vision(gc, vision, dir))) goto fail;
    cJSON_Delete(root);
    free(text);
    return STRATA_OK;
fail:
    cJSON_Delete(root);
    free(text);
    free(raw);
    golden_case_close(gc);
    return rc;
}

void golden_case_close(struct golden_case *gc) {
    safetensors_close(gc->st);
    free(gc->prompt);
    free(gc->generated);
    free(gc->logits);
    free(gc->position_ids);
    free(gc->vision_embeds);
    free(gc->deepstack);
    free(gc->pixel_values);
    free(gc->image_grid_thw);
    memset(gc, 0, sizeof *gc);
}

int golden_model(struct reference_model **out, const struct golden_case *gc, int start, int end,
                 int with_embed, int with_head, int threads) {
    return golden_model_dtype(out, gc, start, end, with_embed, with_head, threads,
                              REFERENCE_WEIGHTS_STORED);
}

int golden_sequence(const struct golden_case *gc, int32_t *out, int n) {
    if (n > gc->n_prompt + gc->n_steps) return STRATA_ERANGE;
    for (int i = 0; i < n; ++i)
        out[i] = i < gc->n_prompt ? gc->prompt[i] : gc->generated[i - gc->n_prompt];
    return STRATA_OK;
}

int golden_model_dtype(struct reference_model **out, const struct golden_case *gc, int start,
                       int end, int with_embed, int with_head, int threads,
                       enum reference_weights_dtype dtype) {
    struct reference_load_options opt = {.layer_start = start,
                                         .layer_end = end,
                                         .with_embed = with_embed,
                                         .with_head = with_head,
                                         .num_threads = threads,
                                         .weights_dtype = dtype};
    return reference_model_load(out, &gc->cfg, gc->st, &opt);
}
