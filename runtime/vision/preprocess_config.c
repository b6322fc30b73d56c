/* preprocessor_config.json -> struct vision_preproc_config (spec qwen3-vl-preprocessing.md §2),
 * and video_preprocessor_config.json -> struct vision_video_config (the same fields, read as
 * the video processor reads them, plus the sampling ones).
 * Every field is optional; a present one must be valid, and the error names it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/vision/preprocess.h"
#include "runtime/vision/video_preprocess.h"

struct vision_preproc_config vision_preproc_defaults(void) {
    struct vision_preproc_config c;
    memset(&c, 0, sizeof c);
    c.min_pixels = 65536;    /* 256^2: Qwen3-VL size.shortest_edge */
    c.max_pixels = 16777216; /* 4096^2: Qwen3-VL size.longest_edge */
    c.patch_size = 16;
    c.merge_size = 2;
    c.temporal_patch_size = 2;
    for (int k = 0; k < 3; k++)
        c.image_mean[k] = c.image_std[k] = 0.5f;
    c.rescale_factor = 1.0 / 255.0;
    c.do_resize = c.do_rescale = c.do_normalize = c.do_convert_rgb = 1;
    return c;
}

static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

/* The file being parsed, for messages: preprocessor_config.json or
 * video_preprocessor_config.json (one parse at a time per thread). */
static _Thread_local const char *parsing = "preprocessor_config.json";

static int bad(const char *name, const char *what) {
    return strata_set_error(STRATA_EFORMAT, "%s: \"%s\" %s", parsing, name, what);
}

/* An integer in [lo, hi]; absent leaves *out alone. */
static int get_int64(int64_t *out, const cJSON *obj, const char *name, int64_t lo, int64_t hi) {
    const cJSON *it = field(obj, name);
    if (!it) return STRATA_OK;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || v != floor(v) || v < (double)lo || v > (double)hi)
        return bad(name, "must be a positive integer in range");
    *out = (int64_t)v;
    return STRATA_OK;
}

static int get_int(int *out, const cJSON *obj, const char *name) {
    int64_t v = *out;
    int rc = get_int64(&v, obj, name, 1, 1024);
    *out = (int)v;
    return rc;
}

static int get_bool(int *out, const cJSON *obj, const char *name) {
    const cJSON *it = field(obj, name);
    if (!it) return STRATA_OK;
    if (!cJSON_IsBool(it)) return bad(name, "must be true or false");
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return STRATA_OK;
}

/* A list of 3 numbers, or one number for all channels (as HF accepts). */
static int get_triple(float out[3], const cJSON *obj, const char *name, int nonzero) {
    const cJSON *it = field(obj, name);
    if (!it) return STRATA_OK;
    double v[3];
    if (cJSON_IsNumber(it)) {
        v[0] = v[1] = v[2] = it->valuedouble;
    } else {
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 3)
            return bad(name, "must be a list of 3 numbers");
        for (int k = 0; k < 3; k++) {
            const cJSON *e = cJSON_GetArrayItem(it, k);
            if (!cJSON_IsNumber(e)) return bad(name, "must be a list of 3 numbers");
            v[k] = e->valuedouble;
        }
    }
    for (int k = 0; k < 3; k++) {
        if (!isfinite(v[k]) || (nonzero && v[k] == 0.0)) return bad(name, "has an invalid value");
        out[k] = (float)v[k]; /* HF builds an f32 tensor from the Python floats (§6) */
    }
    return STRATA_OK;
}

/* size.{shortest_edge,longest_edge}, then top-level min_pixels/max_pixels overwrite (§2) for
 * images; the video processor knows only `size`, and needs both of its keys. */
static int get_pixel_budget(struct vision_preproc_config *cfg, const cJSON *root, int video) {
    const int64_t hi = (int64_t)1 << 40;
    const cJSON *size = field(root, "size");
    int rc = STRATA_OK;
    if (size) {
        if (!cJSON_IsObject(size)) return bad("size", "must be an object");
        if (video && (!field(size, "shortest_edge") || !field(size, "longest_edge")))
            return bad("size", "must contain \"shortest_edge\" and \"longest_edge\"");
        if (!field(size, "shortest_edge") && !field(root, "min_pixels"))
            return bad("size", "needs \"shortest_edge\" (or a top-level \"min_pixels\")");
        if (!field(size, "longest_edge") && !field(root, "max_pixels"))
            return bad("size", "needs \"longest_edge\" (or a top-level \"max_pixels\")");
        rc = get_int64(&cfg->min_pixels, size, "shortest_edge", 1, hi);
        if (rc == STRATA_OK) rc = get_int64(&cfg->max_pixels, size, "longest_edge", 1, hi);
    }
    if (rc == STRATA_OK && !video) rc = get_int64(&cfg->min_pixels, root, "min_pixels", 1, hi);
    if (rc == STRATA_OK && !video) rc = get_int64(&cfg->max_pixels, root, "max_pixels", 1, hi);
    if (rc == STRATA_OK && cfg->min_pixels > cfg->max_pixels)
        return bad("size", "has shortest_edge (min pixels) above longest_edge (max pixels)");
    return rc;
}

static int parse_fields(struct vision_preproc_config *cfg, const cJSON *root, int video) {
    int rc = get_pixel_budget(cfg, root, video);
    if (rc == STRATA_OK) rc = get_int(&cfg->patch_size, root, "patch_size");
    if (rc == STRATA_OK) rc = get_int(&cfg->merge_size, root, "merge_size");
    if (rc == STRATA_OK) rc = get_int(&cfg->temporal_patch_size, root, "temporal_patch_size");
    if (rc == STRATA_OK) rc = get_triple(cfg->image_mean, root, "image_mean", 0);
    if (rc == STRATA_OK) rc = get_triple(cfg->image_std, root, "image_std", 1);
    if (rc == STRATA_OK) rc = get_bool(&cfg->do_resize, root, "do_resize");
    if (rc == STRATA_OK) rc = get_bool(&cfg->do_rescale, root, "do_rescale");
    if (rc == STRATA_OK) rc = get_bool(&cfg->do_normalize, root, "do_normalize");
    if (rc == STRATA_OK) rc = get_bool(&cfg->do_convert_rgb, root, "do_convert_rgb");
    if (rc != STRATA_OK) return rc;
    const cJSON *rf = field(root, "rescale_factor");
    if (rf) {
        if (!cJSON_IsNumber(rf) || !(rf->valuedouble > 0.0) || !isfinite(rf->valuedouble))
            return bad("rescale_factor", "must be a positive number");
        cfg->rescale_factor = rf->valuedouble;
    }
    int64_t resample = 3;
    rc = get_int64(&resample, root, "resample", 0, 5);
    if (rc == STRATA_OK && resample != 3)
        return bad("resample", "is not 3 (bicubic), the only filter implemented");
    return rc;
}

int vision_preproc_config_parse(struct vision_preproc_config *cfg, const char *json, size_t len) {
    *cfg = vision_preproc_defaults();
    parsing = "preprocessor_config.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return strata_set_error(STRATA_EFORMAT, "preprocessor_config.json: not a JSON object");
    }
    int rc = parse_fields(cfg, root, 0);
    cJSON_Delete(root);
    return rc;
}

struct vision_video_config vision_video_config_defaults(void) {
    struct vision_video_config c;
    memset(&c, 0, sizeof c);
    c.pp = vision_preproc_defaults();
    c.pp.min_pixels = 128 * 32 * 32; /* Qwen3VLVideoProcessor.size */
    c.pp.max_pixels = 32 * 32 * 768;
    c.fps = 2.0;
    c.min_frames = 4;
    c.max_frames = 768;
    c.do_sample_frames = 1;
    return c;
}

static int parse_video_fields(struct vision_video_config *cfg, const cJSON *root) {
    int rc = parse_fields(&cfg->pp, root, 1);
    int64_t lo = cfg->min_frames, hi = cfg->max_frames;
    if (rc == STRATA_OK) rc = get_int64(&lo, root, "min_frames", 1, 1 << 20);
    if (rc == STRATA_OK) rc = get_int64(&hi, root, "max_frames", 1, 1 << 20);
    if (rc == STRATA_OK) rc = get_bool(&cfg->do_sample_frames, root, "do_sample_frames");
    if (rc != STRATA_OK) return rc;
    cfg->min_frames = (int)lo;
    cfg->max_frames = (int)hi;
    const cJSON *fps = field(root, "fps");
    if (fps) {
        if (!cJSON_IsNumber(fps) || !(fps->valuedouble > 0.0) || fps->valuedouble > 1e6)
            return bad("fps", "must be a positive number");
        cfg->fps = fps->valuedouble;
    }
    if (field(root, "num_frames"))
        return bad("num_frames", "is set: sampling a fixed frame count is not implemented "
                                 "(fps sampling is)");
    return STRATA_OK;
}

int vision_video_config_parse(struct vision_video_config *cfg, const char *json, size_t len) {
    *cfg = vision_video_config_defaults();
    parsing = "video_preprocessor_config.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    int rc = root && cJSON_IsObject(root)
                 ? parse_video_fields(cfg, root)
                 : strata_set_error(STRATA_EFORMAT, "video_preprocessor_config.json: not a JSON "
                                                    "object");
    cJSON_Delete(root);
    parsing = "preprocessor_config.json";
    return rc;
}

static int load_with(void *cfg, const char *path, int video) {
    char *text = NULL;
    size_t len = 0;
    int rc = cli_read_file(&text, &len, path);
    if (rc != STRATA_OK) return rc;
    rc = video ? vision_video_config_parse(cfg, text, len)
               : vision_preproc_config_parse(cfg, text, len);
    free(text);
    return rc != STRATA_OK ? strata_wrap_error(rc, "%s", path) : STRATA_OK;
}

int vision_video_config_load(struct vision_video_config *cfg, const char *path) {
    return load_with(cfg, path, 1);
}

int vision_preproc_config_load(struct vision_preproc_config *cfg, const char *path) {
    return load_with(cfg, path, 0);
}

int vision_video_config_load_dir(struct vision_video_config *cfg, const char *model_dir) {
    /* transformers' order: video_preprocessor_config.json, then preprocessor_config.json */
    static const char *const names[] = {"video_preprocessor_config.json",
                                        "preprocessor_config.json"};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", model_dir, names[i]);
        int rc = vision_video_config_load(cfg, path);
        if (rc != STRATA_ENOTFOUND) return rc;
    }
    *cfg = vision_video_config_defaults();
    return STRATA_OK;
}
