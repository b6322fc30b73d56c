/* A VL golden's vision inputs for strata-sim (see sim_vision.h). */
#include "sim/sim_vision.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

/* DIR/NAME as `count` f32 values (malloc'd into *out). */
static int read_f32(float **out, const char *dir, const char *name, size_t count) {
    char path[4200], *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = cli_read_file(&data, &len, path);
    if (rc < 0) return rc;
    if (len != count * sizeof(float)) {
        free(data);
        return strata_set_error(STRATA_EFORMAT, "%s has %zu bytes, the grids and model need %zu",
                                path, len, count * sizeof(float));
    }
    *out = (float *)data;
    return 0;
}

/* golden.json vision.image_grid_thw: [[t, h, w], ...]; returns the count or -1. */
static int read_grids(struct vl_grid *grids, const cJSON *vision) {
    const cJSON *thw = cJSON_GetObjectItemCaseSensitive(vision, "image_grid_thw"), *row;
    int n = 0;
    if (!cJSON_IsArray(thw)) return -1;
    cJSON_ArrayForEach(row, thw) {
        if (n >= VL_MAX_IMAGES || cJSON_GetArraySize(row) != 3) return -1;
        grids[n++] = (struct vl_grid){cJSON_GetArrayItem(row, 0)->valueint,
                                      cJSON_GetArrayItem(row, 1)->valueint,
                                      cJSON_GetArrayItem(row, 2)->valueint};
    }
    return n;
}

int sim_vision_load(struct sim_vision *v, const char *dir, const struct model_config *cfg) {
    char path[4200], *text = NULL;
    size_t len = 0;
    int64_t n_img = 0;
    int rc, n, H = cfg->hidden_size, K = cfg->vision.num_deepstack;
    memset(v, 0, sizeof *v);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (!cfg->has_vision || cli_read_file(&text, &len, path) < 0) return 0;
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *vision = root ? cJSON_GetObjectItemCaseSensitive(root, "vision") : NULL;
    free(text);
    if (!vision) {
        cJSON_Delete(root);
        return 0;
    }
    n = read_grids(v->grids, vision);
    cJSON_Delete(root);
    if (n < 1) return strata_set_error(STRATA_EFORMAT, "%s: bad vision.image_grid_thw", path);
    rc = vl_total_image_tokens(&n_img, v->grids, n, cfg->vision.spatial_merge_size);
    if (rc == 0) rc = read_f32(&v->embeds, dir, "vision_embeds.f32", (size_t)n_img * H);
    if (rc == 0 && K) rc = read_f32(&v->deepstack, dir, "deepstack.f32", (size_t)K * n_img * H);
    if (rc < 0) {
        sim_vision_free(v);
        return rc;
    }
    v->have = 1;
    v->vision = (struct request_vision){.grids = v->grids,
                                        .num_images = n,
                                        .n_image_tokens = (int)n_img,
                                        .hidden_size = H,
                                        .embeds = v->embeds,
                                        .num_deepstack = K,
                                        .deepstack = v->deepstack};
    return 0;
}

void sim_vision_free(struct sim_vision *v) {
    free(v->embeds);
    free(v->deepstack);
    memset(v, 0, sizeof *v);
}
