/* strata-bench-vision: throughput of the CPU reference vision encoder (reference/
 * vision_encoder.h). Writes the vision tower of a Qwen3-VL-2B-shaped checkpoint with random
 * bf16 weights (depth 24, hidden 1024, MLP 4096, 16 heads, patch 16, merge 2, temporal 2,
 * out 2048, 48x48 position grid, DeepStack after blocks 5, 11, 17: the spec's figures for the
 * 2B, marked unverified there) to a temporary directory, then encodes random pixel_values of
 * --image W x H (default 448 x 448: a 28 x 28 patch grid, 196 merged tokens) at each thread
 * count. Prints the median ms per image, images/s and the achieved GFLOP/s (counted from the
 * shapes: every matmul, Q·K^T and P·V), and checks that every thread count gave the same bits.
 * With --video FILE the input is a real video instead: decoded, sampled and preprocessed as
 * transformers' Qwen3-VL video processor does (runtime/vision/video_preprocess.h, timed), each
 * temporal patch encoded as one grid, and the rows add ms per second of video and video
 * tokens per second of video. Not a test: nothing is asserted beyond that check. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reference/ops.h"
#include "reference/tools/random_checkpoint.h"
#include "reference/vision_encoder.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/vision/video_preprocess.h"

/* The text side is only there to make a valid config; its tensors are never written. */
static const char *const config_json =
    "{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"model_type\": \"qwen3_vl\",\n"
    " \"text_config\": {\"vocab_size\": 151936, \"hidden_size\": 2048, \"intermediate_size\": "
    "6144,\n"
    "   \"num_hidden_layers\": 28, \"num_attention_heads\": 16, \"num_key_value_heads\": 8,\n"
    "   \"head_dim\": 128, \"rope_scaling\": {\"rope_type\": \"default\", \"mrope_section\": "
    "[24, 20, 20]}},\n"
    " \"vision_config\": {\"depth\": 24, \"hidden_size\": 1024, \"intermediate_size\": 4096,\n"
    "   \"num_heads\": 16, \"in_channels\": 3, \"patch_size\": 16, \"spatial_merge_size\": 2,\n"
    "   \"temporal_patch_size\": 2, \"out_hidden_size\": 2048, \"num_position_embeddings\": "
    "2304,\n"
    "   \"deepstack_visual_indexes\": [5, 11, 17], \"hidden_act\": \"gelu_pytorch_tanh\"},\n"
    " \"tie_word_embeddings\": true}\n";

struct bench_args {
    int thread_list[16], n_threads, width, height, images, repeat, keep;
    const char *model;
    const char *video, *video_config; /* --video FILE [--video-config JSON] */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata-bench-vision [--threads LIST] [--image WxH] [--images N] [--repeat R]\n"
            "                           [--model DIR] [--keep]\n"
            "\n"
            "Images/s and ms per image of the CPU reference vision encoder on a\n"
            "Qwen3-VL-2B-shaped random bf16 vision tower (written to a temporary directory).\n"
            "\n"
            "  --threads LIST   thread counts to measure (default 1,2)\n"
            "  --image WxH      image size in pixels, multiples of 32 (default 448x448)\n"
            "  --images N       images per encoder call (default 1)\n"
            "  --repeat R       timed calls per thread count; the median is printed (default 3)\n"
            "  --model DIR      use this checkpoint's vision tower instead of writing one\n"
            "  --video FILE     encode this video (MP4 / WebM) instead of random images: decode,\n"
            "                   sample and preprocess timed as well; prints ms per second of\n"
            "                   video and video tokens per second of video\n"
            "  --video-config F video_preprocessor_config.json for --video (default:\n"
            "                   Qwen3VLVideoProcessor's class defaults, 2 frames per second)\n"
            "  --keep           keep the written checkpoint (its path is printed)\n"
            "  -h, --help       this text\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model.\n");
}

static int parse_threads(struct bench_args *a, const char *text) {
    char *end;
    a->n_threads = 0;
    for (const char *p = text; *p && a->n_threads < 16;) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || (*end && *end != ',')) return -1;
        a->thread_list[a->n_threads++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return a->n_threads ? 0 : -1;
}

static int parse_image(struct bench_args *a, const char *text) {
    char *end;
    long w = strtol(text, &end, 10);
    if (end == text || *end != 'x') return -1;
    const char *h_text = end + 1;
    long h = strtol(h_text, &end, 10);
    if (end == h_text || *end || w < 32 || h < 32 || w > 8192 || h > 8192 || w % 32 || h % 32)
        return -1;
    a->width = (int)w;
    a->height = (int)h;
    return 0;
}

/* Returns -1 to go on, else the exit code (--help or a bad command line). */
static int parse_args(struct bench_args *a, int argc, char **argv) {
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'}, {"image", required_argument, 0, 'i'},
        {"images", required_argument, 0, 'n'},  {"repeat", required_argument, 0, 'r'},
        {"model", required_argument, 0, 'm'},   {"keep", no_argument, 0, 'k'},
        {"video", required_argument, 0, 'v'},   {"video-config", required_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    *a = (struct bench_args){{1, 2}, 2, 448, 448, 1, 3, 0, NULL, NULL, NULL};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 't': bad = parse_threads(a, optarg) ? "--threads wants a list like 1,2" : NULL; break;
        case 'i': bad = parse_image(a, optarg) ? "--image wants WxH, multiples of 32" : NULL; break;
        case 'n':
            bad = cli_parse_int(optarg, 1, 64, &a->images) ? "--images wants 1..64" : NULL;
            break;
        case 'r':
            bad = cli_parse_int(optarg, 1, 100, &a->repeat) ? "--repeat wants 1..100" : NULL;
            break;
        case 'm': a->model = optarg; break;
        case 'k': a->keep = 1; break;
        case 'v': a->video = optarg; break;
        case 'c': a->video_config = optarg; break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr, "strata-bench-vision: %s\n", bad);
            return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* config.json, then exactly the vision tensors the manifest lists. */
static int write_checkpoint(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = cli_write_file_atomic(path, config_json, strlen(config_json));
    struct model_config cfg;
    struct stage_tensor_list list = {0};
    struct stage_role vision = {0, 0, 0, 0, 1};
    if (!rc) rc = model_config_load(&cfg, dir);
    if (!rc) rc = stage_tensor_list_build(&list, &cfg, &vision, NULL);
    if (!rc) rc = random_checkpoint_write(dir, &list, 0x7151);
    stage_tensor_list_free(&list);
    return rc;
}

/* Multiply-adds x 2 of one call, from the shapes (spec §6): patch embed, per block the qkv,
 * proj and MLP matmuls plus Q·K^T and P·V over each frame, and the 1 + K mergers. */
static double flops_per_call(const struct vision_config *v, double patches, double frame,
                             int images) {
    const double Hv = v->hidden_size, Iv = v->intermediate_size,
                 m2 = v->spatial_merge_size * v->spatial_merge_size;
    const double P =
        (double)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    const double Hm = Hv * m2, O = v->out_hidden_size, T = patches / m2;
    double block =
        2.0 * patches * (4.0 * Hv * Hv + 2.0 * Hv * Iv) + 4.0 * (double)images * frame * frame * Hv;
    double merger = 2.0 * T * (Hm * Hm + Hm * O);
    return 2.0 * patches * P * Hv + v->depth * block + (1 + v->num_deepstack) * merger;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per-call inputs and outputs for one shape. */
struct bench_io {
    float *pixels;
    float *embeds, *deepstack; /* one buffer: [tokens, O] then [K, tokens, O] */
    float *first;              /* the first thread count's outputs */
    int64_t *grids, patches, tokens;
    size_t out_floats; /* embeds + deepstack */
};

/* One table row: load at `threads`, one warm call, `repeat` timed calls. */
static int bench_row(const struct model_config *cfg, const struct safetensors *st, int threads,
                     struct bench_io *io, const struct bench_args *a, int row, double *call_sec) {
    struct vision_encoder *enc = NULL;
    int rc = vision_encoder_load(&enc, cfg, st, threads);
    double t[100];
    for (int r = -1; !rc && r < a->repeat; ++r) {
        double t0 = cli_now_sec();
        rc = vision_encoder_forward(enc, io->embeds, io->deepstack, io->pixels, io->patches,
                                    io->grids, a->images);
        if (r >= 0) t[r] = cli_now_sec() - t0;
    }
    if (!rc) {
        qsort(t, (size_t)a->repeat, sizeof *t, cmp_double);
        double sec = t[a->repeat / 2] / a->images;
        *call_sec = t[a->repeat / 2];
        double frame = (double)io->patches / a->images;
        double gflop = flops_per_call(&cfg->vision, (double)io->patches, frame, a->images) / 1e9;
        int same = 1;
        if (row == 0)
            memcpy(io->first, io->embeds, io->out_floats * sizeof(float));
        else
            same = memcmp(io->first, io->embeds, io->out_floats * sizeof(float)) == 0;
        printf("%7d %12.1f %10.3f %14.1f %10.1f %16s\n", threads, 1e3 * sec, 1.0 / sec,
               gflop / a->images, gflop / a->images / sec,
               row == 0 ? "(reference)"
               : same   ? "yes"
                        : "NO");
        fflush(stdout);
        if (!same) rc = strata_set_error(STRATA_EINVAL, "outputs differ at %d threads", threads);
    }
    vision_encoder_free(enc);
    return rc;
}

static void io_free(struct bench_io *io) {
    free(io->pixels);
    free(io->embeds);
    free(io->first);
    free(io->grids);
}

/* Buffers for `patches` patches of `grids` grids (1, gh, gw). */
static int io_alloc(struct bench_io *io, const struct model_config *cfg, int64_t patches, int grids,
                    int64_t gh, int64_t gw) {
    const struct vision_config *v = &cfg->vision;
    const size_t P = (size_t)v->in_channels * (size_t)v->temporal_patch_size *
                     (size_t)v->patch_size * (size_t)v->patch_size;
    memset(io, 0, sizeof *io);
    io->patches = patches;
    io->tokens = io->patches / (v->spatial_merge_size * v->spatial_merge_size);
    io->out_floats =
        (size_t)io->tokens * (size_t)v->out_hidden_size * (1 + (size_t)v->num_deepstack);
    io->grids = malloc(3 * (size_t)grids * sizeof *io->grids);
    io->pixels = malloc((size_t)io->patches * P * sizeof(float));
    io->embeds = malloc(io->out_floats * sizeof(float));
    io->first = malloc(io->out_floats * sizeof(float));
    if (!io->grids || !io->pixels || !io->embeds || !io->first) {
        io_free(io);
        return strata_set_error(STRATA_ENOMEM, "out of memory for %lld patches",
                                (long long)io->patches);
    }
    io->deepstack = io->embeds + (size_t)io->tokens * (size_t)v->out_hidden_size;
    for (int i = 0; i < grids; ++i) {
        io->grids[3 * i] = 1;
        io->grids[3 * i + 1] = gh;
        io->grids[3 * i + 2] = gw;
    }
    return STRATA_OK;
}

/* Random pixel_values in [-1, 1) (the normalised range) for `images` W x H images. */
static int io_init(struct bench_io *io, const struct model_config *cfg,
                   const struct bench_args *a) {
    const struct vision_config *v = &cfg->vision;
    const int64_t gh = a->height / v->patch_size, gw = a->width / v->patch_size;
    const size_t P = (size_t)v->in_channels * (size_t)v->temporal_patch_size *
                     (size_t)v->patch_size * (size_t)v->patch_size;
    int rc = io_alloc(io, cfg, (int64_t)a->images * gh * gw, a->images, gh, gw);
    if (rc) return rc;
    uint64_t rng = 0x1a2b3c;
    for (size_t i = 0; i < (size_t)io->patches * P; ++i) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        io->pixels[i] = (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
    }
    return STRATA_OK;
}

/* The video's pixel values, decoded, sampled and preprocessed `repeat` times (the median time
 * goes to *prep_sec); each temporal patch becomes one grid (a->images is set to their count). */
static int io_init_video(struct bench_io *io, const struct model_config *cfg, struct bench_args *a,
                         struct vision_video *vv, double *prep_sec) {
    const struct vision_config *v = &cfg->vision;
    struct vision_video_config vc = vision_video_config_defaults();
    char *data = NULL;
    size_t len = 0;
    double t[100];
    int rc = a->video_config ? vision_video_config_load(&vc, a->video_config) : STRATA_OK;
    if (!rc) rc = cli_read_file(&data, &len, a->video);
    for (int r = 0; !rc && r < a->repeat; ++r) {
        if (r) vision_video_free(vv);
        double t0 = cli_now_sec();
        rc = vision_video_load(vv, &vc, data, len, NULL);
        t[r] = cli_now_sec() - t0;
    }
    free(data);
    if (rc) return rc;
    qsort(t, (size_t)a->repeat, sizeof *t, cmp_double);
    *prep_sec = t[a->repeat / 2];
    const int64_t P =
        (int64_t)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    if (vv->row_len != P)
        return strata_set_error(STRATA_EINVAL,
                                "the video config makes patches of %lld values, the tower takes "
                                "%lld",
                                (long long)vv->row_len, (long long)P);
    a->images = (int)vv->grid_thw[0];
    rc = io_alloc(io, cfg, vv->num_patches, a->images, vv->grid_thw[1], vv->grid_thw[2]);
    if (rc) return rc;
    memcpy(io->pixels, vv->pixel_values, (size_t)io->patches * (size_t)P * sizeof(float));
    a->width = vv->resized_w;
    a->height = vv->resized_h;
    return STRATA_OK;
}

/* Loads the checkpoint's vision tower config and prints the table; returns the exit code. */
static int run(const char *dir, struct bench_args *a) {
    struct model_config cfg;
    struct safetensors *st = NULL;
    struct bench_io io = {0};
    struct vision_video vv = {0};
    double prep = 0, seconds = 0;
    if (model_config_load(&cfg, dir) || safetensors_open(&st, dir)) {
        fprintf(stderr, "strata-bench-vision: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    int exit_code = STRATA_EXIT_FAILURE;
    if (a->video ? io_init_video(&io, &cfg, a, &vv, &prep) : io_init(&io, &cfg, a)) goto done;
    if (a->video) {
        seconds = vv.info.end_seconds - vv.info.begin_seconds;
        printf("video: %s (%s %s, %dx%d, %lld frames, %.3f fps, %.2f s): %d frames sampled, "
               "resized to %dx%d, grid [%lld, %lld, %lld]; decode + sample + preprocess "
               "%.1f ms (median of %d)\n",
               a->video, vv.info.container, vv.info.codec, vv.info.width, vv.info.height,
               (long long)vv.info.num_frames, vv.info.fps, seconds, vv.n_frames, vv.resized_w,
               vv.resized_h, (long long)vv.grid_thw[0], (long long)vv.grid_thw[1],
               (long long)vv.grid_thw[2], 1e3 * prep, a->repeat);
    }
    const struct vision_config *v = &cfg.vision;
    printf("vision tower: depth %d, hidden %d, MLP %d, %d heads, patch %d, merge %d, out %d, "
           "DeepStack %d\n",
           v->depth, v->hidden_size, v->intermediate_size, v->num_heads, v->patch_size,
           v->spatial_merge_size, v->out_hidden_size, v->num_deepstack);
    printf("input: %d %s of %dx%d per call = %lld patches, %lld merged tokens\n", a->images,
           a->video ? "temporal patch(es)" : "image(s)", a->width, a->height, (long long)io.patches,
           (long long)io.tokens);
    printf("cpu: %ld online cores; matmul path %s\n", sysconf(_SC_NPROCESSORS_ONLN),
           ops_path_name(ops_matmul_path()));
    printf("%7s %12s %10s %14s %10s %16s\n", "threads", "ms/image", "images/s", "GFLOP/image",
           "GFLOP/s", "same bits as 1st");
    double call[16];
    for (int i = 0; i < a->n_threads; ++i)
        if (bench_row(&cfg, st, a->thread_list[i], &io, a, i, &call[i])) goto done;
    for (int i = 0; a->video && seconds > 0 && i < a->n_threads; ++i)
        printf("video at %d thread(s): %.1f ms per second of video (preprocess %.1f + encode "
               "%.1f ms for %.2f s), %.1f video tokens per second of video, %.2fx real time\n",
               a->thread_list[i], 1e3 * (prep + call[i]) / seconds, 1e3 * prep, 1e3 * call[i],
               seconds, (double)io.tokens / seconds, seconds / (prep + call[i]));
    exit_code = STRATA_EXIT_OK;
done:
    if (exit_code != STRATA_EXIT_OK)
        fprintf(stderr, "strata-bench-vision: %s\n", strata_last_error());
    io_free(&io);
    vision_video_free(&vv);
    safetensors_close(st);
    return exit_code;
}

int main(int argc, char **argv) {
    const char *cwd = getenv("BUILD_WORKING_DIRECTORY"); /* under `bazel run` */
    if (cwd && *cwd && chdir(cwd) != 0) fprintf(stderr, "warning: cannot chdir to %s\n", cwd);
    struct bench_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    char dir[4096];
    int wrote = 0;
    if (a.model) {
        snprintf(dir, sizeof dir, "%s", a.model);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/strata-bench-vision-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "strata-bench-vision: mkdtemp %s: %s\n", dir, strerror(errno));
            return STRATA_EXIT_FAILURE;
        }
        fprintf(stderr, "writing a Qwen3-VL-2B-shaped random bf16 vision tower to %s ...\n", dir);
        wrote = 1;
        if (write_checkpoint(dir)) {
            fprintf(stderr, "strata-bench-vision: %s\n", strata_last_error());
            random_checkpoint_remove(dir);
            return STRATA_EXIT_FAILURE;
        }
    }
    rc = run(dir, &a);
    if (wrote && a.keep) printf("checkpoint kept at %s\n", dir);
    if (wrote && !a.keep) random_checkpoint_remove(dir);
    return rc;
}
