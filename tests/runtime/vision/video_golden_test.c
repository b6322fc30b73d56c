/* Video files -> frames -> pixel_values_videos, against what transformers' Qwen3-VL video
 * processor (torchcodec decoding, exact seek mode) made from the same committed files
 * (tools/golden/vl_video_golden.py, tests/golden/<case>/video/): the scan's frame count and
 * fps (to the last bit), the sampled indices, the decoded RGB frames BYTE FOR BYTE (an H.264
 * MP4 tagged BT.709 whose width is a multiple of 32, a VP9 WebM whose width is not: both of
 * torchcodec's conversion paths), the f32 patches byte for byte, the grid and the timestamp
 * texts. Then hostile and unsupported inputs: each refused with a status and a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/vision/video.h"
#include "runtime/vision/video_preprocess.h"
#include "tests/test_util.h"

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    if (cli_read_file(&buf, len, path)) fail_msg("%s", strata_last_error());
    return buf;
}

static int64_t json_int(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(it)) fail_msg("missing %s", k);
    return (int64_t)it->valuedouble;
}

static void check_video(const char *dir, const char *case_dir, const cJSON *vj, int index,
                        const char *pv_golden, size_t pv_len, size_t *pv_off) {
    char path[768];
    const char *file = cJSON_GetObjectItemCaseSensitive(vj, "file")->valuestring;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len;
    char *data = slurp(path, &len);

    /* the scan: frame count and fps exactly as torchcodec's metadata */
    struct video *v = NULL;
    assert_int_equal(video_open(&v, data, len, NULL), 0);
    const struct video_info *in = video_get_info(v);
    assert_int_equal(in->num_frames, json_int(vj, "num_frames"));
    double fps = cJSON_GetObjectItemCaseSensitive(vj, "fps")->valuedouble;
    if (in->fps != fps) fail_msg("%s: fps %.17g, transformers %.17g", file, in->fps, fps);

    /* the sampled indices and those frames, byte for byte */
    struct vision_video_config cfg;
    snprintf(path, sizeof path, "%s/video_preprocessor_config.json", case_dir);
    assert_int_equal(vision_video_config_load(&cfg, path), 0);
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(vj, "indices");
    int n = vision_video_sample_count(&cfg, in->num_frames, in->fps);
    assert_int_equal(n, cJSON_GetArraySize(idx));
    int64_t indices[64];
    assert_true(n <= 64);
    vision_video_sample_indices(indices, n, in->num_frames);
    for (int i = 0; i < n; i++)
        assert_int_equal(indices[i], (int64_t)cJSON_GetArrayItem(idx, i)->valuedouble);
    size_t frame = (size_t)in->width * in->height * 3;
    uint8_t *rgb = malloc(frame * n);
    assert_int_equal(video_decode_frames(v, indices, n, rgb), 0);
    char fname[64];
    snprintf(fname, sizeof fname, "frames_%d.u8", index);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    size_t flen;
    char *want = slurp(path, &flen);
    assert_int_equal(flen, frame * n);
    size_t diffs = 0;
    int maxd = 0;
    for (size_t i = 0; i < flen; i++) {
        int d = abs((int)rgb[i] - (int)(uint8_t)want[i]);
        diffs += d != 0;
        if (d > maxd) maxd = d;
    }
    if (diffs)
        fail_msg("%s: %zu of %zu frame bytes differ from torchcodec's (max %d)", file, diffs, flen,
                 maxd);
    free(want);
    free(rgb);
    video_close(v);

    /* the whole chain: patches, grid, timestamps */
    struct vision_video vv;
    assert_int_equal(vision_video_load(&vv, &cfg, data, len, NULL), 0);
    const cJSON *grid = cJSON_GetObjectItemCaseSensitive(vj, "grid_thw");
    for (int k = 0; k < 3; k++)
        assert_int_equal(vv.grid_thw[k], (int64_t)cJSON_GetArrayItem(grid, k)->valuedouble);
    size_t bytes = (size_t)vv.num_patches * (size_t)vv.row_len * sizeof(float);
    assert_true(*pv_off + bytes <= pv_len);
    if (memcmp(vv.pixel_values, pv_golden + *pv_off, bytes) != 0) {
        const float *g = (const float *)(pv_golden + *pv_off);
        size_t bad = 0, first = SIZE_MAX;
        for (size_t i = 0; i < bytes / 4; i++)
            if (vv.pixel_values[i] != g[i]) {
                if (first == SIZE_MAX) first = i;
                bad++;
            }
        fail_msg("%s: %zu of %zu pixel values differ (first at %zu: %.9g vs %.9g)", file, bad,
                 bytes / 4, first, vv.pixel_values[first], g[first]);
    }
    *pv_off += bytes;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(vj, "timestamps");
    assert_int_equal(cJSON_GetArraySize(ts), vv.grid_thw[0]);
    for (int t = 0; t < vv.grid_thw[0]; t++) {
        char text[64];
        vision_video_timestamp_text(text, sizeof text, vv.timestamps[t]);
        assert_string_equal(text, cJSON_GetArrayItem(ts, t)->valuestring);
    }
    printf("ok: %s (%s %s, %dx%d, %lld frames at %.9g fps): %d frames sampled, byte-identical "
           "to torchcodec; %lld patches byte-identical to transformers, grid [%lld, %lld, %lld]\n",
           file, vv.info.container, vv.info.codec, vv.info.width, vv.info.height,
           (long long)vv.info.num_frames, vv.info.fps, vv.n_frames, (long long)vv.num_patches,
           (long long)vv.grid_thw[0], (long long)vv.grid_thw[1], (long long)vv.grid_thw[2]);
    vision_video_free(&vv);
    free(data);
}

static void check_case(const char *name) {
    char root[256], case_dir[512], dir[600], path[768];
    snprintf(root, sizeof root, "%s", test_path("tests/golden"));
    snprintf(case_dir, sizeof case_dir, "%s/%s", root, name);
    snprintf(dir, sizeof dir, "%s/video", case_dir);
    size_t len, pv_len, off = 0;
    snprintf(path, sizeof path, "%s/video.json", dir);
    char *text = slurp(path, &len);
    cJSON *doc = cJSON_Parse(text);
    assert_non_null(doc);
    snprintf(path, sizeof path, "%s/pixel_values_videos.f32", dir);
    char *pv = slurp(path, &pv_len);
    const cJSON *videos = cJSON_GetObjectItemCaseSensitive(doc, "videos");
    for (int i = 0; i < cJSON_GetArraySize(videos); i++)
        check_video(dir, case_dir, cJSON_GetArrayItem(videos, i), i, pv, pv_len, &off);
    assert_int_equal(off, pv_len);
    free(pv);
    cJSON_Delete(doc);
    free(text);
}

static void test_dense_mp4(void **state) {
    (void)state;
    check_case("qwen3_vl");
}

static void test_moe_webm(void **state) {
    (void)state;
    check_case("qwen3_vl_moe");
}

static void expect_refused(const char *what, const void *data, size_t len, int want) {
    struct video *v = NULL;
    int rc = video_open(&v, data, len, NULL);
    if (rc == 0) { /* the header may pass: decoding must then fail */
        int64_t all[1] = {video_get_info(v)->num_frames - 1};
        uint8_t *rgb = malloc((size_t)video_get_info(v)->width * video_get_info(v)->height * 3);
        rc = video_decode_frames(v, all, 1, rgb);
        free(rgb);
        video_close(v);
    }
    if (rc == 0) fail_msg("%s: accepted", what);
    if (want && rc != want)
        fail_msg("%s: status %d, want %d (%s)", what, rc, want, strata_last_error());
    assert_true(strlen(strata_last_error()) > 0);
    printf("ok: %s refused: %s\n", what, strata_last_error());
}

static void test_hostile(void **state) {
    (void)state;
    char path[512];
    size_t len;
    snprintf(path, sizeof path, "%s/qwen3_vl/video/clip0.mp4", test_path("tests/golden"));
    char *mp4 = slurp(path, &len);
    expect_refused("empty", mp4, 0, STRATA_EFORMAT);
    expect_refused("text", "this is not a video at all, only some words", 44, STRATA_EFORMAT);
    expect_refused("truncated MP4 header", mp4, 200, STRATA_EFORMAT);
    expect_refused("MP4 cut in half", mp4, len / 2, 0);
    /* every byte of the frames flipped, the container intact */
    char *bad = malloc(len);
    memcpy(bad, mp4, len);
    for (size_t i = len / 3; i < len - 64; i += 7)
        bad[i] ^= 0x5a;
    expect_refused("MP4 with corrupt data", bad, len, 0);
    /* a frame-size limit checked from the header */
    struct video *v = NULL;
    struct video_limits lim = {.max_frame_pixels = 64 * 47};
    assert_int_equal(video_open(&v, mp4, len, &lim), STRATA_ERANGE);
    printf("ok: frame size over the limit refused: %s\n", strata_last_error());
    struct video_limits few = {.max_frames = 10};
    assert_int_equal(video_open(&v, mp4, len, &few), STRATA_ERANGE);
    printf("ok: frame count over the limit refused: %s\n", strata_last_error());
    assert_int_equal(video_detect_container(mp4, len), 1);
    free(bad);
    free(mp4);
}

/* Every codec Strata accepts decodes: the fuzz seeds (32x32, 6 frames at 6 fps) in H.264 and
 * HEVC MP4 (one full-range yuvj420p), VP8 and VP9 WebM, AV1 Matroska. The frames are checked
 * for plausibility only (these encoders have no transformers golden): the top-left pixel of
 * the first frame is near the encoded (0, 0, 0) ramp start. */
static void test_codecs(void **state) {
    (void)state;
    static const char *const files[] = {
        "h264.mp4", "h264_full_range.mp4", "hevc.mp4", "vp8.webm", "vp9.webm", "av1.mkv"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        size_t len;
        snprintf(path, sizeof path, "%s/%s", test_path("tests/runtime/vision/fuzz_corpus/video"),
                 files[i]);
        char *data = slurp(path, &len);
        struct video *v = NULL;
        if (video_open(&v, data, len, NULL)) fail_msg("%s: %s", files[i], strata_last_error());
        const struct video_info *in = video_get_info(v);
        assert_int_equal(in->num_frames, 6);
        assert_int_equal(in->width, 32);
        int64_t idx[2] = {0, 5};
        uint8_t rgb[2 * 32 * 32 * 3];
        if (video_decode_frames(v, idx, 2, rgb)) fail_msg("%s: %s", files[i], strata_last_error());
        assert_true(rgb[0] < 40 && rgb[1] < 40 && rgb[2] < 40);
        printf("ok: %s: %s %s, %lld frames at %.6g fps, decoded\n", files[i], in->container,
               in->codec, (long long)in->num_frames, in->fps);
        video_close(v);
        free(data);
    }
}

static void test_sampling_rules(void **state) {
    (void)state;
    struct vision_video_config cfg = vision_video_config_defaults();
    /* numpy.linspace(0, 9, 4).round() = [0, 3, 6, 9]; (0, 10, 4) = [0, 3.33, 6.67, 10] ->
     * [0, 3, 7, 10]; half to even: linspace(0, 5, 3) = [0, 2.5, 5] -> [0, 2, 5] */
    int64_t ix[8];
    vision_video_sample_indices(ix, 4, 10);
    assert_true(ix[0] == 0 && ix[1] == 3 && ix[2] == 6 && ix[3] == 9);
    vision_video_sample_indices(ix, 4, 11);
    assert_true(ix[0] == 0 && ix[1] == 3 && ix[2] == 7 && ix[3] == 10);
    vision_video_sample_indices(ix, 3, 6);
    assert_true(ix[0] == 0 && ix[1] == 2 && ix[2] == 5);
    /* int(total / fps * 2), clamped to [4, 768] and total */
    assert_int_equal(vision_video_sample_count(&cfg, 300, 30.0), 20);
    assert_int_equal(vision_video_sample_count(&cfg, 10, 30.0), 4);
    assert_int_equal(vision_video_sample_count(&cfg, 3, 30.0), 3);
    assert_int_equal(vision_video_sample_count(&cfg, 100000, 10.0), 768);
    /* smart_resize's refusals and the temporal rounding (t 5 -> round(2.5) * 2 = 4) */
    int64_t h, w;
    assert_int_equal(vision_video_smart_resize(&h, &w, 1, 64, 64, 2, 32, 1, 1 << 30),
                     STRATA_EINVAL);
    assert_int_equal(vision_video_smart_resize(&h, &w, 4, 31, 64, 2, 32, 1, 1 << 30),
                     STRATA_EINVAL);
    assert_int_equal(vision_video_smart_resize(&h, &w, 5, 64, 64, 2, 32, 1, 4 * 64 * 64), 0);
    assert_true(h == 64 && w == 64);
    /* timestamps: pairs of frames averaged; an odd count repeats the last; "%.1f" ties to even */
    int64_t idx[5] = {0, 4, 8, 11, 15};
    double ts[3];
    vision_video_timestamps(ts, idx, 5, 6.0, 2);
    assert_true(ts[0] == (0 / 6.0 + 4 / 6.0) / 2 && ts[2] == 15 / 6.0);
    char text[32];
    vision_video_timestamp_text(text, sizeof text, 0.25);
    assert_string_equal(text, "<0.2 seconds>");
    vision_video_timestamp_text(text, sizeof text, 0.35);
    assert_string_equal(text, "<0.3 seconds>"); /* 0.35 is 0.34999... in binary */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_mp4),      cmocka_unit_test(test_moe_webm),
        cmocka_unit_test(test_hostile),        cmocka_unit_test(test_codecs),
        cmocka_unit_test(test_sampling_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
