/* Image files -> vision encoder inputs and outputs for one request (see vision_encode.h). */
#include "runtime/stage/vision_encode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/vision/video_prompt.h"

static const char *format_name(int f) {
    static const char *const names[] = {"unknown", "png", "jpeg", "mp4", "webm"};
    return f >= 0 && f <= WIRE_IMAGE_WEBM ? names[f] : "unknown";
}

static int is_video_format(int f) {
    return f == WIRE_IMAGE_MP4 || f == WIRE_IMAGE_WEBM;
}

/* The format the bytes name: PNG / JPEG by image_detect_format, MP4 / WebM by their container
 * magic (a Matroska file counts as WebM here; the demuxer is the same). */
static int detect_format(const uint8_t *data, size_t len) {
    int image = (int)image_detect_format(data, len);
    if (image == IMAGE_FORMAT_PNG) return WIRE_IMAGE_PNG;
    if (image == IMAGE_FORMAT_JPEG) return WIRE_IMAGE_JPEG;
    int video = video_detect_container(data, len);
    return video == 1 ? WIRE_IMAGE_MP4 : video == 2 ? WIRE_IMAGE_WEBM : WIRE_IMAGE_UNKNOWN;
}

static int append_rows(struct vision_output *out, float **values, int64_t *patches,
                       int64_t *row_len, const float *rows, int64_t n, int64_t len,
                       const int64_t grid[3], int64_t blocks) {
    if (*patches && *row_len != len)
        return strata_set_error(STRATA_EINVAL,
                                "preprocessor_config.json and video_preprocessor_config.json make "
                                "patches of %lld and %lld values",
                                (long long)*row_len, (long long)len);
    if (out->num_images + blocks > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL,
                                "more than %d images and video frame blocks in one request (lower "
                                "the video's fps or max_frames)",
                                VL_MAX_IMAGES);
    size_t old = (size_t)*patches * (size_t)len, add = (size_t)n * (size_t)len;
    float *grown = realloc(*values, (old + add) * sizeof(float));
    if (!grown) return strata_set_error(STRATA_ENOMEM, "out of memory for the pixel values");
    *values = grown;
    memcpy(*values + old, rows, add * sizeof(float));
    *patches += n;
    *row_len = len;
    for (int64_t b = 0; b < blocks; b++)
        out->grids[out->num_images++] = (struct vl_grid){1, (int32_t)grid[1], (int32_t)grid[2]};
    return 0;
}

/* Image i's pixel values appended to *values [patches][row_len]. */
static int append_image(struct vision_frontend *fe, struct vision_output *out, float **values,
                        int64_t *patches, int64_t *row_len, const uint8_t *data, size_t len) {
    struct image_rgb8 img = {0};
    struct vision_pixels one = {0};
    size_t limit = fe->max_image_bytes ? fe->max_image_bytes : VISION_DEFAULT_MAX_IMAGE_BYTES;
    if (len > limit)
        return strata_set_error(STRATA_ERANGE,
                                "the file is %zu bytes, the limit is %zu "
                                "(--max-image-bytes)",
                                len, limit);
    double t0 = cli_now_sec();
    int rc = image_decode_memory(&img, data, len, &fe->decode);
    if (rc == 0) rc = vision_preprocess(&one, &fe->pp, &img);
    image_rgb8_free(&img);
    out->seconds_decode += cli_now_sec() - t0;
    if (rc == 0)
        rc = append_rows(out, values, patches, row_len, one.pixel_values, one.num_patches,
                         one.row_len, one.grid_thw, 1);
    vision_pixels_free(&one);
    return rc;
}

/* A video's pixel values appended, one grid per temporal block, and its prompt item. */
static int append_video(struct vision_frontend *fe, struct vision_output *out, float **values,
                        int64_t *patches, int64_t *row_len, const uint8_t *data, size_t len,
                        struct video_prompt_item *item) {
    size_t limit = fe->max_video_bytes ? fe->max_video_bytes : VISION_DEFAULT_MAX_VIDEO_BYTES;
    if (len > limit)
        return strata_set_error(STRATA_ERANGE,
                                "the file is %zu bytes, the limit is %zu (--max-video-bytes)", len,
                                limit);
    if (!fe->tok)
        return strata_set_error(STRATA_EINVAL,
                                "this vision stage has no tokenizer for a video's timestamp text "
                                "(MODEL_DIR/tokenizer.json or --tokenizer DIR)");
    struct vision_video vv;
    double t0 = cli_now_sec();
    int rc = vision_video_load(&vv, &fe->vpp, data, len, &fe->video);
    out->seconds_decode += cli_now_sec() - t0;
    if (rc) return rc;
    rc = append_rows(out, values, patches, row_len, vv.pixel_values, vv.num_patches, vv.row_len,
                     vv.grid_thw, vv.grid_thw[0]);
    if (rc == 0) {
        const int64_t merge = fe->vpp.pp.merge_size;
        item->blocks = (int)vv.grid_thw[0];
        item->tokens_per_block = vv.grid_thw[1] * vv.grid_thw[2] / (merge * merge);
        item->timestamps = vv.timestamps; /* the caller frees it */
        vv.timestamps = NULL;
        out->num_videos++;
    }
    vision_video_free(&vv);
    return rc;
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

/* The i-th media file must be of the kind of the prompt's i-th image or video pad; a file whose
 * kind neither the request nor its bytes tell takes the token's (its decoder then says what is
 * wrong with it). Sets video[i]. */
static int check_order(const struct vision_frontend *fe, const struct wire_request *req,
                       const int *kinds, uint8_t *video) {
    size_t k = 0;
    for (size_t i = 0; i < req->prompt_len; i++) {
        int is_video = req->prompt[i] == fe->video_token_id;
        if (req->prompt[i] != fe->image_token_id && !is_video) continue;
        if (is_video && i + 1 < req->prompt_len && req->prompt[i + 1] == fe->video_token_id)
            return strata_set_error(STRATA_EINVAL,
                                    "prompt position %zu: video tokens in a row; send ONE "
                                    "<|video_pad|> per video file, the vision stage expands it",
                                    i + 1);
        if (k == req->num_image_files) {
            k++;
            break;
        }
        if (kinds[k] != WIRE_IMAGE_UNKNOWN && is_video != is_video_format(kinds[k]))
            return strata_set_error(
                STRATA_EINVAL,
                "file %zu is %s but the prompt's token for it (position %zu) is "
                "%s token",
                k + 1, is_video ? "an image" : "a video", i, is_video ? "a video" : "an image");
        video[k++] = (uint8_t)is_video;
    }
    if (k != req->num_image_files)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt has %s image and video tokens than the request has "
                                "files (%zu): one token per file, in order",
                                k > req->num_image_files ? "more" : "fewer", req->num_image_files);
    return 0;
}

static int expand_prompt(const struct vision_frontend *fe, struct vision_output *out,
                         const struct wire_request *req, const struct video_prompt_item *items) {
    struct tokenizer_ids ids = {0};
    struct video_prompt_ids sp = {fe->video_token_id, fe->vision_start_token_id,
                                  fe->vision_end_token_id};
    int rc = video_prompt_expand(&ids, fe->tok, &sp, req->prompt, (int)req->prompt_len, items,
                                 out->num_videos);
    if (rc) {
        tokenizer_ids_free(&ids);
        return rc;
    }
    out->prompt = ids.ids;
    out->prompt_len = ids.n;
    return 0;
}

int vision_frontend_encode(struct vision_frontend *fe, struct vision_output *out,
                           const struct wire_request *req) {
    float *values = NULL;
    int64_t patches = 0, row_len = 0;
    size_t offset = 0;
    int rc = 0, kinds[VL_MAX_IMAGES];
    uint8_t is_video[VL_MAX_IMAGES];
    struct video_prompt_item *items = NULL;
    memset(out, 0, sizeof *out);
    if (req->num_image_files < 1 || req->num_image_files > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "the request has %zu files (1..%d)",
                                req->num_image_files, VL_MAX_IMAGES);
    if (req->num_images || req->vision_embeds.defined || req->deepstack.defined)
        return strata_set_error(STRATA_EINVAL,
                                "the request carries image files and encoder outputs: send one");
    for (size_t i = 0; rc == 0 && i < req->num_image_files; i++) {
        size_t len = req->image_file_sizes[i];
        int hint = req->image_formats ? req->image_formats[i] : WIRE_IMAGE_UNKNOWN;
        int found = detect_format(req->image_files + offset, len);
        if (hint != WIRE_IMAGE_UNKNOWN && found != WIRE_IMAGE_UNKNOWN && hint != found)
            rc = strata_set_error(STRATA_EFORMAT,
                                  "file %zu: the request says %s but the bytes are %s", i + 1,
                                  format_name(hint), format_name(found));
        kinds[i] = hint != WIRE_IMAGE_UNKNOWN ? hint : found;
        offset += len;
    }
    if (rc == 0) rc = check_order(fe, req, kinds, is_video);
    if (rc == 0 && !(items = calloc(req->num_image_files, sizeof *items)))
        rc = strata_set_error(STRATA_ENOMEM, "out of memory");
    offset = 0;
    for (size_t i = 0; rc == 0 && i < req->num_image_files; i++) {
        size_t len = req->image_file_sizes[i];
        const uint8_t *data = req->image_files + offset;
        int video = is_video[i];
        rc = video ? append_video(fe, out, &values, &patches, &row_len, data, len,
                                  &items[out->num_videos])
                   : append_image(fe, out, &values, &patches, &row_len, data, len);
        if (rc < 0)
            rc = strata_wrap_error(rc, "%s %zu of %zu (%zu bytes)", video ? "video" : "image",
                                   i + 1, req->num_image_files, len);
        offset += len;
    }
    if (rc == 0 && out->num_videos) rc = expand_prompt(fe, out, req, items);
    if (rc == 0) rc = encode(fe, out, values, patches, row_len);
    for (int v = 0; items && v < out->num_videos; v++)
        free((void *)items[v].timestamps);
    free(items);
    free(values);
    if (rc < 0) vision_output_free(out);
    return rc;
}

void vision_output_free(struct vision_output *out) {
    free(out->prompt);
    free(out->embeds);
    free(out->deepstack);
    memset(out, 0, sizeof *out);
}
