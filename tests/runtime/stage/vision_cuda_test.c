/* The CUDA vision tower (runtime/stage/vision_cuda.h) against the CPU reference encoder on the
 * qwen3_vl and qwen3_vl_moe goldens: the golden's image, and e2e's two real images encoded in
 * one call. The kernels differ from the reference by ulps (LayerNorm, GELU, expf), so each
 * tensor must be within max|a-b|/max|b| <= 1e-4 of the CPU encoder's (the bound the CPU
 * encoder meets against HF); on a device, or linked with the kernels' own source run on the
 * host (vision_cuda_cpu_test); without a device it prints "skipped:". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernels/cuda_device.h"
#include "reference/vision_encoder.h"
#include "runtime/base/status.h"
#include "runtime/stage/vision_cuda.h"
#include "tests/reference/golden_case.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

#define TOLERANCE 1e-4

static double rel_error(const float *a, const float *b, size_t n) {
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= diff)) diff = d; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > mag) mag = fabs((double)b[i]);
    }
    return mag > 0.0 ? diff / mag : diff;
}

/* Both encoders on one input; 0 when every tensor agrees. */
static int compare(struct vision_encoder *cpu, struct vision_cuda *gpu, const char *what,
                   const float *pixels, int64_t n_patches, const int64_t *grid, int n_grids) {
    int64_t tokens = 0;
    if (vision_encoder_count(cpu, grid, n_grids, NULL, &tokens)) {
        printf("FAIL %s: %s\n", what, strata_last_error());
        return 1;
    }
    const size_t per = (size_t)tokens * (size_t)vision_encoder_out_hidden(cpu);
    const size_t k = (size_t)vision_encoder_num_deepstack(cpu), all = (k + 1) * per;
    float *want = malloc(all * sizeof(float)), *got = malloc(all * sizeof(float));
    int rc = !want || !got ? STRATA_ENOMEM : 0;
    if (!rc) rc = vision_encoder_forward(cpu, want, want + per, pixels, n_patches, grid, n_grids);
    if (!rc) rc = vision_cuda_forward(gpu, got, got + per, pixels, n_patches, grid, n_grids);
    int bad = 0;
    if (rc) {
        printf("FAIL %s: %s\n", what, strata_last_error());
        bad = 1;
    }
    for (size_t t = 0; !rc && t <= k; ++t) {
        const float *a = got + t * per, *b = want + t * per;
        double err = rel_error(a, b, per);
        int ok = err <= TOLERANCE;
        printf("%s %s %s%zu: max|a-b|/max|b| = %.3g\n", ok ? "ok  " : "FAIL", what,
               t ? "deepstack " : "embeds", t ? t - 1 : 0, err);
        bad |= !ok;
    }
    free(want);
    free(got);
    return bad;
}

/* e2e: pixel_values_fast.f32 and the grids of e2e.json. */
static int check_e2e(struct vision_encoder *cpu, struct vision_cuda *gpu, const char *name) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s/e2e", test_path("tests/golden"), name);
    snprintf(path, sizeof path, "%s/e2e.json", dir);
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 16);
    size_t len = f && text ? fread(text, 1, (1 << 16) - 1, f) : 0;
    if (f) fclose(f);
    cJSON *root = len ? cJSON_ParseWithLength(text, len) : NULL;
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(root, "images");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(root, "pixel_values_shape");
    int n = cJSON_GetArraySize(images), bad = 1;
    int64_t grids[3 * 8];
    float *pixels = NULL;
    if (!root || n < 1 || n > 8 || cJSON_GetArraySize(shape) != 2) {
        printf("FAIL %s: cannot read %s\n", name, path);
        goto done;
    }
    for (int i = 0; i < n; ++i) {
        const cJSON *g =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(images, i), "grid_thw");
        for (int k = 0; k < 3; ++k)
            grids[3 * i + k] = cJSON_GetArrayItem(g, k)->valueint;
    }
    const size_t rows = (size_t)cJSON_GetArrayItem(shape, 0)->valueint;
    const size_t count = rows * (size_t)cJSON_GetArrayItem(shape, 1)->valueint;
    snprintf(path, sizeof path, "%s/pixel_values_fast.f32", dir);
    f = fopen(path, "rb");
    pixels = malloc(count * sizeof(float) + 1);
    if (!f || !pixels || fread(pixels, sizeof(float), count + 1, f) != count) {
        printf("FAIL %s: cannot read %s\n", name, path);
        if (f) fclose(f);
        goto done;
    }
    fclose(f);
    char what[128];
    snprintf(what, sizeof what, "%s/e2e (%d images, one call)", name, n);
    bad = compare(cpu, gpu, what, pixels, (int64_t)rows, grids, n);
done:
    free(pixels);
    cJSON_Delete(root);
    free(text);
    return bad;
}

static int check_case(const char *name) {
    struct golden_case gc;
    struct vision_encoder *cpu = NULL;
    struct vision_cuda *gpu = NULL;
    if (golden_case_open(&gc, name)) {
        printf("FAIL %s: %s\n", name, strata_last_error());
        return 1;
    }
    int bad = 1;
    if (vision_encoder_load(&cpu, &gc.cfg, gc.st, 2) || vision_cuda_open(&gpu, cpu, 0)) {
        printf("FAIL %s: %s\n", name, strata_last_error());
    } else {
        printf("%s: %zu weight bytes on the device\n", name, vision_cuda_weight_bytes(gpu));
        bad =
            compare(cpu, gpu, name, gc.pixel_values, gc.n_patches, gc.image_grid_thw, gc.n_images);
        bad |= check_e2e(cpu, gpu, name);
        /* A patch count the grids contradict, and a missing output, are refused. */
        float one = 0.0f;
        int refused = vision_cuda_forward(gpu, &one, &one, gc.pixel_values, gc.n_patches + 1,
                                          gc.image_grid_thw, gc.n_images) == STRATA_EINVAL &&
                      vision_cuda_forward(gpu, NULL, &one, gc.pixel_values, gc.n_patches,
                                          gc.image_grid_thw, gc.n_images) == STRATA_EINVAL;
        printf("%s %s: bad arguments refused\n", refused ? "ok  " : "FAIL", name);
        bad |= !refused;
    }
    vision_cuda_free(gpu);
    vision_encoder_free(cpu);
    golden_case_close(&gc);
    return bad;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failures = check_case("qwen3_vl") + check_case("qwen3_vl_moe");
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
