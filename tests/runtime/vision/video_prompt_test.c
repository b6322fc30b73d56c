/* The video placeholder on token ids against transformers' Qwen3VLProcessor: the golden's
 * prompt (one <|video_pad|> per video) expanded with the video's timestamps and blocks, then its
 * images expanded (runtime/model/vl_prompt), must equal HF's input_ids exactly — including the
 * MoE case, where "Video 1: " before the first timestamp makes HF's tokenizer join " <" into one
 * token. Also: a bare <|video_pad|> (no start / end around it) gets a start and an end per
 * block, as the processor's fallback writes; miscounted or already expanded prompts are refused. */
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
#include "runtime/model/vl_prompt.h"
#include "runtime/text/tokenizer.h"
#include "runtime/vision/video_preprocess.h"
#include "runtime/vision/video_prompt.h"
#include "tests/test_util.h"

static const struct video_prompt_ids SP = {501, 502, 503};

static int ids_of(const cJSON *doc, const char *key, int32_t *out, int cap) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, key);
    int n = cJSON_GetArraySize(a);
    assert_true(n <= cap);
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    return n;
}

static void check_case(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s/video", test_path("tests/golden"), name);
    snprintf(path, sizeof path, "%s/video.json", dir);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(cli_read_file(&text, &len, path), 0);
    cJSON *doc = cJSON_Parse(text);
    assert_non_null(doc);
    struct tokenizer *tok = NULL;
    if (tokenizer_load(&tok, dir)) fail_msg("%s", strata_last_error());

    static int32_t prompt[512], want[1024];
    int np = ids_of(doc, "prompt_ids", prompt, 512), nw = ids_of(doc, "expanded_ids", want, 1024);
    /* the visual items in prompt order: images first in these goldens, then the video */
    struct vl_grid grids[64];
    int n_grids = 0;
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(doc, "images");
    for (int i = 0; i < cJSON_GetArraySize(images); i++) {
        const cJSON *g =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(images, i), "grid_thw");
        grids[n_grids++] = (struct vl_grid){1, (int32_t)cJSON_GetArrayItem(g, 1)->valuedouble,
                                            (int32_t)cJSON_GetArrayItem(g, 2)->valuedouble};
    }
    const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "videos"), 0);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(v, "grid_thw");
    int t = (int)cJSON_GetArrayItem(g, 0)->valuedouble,
        h = (int)cJSON_GetArrayItem(g, 1)->valuedouble,
        w = (int)cJSON_GetArrayItem(g, 2)->valuedouble;
    const cJSON *ix = cJSON_GetObjectItemCaseSensitive(v, "indices");
    int64_t idx[64];
    int n_idx = cJSON_GetArraySize(ix);
    for (int i = 0; i < n_idx; i++)
        idx[i] = (int64_t)cJSON_GetArrayItem(ix, i)->valuedouble;
    double ts[32];
    vision_video_timestamps(ts, idx, n_idx, cJSON_GetObjectItemCaseSensitive(v, "fps")->valuedouble,
                            2);
    for (int b = 0; b < t; b++)
        grids[n_grids++] = (struct vl_grid){1, h, w};
    struct video_prompt_item item = {t, (int64_t)h * w / 4, ts};

    struct tokenizer_ids ex = {0};
    if (video_prompt_expand(&ex, tok, &SP, prompt, np, &item, 1))
        fail_msg("%s", strata_last_error());
    struct vl_tokens vt = {500, 501, 2};
    static int32_t got[1024];
    int ng = 0;
    if (vl_expand_prompt(got, 1024, &ng, ex.ids, (int)ex.n, &vt, grids, n_grids))
        fail_msg("%s", strata_last_error());
    assert_int_equal(ng, nw);
    for (int i = 0; i < nw; i++)
        if (got[i] != want[i])
            fail_msg("%s: position %d: %d, transformers %d", name, i, got[i], want[i]);
    static int32_t pos[3 * 1024];
    int delta;
    if (vl_rope_index(pos, &delta, got, ng, &vt, grids, n_grids))
        fail_msg("%s", strata_last_error());
    printf(
        "ok: %s: %d prompt ids -> %d, identical to Qwen3VLProcessor's input_ids; rope_delta %d\n",
        name, np, ng, delta);

    /* a bare pad: HF's fallback replaces the token alone, so the blocks bring start and end */
    int32_t bare[3] = {prompt[0], 501, prompt[np - 1]};
    struct tokenizer_ids b = {0};
    assert_int_equal(video_prompt_expand(&b, tok, &SP, bare, 3, &item, 1), 0);
    int starts = 0, ends = 0;
    for (size_t i = 0; i < b.n; i++) {
        starts += b.ids[i] == 502;
        ends += b.ids[i] == 503;
    }
    assert_int_equal(starts, t);
    assert_int_equal(ends, t);
    assert_int_equal(b.ids[0], prompt[0]);
    assert_int_equal(b.ids[b.n - 1], prompt[np - 1]);
    tokenizer_ids_free(&b);

    /* refusals: no video for a pad, two pads in a row */
    assert_int_equal(video_prompt_expand(&b, tok, &SP, prompt, np, &item, 0), STRATA_EINVAL);
    int32_t twice[4] = {502, 501, 501, 503};
    assert_int_equal(video_prompt_expand(&b, tok, &SP, twice, 4, &item, 1), STRATA_EINVAL);
    printf("ok: refused: %s\n", strata_last_error());
    assert_int_equal(b.n, 0);

    tokenizer_ids_free(&ex);
    tokenizer_free(tok);
    cJSON_Delete(doc);
    free(text);
}

static void test_dense(void **state) {
    (void)state;
    check_case("qwen3_vl");
}

static void test_moe_labelled(void **state) {
    (void)state;
    check_case("qwen3_vl_moe");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe_labelled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
