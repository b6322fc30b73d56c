/* strata-generate: one process, end to end, on the CPU reference decoder. Loads a Hugging
 * Face checkpoint directory (config.json + safetensors), prefills the prompt ids, samples up
 * to --max-tokens new ids (greedy by default), and prints them with prefill and decode
 * throughput. Tokenisation is out of scope: ids in, ids out. With --image (Qwen3-VL), each
 * image token of the prompt stands for one image file, which goes through HF's default
 * image processor and the vision encoder (generate_vision.c); --out writes the tokens and
 * every step's logits in strata-stage's --out format. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/sampler.h"
#include "reference/tools/generate_vision.h"
#include "runtime/base/cli.h"
#include "runtime/base/progress_printer.h"
#include "runtime/base/status.h"
#include "runtime/model/generation_file.h"
#include "runtime/model/model_config.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/model/safetensors.h"

#define MAX_IDS 65536
#define MAX_IMAGES 64

static void usage(FILE *f) {
    fprintf(f, "usage: strata-generate --model DIR --prompt-ids 1,2,3 --max-tokens N [options]\n"
               "\n"
               "Runs the CPU reference decoder (Qwen3 / Qwen3-MoE / Qwen3-VL) on token ids.\n"
               "\n"
               "  --model DIR          checkpoint directory: config.json + model.safetensors\n"
               "                       (or a sharded model.safetensors.index.json)\n"
               "  --prompt-ids LIST    comma-separated prompt token ids (at least one)\n"
               "  --max-tokens N       new tokens to generate (>= 1)\n"
               "  --threads T          matmul threads (default 1); results do not depend on T\n"
               "  --weights-dtype D    bf16 (default: the matrices as stored) or q8 (8-bit blocks\n"
               "                       quantised at load; other logits, see reference/ops_q8.h)\n"
               "  --temperature F      0 (default) = greedy argmax\n"
               "  --top-k K            keep the K most likely tokens (0 = off)\n"
               "  --top-p P            nucleus cut in (0, 1] (1 = off)\n"
               "  --seed S             sampling seed (default 0)\n"
               "  --stop-ids LIST      extra stop token ids (the config's eos ids always stop)\n"
               "  --ignore-eos         do not stop at the config's eos ids\n"
               "  --image FILE         (Qwen3-VL, repeatable) a PNG or JPEG for the next image\n"
               "                       token of the prompt: give ONE image_token_id per image\n"
               "                       (<|vision_start|><|image_pad|><|vision_end|>); it is\n"
               "                       expanded to the image's merged-token count as HF's\n"
               "                       processor does. Pixels follow HF's default (fast)\n"
               "                       processor with DIR/preprocessor_config.json; alpha is\n"
               "                       composited onto white; EXIF orientation is NOT applied\n"
               "                       (transformers does not apply it to image objects)\n"
               "  --video FILE         (Qwen3-VL, repeatable) an MP4 or WebM (H.264, HEVC, VP8,\n"
               "                       VP9, AV1) for the next video token of the prompt: give\n"
               "                       ONE video_token_id per video, as the chat template\n"
               "                       writes it (<|vision_start|><|video_pad|><|vision_end|>);\n"
               "                       frames are sampled, resized and patched as HF's video\n"
               "                       processor does with DIR/video_preprocessor_config.json,\n"
               "                       and the prompt gets \"<t seconds>\" and a vision block\n"
               "                       per temporal patch, tokenized with the model's tokenizer\n"
               "  --tokenizer DIR      where tokenizer.json is for --video (default: the model)\n"
               "  --out FILE           write tokens I32 [n] and logits F32 [n, V] (safetensors,\n"
               "                       as strata-stage --out)\n"
               "  -h, --help           this text\n"
               "\n"
               "Output (stdout): the generated ids on one line, then prefill and decode speed.\n"
               "Loading progress goes to stderr when it is a terminal or the load takes over 2 s;\n"
               "STRATA_PROGRESS=1 always shows it, STRATA_PROGRESS=0 never.\n"
               "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model or input.\n");
}

static int parse_long(long *out, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_float(float *out, const char *s) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || v != v) return -1;
    *out = v;
    return 0;
}

/* "1,2,3" -> ids; returns the count or -1. */
static int parse_ids(int32_t *ids, int cap, const char *s) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < INT32_MIN || v > INT32_MAX || n == cap) return -1;
        ids[n++] = (int32_t)v;
        if (*end == ',')
            p = end + 1;
        else if (*end == 0)
            p = end;
        else
            return -1;
    }
    return n;
}

/* "12.3 MiB" or "4.5 KiB" into buf. */
static const char *human(char *buf, size_t cap, size_t bytes) {
    if (bytes >= ((size_t)1 << 20))
        snprintf(buf, cap, "%.1f MiB", (double)bytes / 1048576.0);
    else
        snprintf(buf, cap, "%.1f KiB", (double)bytes / 1024.0);
    return buf;
}

struct args {
    const char *model;
    int32_t prompt[MAX_IDS];
    int n_prompt;
    int32_t stop[64];
    int n_stop;
    long max_tokens;
    long threads;
    enum reference_weights_dtype weights_dtype;
    struct sampler_params sampling;
    int ignore_eos;
    const char *images[MAX_IMAGES];
    int n_images;
    const char *videos[MAX_IMAGES];
    int n_videos;
    const char *tokenizer;
    const char *out;
};

/* Applies one getopt option to *a. Returns 0, -1 for --help, or the exit code. */
static int parse_option(struct args *a, int c, const char *arg) {
    long v;
    switch (c) {
    case 'm': a->model = arg; break;
    case 'p':
        if ((a->n_prompt = parse_ids(a->prompt, MAX_IDS, arg)) < 0) {
            fprintf(stderr,
                    "strata-generate: --prompt-ids wants comma-separated integers, got \"%s\"\n",
                    arg);
            return STRATA_EXIT_USAGE;
        }
        break;
    case 'n':
        if (parse_long(&a->max_tokens, arg, 1, 1 << 20)) {
            fprintf(stderr, "strata-generate: --max-tokens wants an integer in [1, %d]\n", 1 << 20);
            return STRATA_EXIT_USAGE;
        }
        break;
    case 't':
        if (parse_long(&a->threads, arg, 1, 256)) {
            fprintf(stderr, "strata-generate: --threads wants an integer in [1, 256]\n");
            return STRATA_EXIT_USAGE;
        }
        break;
    case 'T':
        if (parse_float(&a->sampling.temperature, arg) || a->sampling.temperature < 0) {
            fprintf(stderr, "strata-generate: --temperature wants a number >= 0\n");
            return STRATA_EXIT_USAGE;
        }
        break;
    case 'k':
        if (parse_long(&v, arg, 0, INT_MAX)) {
            fprintf(stderr, "strata-generate: --top-k wants an integer >= 0\n");
            return STRATA_EXIT_USAGE;
        }
        a->sampling.top_k = (int)v;
        break;
    case 'P':
        if (parse_float(&a->sampling.top_p, arg) || a->sampling.top_p <= 0 ||
            a->sampling.top_p > 1) {
            fprintf(stderr, "strata-generate: --top-p wants a number in (0, 1]\n");
            return STRATA_EXIT_USAGE;
        }
        break;
    case 's':
        if (parse_long(&v, arg, 0, LONG_MAX)) {
            fprintf(stderr, "strata-generate: --seed wants an integer >= 0\n");
            return STRATA_EXIT_USAGE;
        }
        a->sampling.seed = (uint64_t)v;
        break;
    case 'S':
        if ((a->n_stop = parse_ids(a->stop, 64, arg)) < 0) {
            fprintf(stderr,
                    "strata-generate: --stop-ids wants up to 64 comma-separated integers\n");
            return STRATA_EXIT_USAGE;
        }
        break;
    case 'E': a->ignore_eos = 1; break;
    case 'I':
        if (a->n_images == MAX_IMAGES) {
            fprintf(stderr, "strata-generate: at most %d --image files\n", MAX_IMAGES);
            return STRATA_EXIT_USAGE;
        }
        a->images[a->n_images++] = arg;
        break;
    case 'V':
        if (a->n_videos == MAX_IMAGES) {
            fprintf(stderr, "strata-generate: at most %d --video files\n", MAX_IMAGES);
            return STRATA_EXIT_USAGE;
        }
        a->videos[a->n_videos++] = arg;
        break;
    case 'K': a->tokenizer = arg; break;
    case 'o': a->out = arg; break;
    case 'W':
        if (reference_weights_dtype_parse(&a->weights_dtype, arg)) {
            fprintf(stderr, "strata-generate: --weights-dtype: %s\n", strata_last_error());
            return STRATA_EXIT_USAGE;
        }
        break;
    case 'h': usage(stdout); return -1;
    default: usage(stderr); return STRATA_EXIT_USAGE;
    }
    return 0;
}

static int parse_args(struct args *a, int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt-ids", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"temperature", required_argument, 0, 'T'},
        {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},
        {"seed", required_argument, 0, 's'},
        {"stop-ids", required_argument, 0, 'S'},
        {"ignore-eos", no_argument, 0, 'E'},
        {"image", required_argument, 0, 'I'},
        {"video", required_argument, 0, 'V'},
        {"tokenizer", required_argument, 0, 'K'},
        {"out", required_argument, 0, 'o'},
        {"weights-dtype", required_argument, 0, 'W'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof *a);
    a->threads = 1;
    a->max_tokens = -1;
    a->n_prompt = -1;
    a->sampling.top_p = 1.0f;
    int c, rc;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1)
        if ((rc = parse_option(a, c, optarg)) != 0) return rc;
    if (optind < argc) {
        fprintf(stderr, "strata-generate: unexpected argument \"%s\"\n", argv[optind]);
        return STRATA_EXIT_USAGE;
    }
    if (!a->model || a->n_prompt < 0 || a->max_tokens < 0) {
        fprintf(
            stderr,
            "strata-generate: --model, --prompt-ids and --max-tokens are required (see --help)\n");
        return STRATA_EXIT_USAGE;
    }
    if (a->n_prompt == 0) {
        fprintf(stderr, "strata-generate: the prompt is empty; give at least one token id\n");
        return STRATA_EXIT_INPUT;
    }
    return 0;
}

static int is_stop(const struct args *a, const struct model_config *cfg, int token) {
    for (int i = 0; i < a->n_stop; ++i)
        if (a->stop[i] == token) return 1;
    if (!a->ignore_eos)
        for (int i = 0; i < cfg->num_eos_token_ids; ++i)
            if (cfg->eos_token_ids[i] == token) return 1;
    return 0;
}

/* The loaded model and everything generate() works in; main frees it. */
struct gen {
    struct model_config cfg;
    struct safetensors *st;
    struct reference_model *m;
    struct kv_cache kv;
    struct gen_vision vision; /* --image only */
    const int32_t *prompt;    /* the prompt the decoder runs: the expanded one with --image */
    int n_prompt;
    float *hidden, *logits; /* logits: [steps kept][V]: every step with --out, else one */
    void *scratch;
    int32_t *generated;
    int slot, max_seq;
    double t_load;
};

/* Loads config and weights, runs the image path when asked. Returns -1 to go on, else the
 * exit code (after printing why). */
static int open_weights(struct gen *g, const struct args *a) {
    int rc;
    if (model_config_load(&g->cfg, a->model) || safetensors_open(&g->st, a->model)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    struct reference_load_options opt = {.layer_start = 0,
                                         .layer_end = g->cfg.num_layers,
                                         .with_embed = 1,
                                         .with_head = 1,
                                         .num_threads = (int)a->threads,
                                         .weights_dtype = a->weights_dtype};
    struct progress_printer progress;
    progress_printer_init(&progress, stderr, "loading weights",
                          progress_mode_from_env("STRATA_PROGRESS"));
    opt.progress = progress_printer_callback(&progress);
    double t0 = cli_now_sec();
    if ((rc = reference_model_load(&g->m, &g->cfg, g->st, &opt))) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return rc == STRATA_ENOMEM ? STRATA_EXIT_FAILURE : STRATA_EXIT_INPUT;
    }
    g->t_load = cli_now_sec() - t0;
    g->prompt = a->prompt;
    g->n_prompt = a->n_prompt;
    if (a->n_images == 0 && a->n_videos == 0) return -1;
    struct gen_vision_files files = {a->images, a->n_images, a->videos, a->n_videos, a->tokenizer};
    rc = gen_vision_prepare(&g->vision, a->model, &g->cfg, g->st, a->prompt, a->n_prompt, &files,
                            (int)a->threads);
    if (rc) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return rc == STRATA_ENOMEM ? STRATA_EXIT_FAILURE : STRATA_EXIT_INPUT;
    }
    g->prompt = g->vision.ids;
    g->n_prompt = g->vision.n;
    fprintf(stderr,
            "images: %d, videos: %d -> %d image and %d video tokens, prompt %d -> %d ids, "
            "rope_delta %d; decoded, preprocessed and encoded in %.2f s\n",
            a->n_images, a->n_videos, g->vision.n_image_tokens - g->vision.n_video_tokens,
            g->vision.n_video_tokens, a->n_prompt, g->vision.n, g->vision.rope_delta,
            g->vision.t_encode);
    return -1;
}

/* Loads everything and allocates the buffers. Returns -1 to go on, else the exit code. */
static int open_model(struct gen *g, const struct args *a) {
    int rc = open_weights(g, a);
    if (rc >= 0) return rc;
    g->max_seq = g->n_prompt + (int)a->max_tokens;
    if (kv_cache_init(&g->kv, 0, g->cfg.num_layers, g->cfg.num_kv_heads, g->cfg.head_dim,
                      g->max_seq, 1, 0, OPS_F32)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    kv_cache_acquire(&g->kv, &g->slot);
    int H = g->cfg.hidden_size, V = g->cfg.vocab_size;
    size_t steps = a->out ? (size_t)a->max_tokens : 1;
    g->hidden = malloc((size_t)g->n_prompt * (size_t)H * sizeof(float));
    g->logits = malloc(steps * (size_t)V * sizeof(float));
    g->scratch = malloc(2 * (size_t)V * 4);
    g->generated = malloc((size_t)a->max_tokens * sizeof *g->generated);
    if (!g->hidden || !g->logits || !g->scratch || !g->generated) {
        fprintf(stderr, "strata-generate: out of memory\n");
        return STRATA_EXIT_FAILURE;
    }
    return -1;
}

static void print_load_info(const struct gen *g, const struct args *a) {
    char w_buf[32], x_buf[32], kv_buf[32], q_buf[32], r_buf[32];
    size_t replaced, q8 = reference_model_q8_bytes(g->m, &replaced);
    if (q8)
        fprintf(stderr, "weights: q8, %s of 8-bit copies in place of %s of stored matrices\n",
                human(q_buf, sizeof q_buf, q8), human(r_buf, sizeof r_buf, replaced));
    fprintf(stderr,
            "weights: %d tensors, %s as stored (mmapped, widened on the fly), %s of f32/transposed "
            "copies; KV cache %s (%d positions); %d threads; loaded in %.2f s\n",
            reference_model_num_tensors(g->m),
            human(w_buf, sizeof w_buf, reference_model_weight_bytes(g->m)),
            human(x_buf, sizeof x_buf, reference_model_extra_bytes(g->m)),
            human(kv_buf, sizeof kv_buf, kv_cache_bytes(&g->kv)), g->max_seq, (int)a->threads,
            g->t_load);
}

static void print_results(const struct gen *g, int n_gen, int stopped_on, double t_prefill,
                          double t_decode) {
    for (int i = 0; i < n_gen; ++i)
        printf("%s%d", i ? " " : "", g->generated[i]);
    printf("\n");
    int decoded = n_gen - 1; /* forward passes after the prefill */
    printf("prefill: %d tokens in %.1f ms (%.1f tokens/s)\n", g->n_prompt, t_prefill * 1e3,
           g->n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    printf("decode: %d tokens in %.1f ms (%.2f tokens/s)\n", decoded, t_decode * 1e3,
           decoded > 0 ? decoded / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
    if (stopped_on >= 0)
        printf("stopped: stop id %d after %d tokens\n", stopped_on, n_gen);
    else
        printf("stopped: max tokens (%d)\n", n_gen);
}

/* Embeds the prompt (the merger rows replace the image tokens' embeddings, spec §5.4) and
 * runs it through the model; the last row's logits land in `logits`. Returns 0, 1 for a bad
 * prompt (an id outside the vocabulary) or -1 for a failure. */
static int prefill(struct gen *g, float *logits) {
    int H = g->cfg.hidden_size;
    const struct gen_vision *v = &g->vision;
    if (reference_embed(g->m, g->hidden, g->prompt, g->n_prompt)) return 1;
    struct forward_item item = {.slot = g->slot, .pos = 0, .n_tokens = g->n_prompt};
    if (v->ids) {
        for (int i = 0, t = 0; i < v->n; ++i)
            if (v->mask[i])
                memcpy(g->hidden + (size_t)i * H, v->embeds + (size_t)t++ * H,
                       (size_t)H * sizeof(float));
        item.mrope_positions = v->positions;
        item.deepstack = v->num_deepstack ? v->deepstack : NULL;
        item.visual_mask = v->mask;
        item.num_deepstack = v->num_deepstack;
    }
    if (reference_forward(g->m, &g->kv, g->hidden, &item, 1)) return -1;
    if (reference_logits(g->m, logits, g->hidden + (size_t)(g->n_prompt - 1) * (size_t)H, 1))
        return -1;
    return 0;
}

/* One decode step of `token` at cache position pos (M-RoPE: pos + rope_delta, spec §5.3). */
static int decode_step(struct gen *g, int32_t token, int pos, float *logits) {
    int32_t positions[3];
    struct forward_item item = {.slot = g->slot, .pos = pos, .n_tokens = 1};
    if (g->vision.ids) {
        vl_decode_positions(positions, 1, pos, g->vision.rope_delta);
        item.mrope_positions = positions;
    }
    if (reference_embed(g->m, g->hidden, &token, 1) ||
        reference_forward(g->m, &g->kv, g->hidden, &item, 1))
        return -1;
    return reference_logits(g->m, logits, g->hidden, 1);
}

/* Prefills the prompt, then samples and decodes until a stop id or --max-tokens, and prints
 * the ids and timings (and writes --out). Returns the exit code. */
static int generate(struct gen *g, const struct args *a) {
    size_t V = (size_t)g->cfg.vocab_size;
    struct sampler sampler;
    sampler_init(&sampler, &a->sampling);
    double t_prefill = cli_now_sec();
    int rc = prefill(g, g->logits);
    if (rc > 0) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    if (rc < 0) goto fail;
    t_prefill = cli_now_sec() - t_prefill;
    int n_gen = 0, stopped_on = -1, pos = g->n_prompt;
    double t_decode = cli_now_sec();
    for (;;) {
        float *step_logits = g->logits + (a->out ? (size_t)n_gen * V : 0);
        int token = sampler_sample(&sampler, step_logits, (int)V, g->scratch);
        g->generated[n_gen++] = token;
        if (is_stop(a, &g->cfg, token)) {
            stopped_on = token;
            break;
        }
        if (n_gen == a->max_tokens) break;
        if (decode_step(g, token, pos++, g->logits + (a->out ? (size_t)n_gen * V : 0))) goto fail;
    }
    t_decode = cli_now_sec() - t_decode;
    print_results(g, n_gen, stopped_on, t_prefill, t_decode);
    if (a->out &&
        generation_file_write(a->out, g->n_prompt, g->generated, n_gen, g->logits, (int)V)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
fail:
    fprintf(stderr, "strata-generate: %s\n", strata_last_error());
    return STRATA_EXIT_FAILURE;
}

int main(int argc, char **argv) {
    /* Under `bazel run`, resolve relative paths against the caller's directory. */
    const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
    if (cwd && *cwd && chdir(cwd) != 0) fprintf(stderr, "warning: cannot chdir to %s\n", cwd);
    static struct args a;
    static struct gen g;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? STRATA_EXIT_OK : rc;
    rc = open_model(&g, &a);
    if (rc < 0) {
        print_load_info(&g, &a);
        rc = generate(&g, &a);
    }
    free(g.generated);
    free(g.scratch);
    free(g.logits);
    free(g.hidden);
    gen_vision_free(&g.vision);
    kv_cache_free(&g.kv);
    reference_model_free(g.m);
    safetensors_close(g.st);
    return rc;
}
