/* Image files -> vision encoder inputs and outputs for one request (see vision_encode.h). */
#include "runtime/stage/vision_encode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

static const char *format_name(int f) {
    return f == WIRE_IMAGE_PNG ? "png" : f == WIRE_IMAGE_JPEG ? "jpeg" : "unknown";
}

/* Image i's pixel values appended to *values [patches][row_len]. */
static int append_image(struct vision_frontend *fe, struct vision_output *out, float **values,
                        int64_t *patches, int64_t *row_len, const uint8_t *data, size_t len,
                        int hint) {
    struct image_rgb8 img = {0};
    struct vision_pixels one = {0};
    size_t limit = fe->max_image_bytes ? fe->max_image_bytes : VISION_DEFAULT_MAX_IMAGE_BYTES;
    if (len > limit)
        return strata_set_error(STRATA_ERANGE,
                                "the file is %zu bytes, the limit is %zu "
                                "(--max-image-bytes)",
                                len, limit);
    int found = (int)image_detect_format(data, len);
    if (hint != WIRE_IMAGE_UNKNOWN && found != IMAGE_FORMAT_UNKNOWN && hint != found)
        return strata_set_error(STRATA_EFORMAT, "the request says %s but the bytes are %s",
                                format_name(hint), format_name(found));
    double t0 = cli_now_sec();
    int rc = image_decode_memory(&img, data, len, &fe->decode);
    if (rc == 0) rc = vision_preprocess(&one, &fe->pp, &img);
    image_rgb8_free(&img);
    out->seconds_decode += cli_now_sec() - t0;
    if (rc < 0) return rc;
    size_t old = (size_t)*patches * (size_t)one.row_len;
    size_t add = (size_t)one.num_patches * (size_t)one.row_len;
    float *grown = realloc(*values, (old + add) * sizeof(float));
    if (!grown) {
        vision_pixels_free(&one);
        return strata_set_error(STRATA_ENOMEM, "out of memory for the pixel values");
    }
    *values = grown;
    memcpy(*values + old, one.pixel_values, add * sizeof(float));
    *patches += one.num_patches;
    *row_len = one.row_len;
    out->grids[out->num_images++] = (struct vl_grid){
        (int32_t)one.grid_thw[0], (int32_t)one.grid_thw[1], (int32_t)one.grid_thw[2]};
    vision_pixels_free(&one);
    return 0;
}

static int encode(struct vision_frontend *fe, struct vision_output *out, const float *values,
                  int64_t patches, int64_t row_len) {
    int64_t grid[VL_MAX_IMAGES][3], n_tokens;
    for (int i = 0; i < out->num_images; i++) {
        grid[i][0] = out->grids[i].t;
        grid[i][1] = out->grids[i].h;
        grid[i][2] = out->grids[i].w;
    }
    if (row_len != vision_encoder_patch_dim(fe->enc))
        return strata_set_error(STRATA_EINVAL,
                                "preprocessor_config.json makes patches of %lld values but the "
                                "vision tower takes %d",
                                (long long)row_len, vision_encoder_patch_dim(fe->enc));
    int rc = vision_encoder_count(fe->enc, &grid[0][0], out->num_images, NULL, &n_tokens);
    if (rc < 0) return rc;
    out->n_tokens = (int)n_tokens;
    out->hidden = vision_encoder_out_hidden(fe->enc);
    out->num_deepstack = vision_encoder_num_deepstack(fe->enc);
    size_t plane = (size_t)n_tokens * (size_t)out->hidden;
    out->embeds = malloc(plane * sizeof(float));
    out->deepstack = out->num_deepstack ? malloc(plane * out->num_deepstack * sizeof(float)) : NULL;
    if (!out->embeds || (out->num_deepstack && !out->deepstack))
        return strata_set_error(STRATA_ENOMEM, "out of memory for %lld image tokens",
                                (long long)n_tokens);
    double t0 = cli_now_sec();
    if (fe->gpu)
        rc = vision_cuda_forward(fe->gpu, out->embeds, out->deepstack, values, patches, &grid[0][0],
                                 out->num_images);
    else
        rc = vision_encoder_forward(fe->enc, out->embeds, out->deepstack, values, patches,
                                    &grid[0][0], out->num_images);
    out->seconds_encode = cli_now_sec() - t0;
    out->pixel_bytes = (size_t)patches * (size_t)row_len * sizeof(float);
    return rc;
}

int vision_frontend_encode(struct vision_frontend *fe, struct vision_output *out,
                           const struct wire_request *req) {
    float *values = NULL;
    int64_t patches = 0, row_len = 0;
    size_t offset = 0;
    int rc = 0;
    memset(out, 0, sizeof *out);
    if (req->num_image_files < 1 || req->num_image_files > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "the request has %zu images (1..%d)",
                                req->num_image_files, VL_MAX_IMAGES);
    if (req->num_images || req->vision_embeds.defined || req->deepstack.defined)
        return strata_set_error(STRATA_EINVAL,
                                "the request carries image files and encoder outputs: send one");
    for (size_t i = 0; rc == 0 && i < req->num_image_files; i++) {
        size_t len = req->image_file_sizes[i];
        int hint = req->image_formats ? req->image_formats[i] : WIRE_IMAGE_UNKNOWN;
        rc = append_image(fe, out, &values, &patches, &row_len, req->image_files + offset, len,
                          hint);
        if (rc < 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", strata_last_error());
            rc = strata_set_error(rc, "image %zu of %zu (%zu bytes): %s", i + 1,
                                  req->num_image_files, len, msg);
        }
        offset += len;
    }
    if (rc == 0) rc = encode(fe, out, values, patches, row_len);
    free(values);
    if (rc < 0) vision_output_free(out);
    return rc;
}

void vision_output_free(struct vision_output *out) {
    free(out->embeds);
    free(out->deepstack);
    memset(out, 0, sizeof *out);
}
