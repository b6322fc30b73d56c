/* Qwen3-VL prompt assembly on token ids (see vl_prompt.h; spec qwen3-vl-preprocessing.md §8). */
#include "runtime/model/vl_prompt.h"

#include <stdint.h>

#include "runtime/base/status.h"

int vl_image_tokens(int64_t *out, const struct vl_grid *g, int merge, int index) {
    *out = 0;
    if (merge < 1) return strata_set_error(STRATA_EINVAL, "spatial merge size %d < 1", merge);
    if (g->t != 1)
        return strata_set_error(STRATA_EINVAL,
                                "image %d has grid t = %d: only images (t = 1) are supported",
                                index, g->t);
    if (g->h < merge || g->w < merge || g->h % merge || g->w % merge)
        return strata_set_error(STRATA_EINVAL,
                                "image %d grid (%d, %d, %d): h and w must be positive multiples "
                                "of the merge size %d",
                                index, g->t, g->h, g->w, merge);
    int64_t n = (int64_t)g->t * (g->h / merge) * (g->w / merge);
    if (n > INT32_MAX)
        return strata_set_error(STRATA_EINVAL, "image %d grid (%d, %d, %d) has too many tokens",
                                index, g->t, g->h, g->w);
    *out = n;
    return 0;
}

int vl_total_image_tokens(int64_t *out, const struct vl_grid *grids, int n_images, int merge) {
    int64_t total = 0;
    *out = 0;
    if (n_images < 0 || n_images > VL_MAX_IMAGES)
        return strata_set_error(STRATA_EINVAL, "%d images (at most %d per request)", n_images,
                                VL_MAX_IMAGES);
    for (int i = 0; i < n_images; i++) {
        int64_t n;
        int rc = vl_image_tokens(&n, &grids[i], merge, i);
        if (rc < 0) return rc;
        total += n;
    }
    *out = total;
    return 0;
}

/* Runs of video tokens in ids [n]: each is one temporal block of a video, already expanded
 * (the processor writes timestamps between the blocks, which needs the tokenizer; see
 * runtime/vision/video_prompt.h). */
static int count_video_runs(const int32_t *ids, int n, int32_t video) {
    int runs = 0;
    for (int i = 0; i < n; i++)
        runs += ids[i] == video && (i == 0 || ids[i - 1] != video);
    return runs;
}

int vl_expand_prompt(int32_t *out, int out_cap, int *out_len, const int32_t *ids, int n,
                     const struct vl_tokens *tok, const struct vl_grid *grids, int n_images) {
    int64_t total, len; /* total: only the grids' check */
    int pads = 0, rc, img = 0;
    *out_len = 0;
    rc = vl_total_image_tokens(&total, grids, n_images, tok->merge);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++)
        pads += ids[i] == tok->image_token_id;
    const int runs = count_video_runs(ids, n, tok->video_token_id);
    /* The processor requires one <|image_pad|> per image (spec §8.2). */
    if (pads + runs != n_images) {
        if (runs == 0)
            return strata_set_error(STRATA_EINVAL,
                                    "the prompt has %d image tokens (id %d) for %d image(s): "
                                    "expected one per image before expansion",
                                    pads, tok->image_token_id, n_images);
        return strata_set_error(STRATA_EINVAL,
                                "the prompt has %d image tokens and %d video frame blocks for %d "
                                "grid(s): expected one image token per image and one run of video "
                                "tokens per frame block",
                                pads, runs, n_images);
    }
    len = (int64_t)n;
    for (int i = 0, g = 0; i < n; i++) {
        int64_t count;
        if (ids[i] == tok->image_token_id) {
            vl_image_tokens(&count, &grids[g], tok->merge, g);
            g++;
            len += count - 1;
        } else if (ids[i] == tok->video_token_id && (i == 0 || ids[i - 1] != tok->video_token_id)) {
            int run = 0;
            while (i + run < n && ids[i + run] == tok->video_token_id)
                run++;
            vl_image_tokens(&count, &grids[g], tok->merge, g);
            if (run != count)
                return strata_set_error(STRATA_EINVAL,
                                        "video frame block %d at prompt position %d has %d video "
                                        "tokens, its grid (%d, %d, %d) needs %lld",
                                        g, i, run, grids[g].t, grids[g].h, grids[g].w,
                                        (long long)count);
            g++;
        }
    }
    (void)total;
    if (len > INT32_MAX)
        return strata_set_error(STRATA_ERANGE, "the expanded prompt is too long (%lld tokens)",
                                (long long)len);
    *out_len = (int)len;
    if (len > out_cap)
        return strata_set_error(STRATA_ERANGE, "the expanded prompt has %lld tokens, room for %d",
                                (long long)len, out_cap);
    for (int i = 0, o = 0; i < n; i++) {
        if (ids[i] == tok->video_token_id && (i == 0 || ids[i - 1] != tok->video_token_id))
            img++; /* a video block's grid, already expanded */
        if (ids[i] != tok->image_token_id) {
            out[o++] = ids[i];
            continue;
        }
        int64_t count;
        vl_image_tokens(&count, &grids[img], tok->merge, img);
        img++;
        for (int64_t k = 0; k < count; k++)
            out[o++] = tok->image_token_id;
    }
    return 0;
}

/* Positions of one image of llm grid (gh, gw) starting at position `start` (spec §8.3:
 * t = start, h = start + row, w = start + column, row-major). */
static void image_positions(int32_t *positions, int n, int at, int64_t start, int gh, int gw) {
    for (int r = 0, i = at; r < gh; r++)
        for (int c = 0; c < gw; c++, i++) {
            positions[i] = (int32_t)start;
            positions[n + i] = (int32_t)(start + r);
            positions[2 * n + i] = (int32_t)(start + c);
        }
}

int vl_rope_index(int32_t *positions, int *rope_delta, const int32_t *ids, int n,
                  const struct vl_tokens *tok, const struct vl_grid *grids, int n_images) {
    int64_t pos = 0, max_pos = -1;
    int img = 0, i = 0;
    *rope_delta = 0;
    while (i < n) {
        /* A run of video tokens is one temporal block of a video: get_rope_index splits
         * video_grid_thw into t grids of t = 1 and places each block as an image. */
        const int32_t pad = ids[i];
        const int video = pad == tok->video_token_id;
        if (pad != tok->image_token_id && !video) {
            positions[i] = positions[n + i] = positions[2 * n + i] = (int32_t)pos;
            if (pos > max_pos) max_pos = pos;
            pos++;
            i++;
            continue;
        }
        int run = 0;
        while (i + run < n && ids[i + run] == pad)
            run++;
        if (img >= n_images)
            return strata_set_error(STRATA_EINVAL,
                                    "prompt position %d starts %s %d, but the request has %d "
                                    "image grid(s)",
                                    i, video ? "visual item (a video frame block)" : "image",
                                    img + 1, n_images);
        int64_t count;
        int rc = vl_image_tokens(&count, &grids[img], tok->merge, img);
        if (rc < 0) return rc;
        if (run != count)
            return strata_set_error(STRATA_EINVAL,
                                    "%s %d at prompt position %d has %d %s tokens, its grid "
                                    "(%d, %d, %d) needs %lld",
                                    video ? "video frame block" : "image", img, i, run,
                                    video ? "video" : "image", grids[img].t, grids[img].h,
                                    grids[img].w, (long long)count);
        int gh = grids[img].h / tok->merge, gw = grids[img].w / tok->merge;
        image_positions(positions, n, i, pos, gh, gw);
        if (pos + (gh > gw ? gh : gw) - 1 > max_pos) max_pos = pos + (gh > gw ? gh : gw) - 1;
        pos += gh > gw ? gh : gw;
        if (pos > INT32_MAX)
            return strata_set_error(STRATA_ERANGE, "prompt positions exceed int32");
        i += run;
        img++;
    }
    if (img != n_images)
        return strata_set_error(STRATA_EINVAL,
                                "the prompt holds %d image(s) but the request has %d image grids",
                                img, n_images);
    *rope_delta = (int)(max_pos + 1 - n);
    return 0;
}

void vl_decode_positions(int32_t *positions, int n, int cache_index, int rope_delta) {
    for (int i = 0; i < n; i++)
        positions[i] = positions[n + i] = positions[2 * n + i] = cache_index + i + rope_delta;
}
