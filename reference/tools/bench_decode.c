/* strata-bench-decode: decode throughput of the CPU reference decoder against the DRAM
 * roofline. Writes a Qwen3-0.6B-shaped checkpoint with random bf16 weights (hidden 1024,
 * 28 layers, 16 q / 8 kv heads, head_dim 128, intermediate 3072, vocab 151936, tied) to a
 * temporary directory, measures memcpy bandwidth, then greedy-decodes at each thread count.
 * Roofline tokens/s = memcpy bandwidth (bytes copied per second) / weight bytes read per token
 * (every layer matrix plus the lm_head, which is the tied embedding). Decode only reads weights,
 * and a copy both reads and writes, so a stricter ratio against read-only bandwidth is printed
 * too (a streaming sum over 1 GiB at the same thread count). Each figure is the median of
 * --repeat runs, decode and bandwidth runs interleaved (the machine may be shared). Not a
 * test: nothing is asserted. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/ops.h"
#include "reference/sampler.h"
#include "reference/tools/bandwidth.h"
#include "reference/tools/random_checkpoint.h"
#include "runtime/base/cli.h"
#include "runtime/base/progress_printer.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"

enum {
    HIDDEN = 1024,
    LAYERS = 28,
    HEADS = 16,
    KV_HEADS = 8,
    HEAD_DIM = 128,
    FFN = 3072,
    VOCAB = 151936
};

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: strata-bench-decode [--threads LIST] [--steps N] [--prompt N] [--repeat R]\n"
        "                           [--model DIR] [--keep] [--path NAME] [--weights-dtype D]\n"
        "                           [--weights-in-file]\n"
        "\n"
        "Decode tokens/s of the CPU reference decoder on a Qwen3-0.6B-shaped random bf16\n"
        "checkpoint, next to the DRAM roofline (weight bytes per token / memcpy bandwidth).\n"
        "\n"
        "  --threads LIST   thread counts to measure (default 1,2)\n"
        "  --steps N        decode steps per measurement (default 32)\n"
        "  --prompt N       prompt length prefilled first (default 16; its tokens/s is the last\n"
        "                   column: embed + forward + the last row's logits, one call, after\n"
        "                   one untimed run of the same prompt)\n"
        "  --repeat R       runs per thread count, interleaved; medians are printed "
        "(default 3)\n"
        "  --path NAME      matmul path: auto (default: the fastest this CPU has), portable,\n"
        "                   avx2, avx512 (all give identical bits)\n"
        "  --weights-dtype D  bf16 (default: as stored) or q8 (8-bit blocks quantised at load;\n"
        "                   weight MB/token then counts the q8 copies)\n"
        "  --weights-in-file  matmuls read the mmapped checkpoint in place (default: bf16\n"
        "                   matrices are copied at load into huge-page-advised memory)\n"
        "  --model DIR      reuse a checkpoint directory instead of writing one\n"
        "  --keep           keep the written checkpoint (its path is printed)\n"
        "  -h, --help       this text\n"
        "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad model.\n");
}

/* ---------------------------------------------------------------- checkpoint writer */

static int write_config(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return strata_set_error(STRATA_EIO, "%s: %s", path, strerror(errno));
    fprintf(
        f,
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"dtype\": "
        "\"bfloat16\",\n"
        " \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,\n"
        " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,\n"
        " \"head_dim\": %d, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, "
        "\"tie_word_embeddings\": true,\n"
        " \"max_position_embeddings\": 40960, \"attention_bias\": false, \"eos_token_id\": "
        "151645}\n",
        VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM);
    if (fclose(f)) return strata_set_error(STRATA_EIO, "%s: write failed", path);
    return STRATA_OK;
}

/* config.json, then exactly the tensors the manifest lists for the whole model. */
static int write_checkpoint(const char *dir) {
    struct model_config cfg;
    struct stage_tensor_list list = {0};
    struct stage_role all = {0, LAYERS, 1, 1, 0};
    int rc = write_config(dir);
    if (!rc) rc = model_config_load(&cfg, dir);
    if (!rc) rc = stage_tensor_list_build(&list, &cfg, &all, NULL);
    if (!rc) rc = random_checkpoint_write(dir, &list, 0x5eed);
    stage_tensor_list_free(&list);
    return rc;
}

/* ---------------------------------------------------------------- decode */

/* Greedy-decodes `steps` tokens after a `prompt`-token prefill; returns decode tokens/s and
 * prefill tokens/s (the prompt's embed + forward + last row's logits, one call). */
static int measure(double *tok_s, double *prefill_s, size_t *bytes_per_token,
                   const struct model_config *cfg, const struct safetensors *st, int threads,
                   int prompt, int steps, enum reference_weights_dtype dtype, int in_file) {
    struct reference_load_options opt = {.layer_start = 0,
                                         .layer_end = cfg->num_layers,
                                         .with_embed = 1,
                                         .with_head = 1,
                                         .num_threads = threads,
                                         .weights_dtype = dtype,
                                         .weights_in_file = in_file};
    struct progress_printer progress; /* stderr, when the load is long (progress_printer.h) */
    progress_printer_init(&progress, stderr, "loading weights",
                          progress_mode_from_env("STRATA_PROGRESS"));
    opt.progress = progress_printer_callback(&progress);
    struct reference_model *m = NULL;
    struct kv_cache kv = {0};
    float *hidden = NULL, *logits = NULL;
    int32_t *ids = NULL;
    int rc = reference_model_load(&m, cfg, st, &opt);
    if (rc) goto done;
    if ((rc = kv_cache_init(&kv, 0, cfg->num_layers, cfg->num_kv_heads, cfg->head_dim,
                            prompt + steps + 1, 1, 0, OPS_F32)))
        goto done;
    int slot;
    kv_cache_acquire(&kv, &slot);
    hidden = malloc((size_t)prompt * (size_t)cfg->hidden_size * sizeof(float));
    logits = malloc((size_t)cfg->vocab_size * sizeof(float));
    ids = malloc((size_t)prompt * sizeof *ids);
    if (!hidden || !logits || !ids) {
        rc = strata_set_error(STRATA_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < prompt; ++i)
        ids[i] = (int32_t)((i * 7919 + 13) % cfg->vocab_size);
    struct forward_item item = {.slot = slot, .pos = 0, .n_tokens = prompt};
    /* One untimed run of the prompt first (first touch of the activation scratch and the KV
     * pages, the pool threads' first wake), as bench_peers.py does for llama.cpp; then the
     * slot starts over and the same prompt is timed. */
    if ((rc = reference_embed(m, hidden, ids, prompt)) ||
        (rc = reference_forward(m, &kv, hidden, &item, 1)) ||
        (rc = reference_logits(m, logits, hidden + (size_t)(prompt - 1) * (size_t)cfg->hidden_size,
                               1)))
        goto done;
    kv_cache_release(&kv, slot);
    kv_cache_acquire(&kv, &slot);
    item.slot = slot;
    double tp = cli_now_sec();
    if ((rc = reference_embed(m, hidden, ids, prompt)) ||
        (rc = reference_forward(m, &kv, hidden, &item, 1)) ||
        (rc = reference_logits(m, logits, hidden + (size_t)(prompt - 1) * (size_t)cfg->hidden_size,
                               1)))
        goto done;
    double t0 = cli_now_sec();
    *prefill_s = prompt / (t0 - tp);
    for (int s = 0; s < steps; ++s) {
        int32_t token = (int32_t)argmax(logits, cfg->vocab_size);
        item = (struct forward_item){.slot = slot, .pos = prompt + s, .n_tokens = 1};
        if ((rc = reference_embed(m, hidden, &token, 1)) ||
            (rc = reference_forward(m, &kv, hidden, &item, 1)) ||
            (rc = reference_logits(m, logits, hidden, 1)))
            goto done;
    }
    *tok_s = steps / (cli_now_sec() - t0);
    /* Per decoded token every owned matrix is read once; the embedding is read as lm_head
     * (tied), the embedding lookup itself touches one row. */
    size_t replaced, q8 = reference_model_q8_bytes(m, &replaced); /* q8: copies, not stored */
    *bytes_per_token = reference_model_weight_bytes(m) - replaced + q8;
done:
    free(ids);
    free(hidden);
    free(logits);
    kv_cache_free(&kv);
    reference_model_free(m);
    return rc;
}

struct bench_args {
    int thread_list[16], n_threads, steps, prompt, repeat, keep, in_file;
    const char *model;
    enum ops_path path;
    enum reference_weights_dtype dtype;
};

/* Parses "1,2,4" into a->thread_list; 0 ok, -1 bad (after printing why). */
static int parse_threads(struct bench_args *a, const char *text) {
    char *end;
    a->n_threads = 0;
    for (const char *p = text; *p && a->n_threads < 16;) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || (*end && *end != ',')) {
            fprintf(stderr, "strata-bench-decode: --threads wants a list like 1,2\n");
            return -1;
        }
        a->thread_list[a->n_threads++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return a->n_threads ? 0 : -1;
}

/* Parses a matmul path name; 0 ok, -1 unknown or not on this CPU (after printing why). */
static int parse_path(enum ops_path *out, const char *text) {
    for (int p = OPS_PATH_AUTO; p <= OPS_PATH_AVX512; ++p) {
        if (strcmp(text, ops_path_name((enum ops_path)p))) continue;
        if (!ops_path_available((enum ops_path)p)) {
            fprintf(stderr, "strata-bench-decode: this CPU has no %s path\n", text);
            return -1;
        }
        *out = (enum ops_path)p;
        return 0;
    }
    fprintf(stderr, "strata-bench-decode: --path wants auto, portable, avx2 or avx512\n");
    return -1;
}

/* Returns -1 to go on, else the exit code (--help or a bad command line). */
static int parse_args(struct bench_args *a, int argc, char **argv) {
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'},
        {"steps", required_argument, 0, 's'},
        {"prompt", required_argument, 0, 'p'},
        {"model", required_argument, 0, 'm'},
        {"keep", no_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {"repeat", required_argument, 0, 'r'},
        {"path", required_argument, 0, 'P'},
        {"weights-dtype", required_argument, 0, 'W'},
        {"weights-in-file", no_argument, 0, 'F'},
        {0, 0, 0, 0},
    };
    int c;
    *a = (struct bench_args){
        {1, 2}, 2, 32, 16, 3, 0, 0, NULL, OPS_PATH_AUTO, REFERENCE_WEIGHTS_STORED};
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (parse_threads(a, optarg)) return STRATA_EXIT_USAGE;
            break;
        case 's':
        case 'p':
        case 'r': {
            const char *flag = c == 's' ? "steps" : c == 'p' ? "prompt" : "repeat";
            if (cli_parse_int(optarg, 1, 4096,
                              c == 's'   ? &a->steps
                              : c == 'p' ? &a->prompt
                                         : &a->repeat)) {
                fprintf(stderr, "strata-bench-decode: --%s wants an integer in [1, 4096]\n", flag);
                return STRATA_EXIT_USAGE;
            }
            break;
        }
        case 'm': a->model = optarg; break;
        case 'k': a->keep = 1; break;
        case 'F': a->in_file = 1; break;
        case 'P':
            if (parse_path(&a->path, optarg)) return STRATA_EXIT_USAGE;
            break;
        case 'W':
            if (reference_weights_dtype_parse(&a->dtype, optarg)) {
                fprintf(stderr, "strata-bench-decode: --weights-dtype: %s\n", strata_last_error());
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* Puts the checkpoint directory in dir: --model, else a fresh random checkpoint (*wrote
 * set). Returns -1 to go on, else the exit code. */
static int open_checkpoint(char *dir, size_t cap, int *wrote, const struct bench_args *a) {
    if (a->model) {
        snprintf(dir, cap, "%s", a->model);
        return -1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/strata-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "strata-bench-decode: mkdtemp %s: %s\n", dir, strerror(errno));
        return STRATA_EXIT_FAILURE;
    }
    double t0 = cli_now_sec();
    fprintf(stderr, "writing a Qwen3-0.6B-shaped random bf16 checkpoint to %s ...\n", dir);
    if (write_checkpoint(dir)) {
        fprintf(stderr, "strata-bench-decode: %s\n", strata_last_error());
        random_checkpoint_remove(dir);
        return STRATA_EXIT_FAILURE;
    }
    fprintf(stderr, "written in %.1f s\n", cli_now_sec() - t0);
    *wrote = 1;
    return -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One table row: medians of `repeat` interleaved decode, memcpy and read runs at `threads`. */
static int bench_row(const struct model_config *cfg, const struct safetensors *st, int threads,
                     const struct bench_args *a) {
    double tok[64], pre[64], copy[64], read[64], warm = 0.0, warm_pre = 0.0;
    size_t bytes = 0;
    int n = a->repeat < 64 ? a->repeat : 64;
    /* Warm the page cache once (the checkpoint is mmapped). */
    if (measure(&warm, &warm_pre, &bytes, cfg, st, threads, a->prompt, 2, a->dtype, a->in_file))
        return -1;
    for (int r = 0; r < n; ++r) {
        copy[r] = host_memcpy_bandwidth((size_t)256 << 20, threads);
        if (measure(&tok[r], &pre[r], &bytes, cfg, st, threads, a->prompt, a->steps, a->dtype,
                    a->in_file))
            return -1;
        read[r] = host_read_bandwidth((size_t)1 << 30, threads);
    }
    double tok_s = median(tok, n), pre_s = median(pre, n), bw = median(copy, n),
           rd = median(read, n);
    double roof = bw / (double)bytes;
    double read_roof = rd / (double)bytes;
    printf("%7d %12.2f %15.1f %12.2f %15.2f %8.1f%% %10.2f %13.1f%% %13.1f\n", threads, tok_s,
           bytes / 1e6, bw / 1e9, roof, 100.0 * tok_s / roof, rd / 1e9, 100.0 * tok_s / read_roof,
           pre_s);
    fflush(stdout);
    return 0;
}

/* Loads the checkpoint and prints the table; returns the exit code. */
static int run(const char *dir, const struct bench_args *a) {
    int exit_code = STRATA_EXIT_FAILURE;
    struct model_config cfg;
    struct safetensors *st = NULL;
    if (model_config_load(&cfg, dir) || safetensors_open(&st, dir)) {
        fprintf(stderr, "strata-bench-decode: %s\n", strata_last_error());
        exit_code = STRATA_EXIT_INPUT;
        goto done;
    }
    char desc[512];
    model_config_describe(&cfg, desc, sizeof desc);
    printf("model: %s\n", desc);
    ops_force_path(a->path);
    printf("cpu: %ld online cores; matmul path %s (all paths give identical bits); weights %s\n",
           sysconf(_SC_NPROCESSORS_ONLN), ops_path_name(ops_matmul_path()),
           reference_weights_dtype_name(a->dtype));
    printf("%7s %12s %15s %12s %15s %9s %10s %14s %13s\n", "threads", "decode tok/s",
           "weight MB/token", "memcpy GB/s", "roofline tok/s", "ratio", "read GB/s",
           "ratio vs read", "prefill tok/s");
    for (int i = 0; i < a->n_threads; ++i) {
        if (bench_row(&cfg, st, a->thread_list[i], a)) {
            fprintf(stderr, "strata-bench-decode: %s\n", strata_last_error());
            goto done;
        }
    }
    exit_code = STRATA_EXIT_OK;
done:
    safetensors_close(st);
    return exit_code;
}

int main(int argc, char **argv) {
    /* Under `bazel run`, resolve relative paths against the caller's directory. */
    const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
    if (cwd && *cwd && chdir(cwd) != 0) fprintf(stderr, "warning: cannot chdir to %s\n", cwd);
    struct bench_args a;
    char dir[4096];
    int wrote = 0, rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    rc = open_checkpoint(dir, sizeof dir, &wrote, &a);
    if (rc >= 0) return rc;
    rc = run(dir, &a);
    if (wrote) {
        if (a.keep)
            printf("checkpoint kept at %s\n", dir);
        else
            random_checkpoint_remove(dir);
    }
    return rc;
}
