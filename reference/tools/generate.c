/* strata-generate: one process, end to end, on the CPU reference decoder. Loads a Hugging
 * Face checkpoint directory (config.json + safetensors), prefills the prompt ids, samples up
 * to --max-tokens new ids (greedy by default), and prints them with prefill and decode
 * throughput. Tokenisation is out of scope: ids in, ids out. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

#define MAX_IDS 65536

static void usage(FILE *f) {
    fprintf(f, "usage: strata-generate --model DIR --prompt-ids 1,2,3 --max-tokens N [options]\n"
               "\n"
               "Runs the CPU reference decoder (Qwen3 / Qwen3-MoE text) on token ids.\n"
               "\n"
               "  --model DIR          checkpoint directory: config.json + model.safetensors\n"
               "                       (or a sharded model.safetensors.index.json)\n"
               "  --prompt-ids LIST    comma-separated prompt token ids (at least one)\n"
               "  --max-tokens N       new tokens to generate (>= 1)\n"
               "  --threads T          matmul threads (default 1); results do not depend on T\n"
               "  --temperature F      0 (default) = greedy argmax\n"
               "  --top-k K            keep the K most likely tokens (0 = off)\n"
               "  --top-p P            nucleus cut in (0, 1] (1 = off)\n"
               "  --seed S             sampling seed (default 0)\n"
               "  --stop-ids LIST      extra stop token ids (the config's eos ids always stop)\n"
               "  --ignore-eos         do not stop at the config's eos ids\n"
               "  -h, --help           this text\n"
               "\n"
               "Output (stdout): the generated ids on one line, then prefill and decode speed.\n"
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct args {
    const char *model;
    int32_t prompt[MAX_IDS];
    int n_prompt;
    int32_t stop[64];
    int n_stop;
    long max_tokens;
    long threads;
    struct sampler_params sampling;
    int ignore_eos;
};

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
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(a, 0, sizeof *a);
    a->threads = 1;
    a->max_tokens = -1;
    a->n_prompt = -1;
    a->sampling.top_p = 1.0f;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'p':
            if ((a->n_prompt = parse_ids(a->prompt, MAX_IDS, optarg)) < 0) {
                fprintf(
                    stderr,
                    "strata-generate: --prompt-ids wants comma-separated integers, got \"%s\"\n",
                    optarg);
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'n':
            if (parse_long(&a->max_tokens, optarg, 1, 1 << 20)) {
                fprintf(stderr, "strata-generate: --max-tokens wants an integer in [1, %d]\n",
                        1 << 20);
                return STRATA_EXIT_USAGE;
            }
            break;
        case 't':
            if (parse_long(&a->threads, optarg, 1, 256)) {
                fprintf(stderr, "strata-generate: --threads wants an integer in [1, 256]\n");
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'T':
            if (parse_float(&a->sampling.temperature, optarg) || a->sampling.temperature < 0) {
                fprintf(stderr, "strata-generate: --temperature wants a number >= 0\n");
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'k':
            if (parse_long(&v, optarg, 0, INT_MAX)) {
                fprintf(stderr, "strata-generate: --top-k wants an integer >= 0\n");
                return STRATA_EXIT_USAGE;
            }
            a->sampling.top_k = (int)v;
            break;
        case 'P':
            if (parse_float(&a->sampling.top_p, optarg) || a->sampling.top_p <= 0 ||
                a->sampling.top_p > 1) {
                fprintf(stderr, "strata-generate: --top-p wants a number in (0, 1]\n");
                return STRATA_EXIT_USAGE;
            }
            break;
        case 's':
            if (parse_long(&v, optarg, 0, LONG_MAX)) {
                fprintf(stderr, "strata-generate: --seed wants an integer >= 0\n");
                return STRATA_EXIT_USAGE;
            }
            a->sampling.seed = (uint64_t)v;
            break;
        case 'S':
            if ((a->n_stop = parse_ids(a->stop, 64, optarg)) < 0) {
                fprintf(stderr,
                        "strata-generate: --stop-ids wants up to 64 comma-separated integers\n");
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'E': a->ignore_eos = 1; break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
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

int main(int argc, char **argv) {
    /* Under `bazel run`, resolve relative paths against the caller's directory. */
    const char *cwd = getenv("BUILD_WORKING_DIRECTORY");
    if (cwd && *cwd && chdir(cwd) != 0) fprintf(stderr, "warning: cannot chdir to %s\n", cwd);
    static struct args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? STRATA_EXIT_OK : rc;

    int exit_code = STRATA_EXIT_FAILURE;
    struct model_config cfg;
    struct safetensors *st = NULL;
    struct reference_model *m = NULL;
    struct kv_cache kv = {0};
    float *hidden = NULL, *logits = NULL;
    void *scratch = NULL;
    int32_t *generated = NULL;

    if (model_config_load(&cfg, a.model) || safetensors_open(&st, a.model)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        exit_code = STRATA_EXIT_INPUT;
        goto done;
    }
    struct reference_load_options opt = {0, cfg.num_layers, 1, 1, (int)a.threads};
    double t0 = now_s();
    if ((rc = reference_model_load(&m, &cfg, st, &opt))) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        exit_code = rc == STRATA_ENOMEM ? STRATA_EXIT_FAILURE : STRATA_EXIT_INPUT;
        goto done;
    }
    double t_load = now_s() - t0;
    int max_seq = a.n_prompt + (int)a.max_tokens;
    if (kv_cache_init(&kv, 0, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_seq, 1)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        goto done;
    }
    int slot;
    kv_cache_acquire(&kv, &slot);
    int H = cfg.hidden_size, V = cfg.vocab_size;
    hidden = malloc((size_t)a.n_prompt * (size_t)H * sizeof(float));
    logits = malloc((size_t)V * sizeof(float));
    scratch = malloc(2 * (size_t)V * 4);
    generated = malloc((size_t)a.max_tokens * sizeof *generated);
    if (!hidden || !logits || !scratch || !generated) {
        fprintf(stderr, "strata-generate: out of memory\n");
        goto done;
    }

    char desc[512];
    model_config_describe(&cfg, desc, sizeof desc);
    char w_buf[32], x_buf[32], kv_buf[32];
    fprintf(stderr,
            "weights: %d tensors, %s as stored (mmapped, widened on the fly), %s of f32/transposed "
            "copies; KV cache %s (%d positions); %d threads; loaded in %.2f s\n",
            reference_model_num_tensors(m),
            human(w_buf, sizeof w_buf, reference_model_weight_bytes(m)),
            human(x_buf, sizeof x_buf, reference_model_extra_bytes(m)),
            human(kv_buf, sizeof kv_buf, kv_cache_bytes(&kv)), max_seq, (int)a.threads, t_load);

    struct sampler sampler;
    sampler_init(&sampler, &a.sampling);
    if (reference_embed(m, hidden, a.prompt, a.n_prompt)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        exit_code = STRATA_EXIT_INPUT;
        goto done;
    }
    double t_prefill = now_s();
    struct forward_item item = {.slot = slot, .pos = 0, .n_tokens = a.n_prompt};
    if (reference_forward(m, &kv, hidden, &item, 1) ||
        reference_logits(m, logits, hidden + (size_t)(a.n_prompt - 1) * (size_t)H, 1)) {
        fprintf(stderr, "strata-generate: %s\n", strata_last_error());
        goto done;
    }
    t_prefill = now_s() - t_prefill;
    int n_gen = 0, stopped_on = -1, pos = a.n_prompt;
    double t_decode = now_s();
    for (;;) {
        int token = sampler_sample(&sampler, logits, V, scratch);
        generated[n_gen++] = token;
        if (is_stop(&a, &cfg, token)) {
            stopped_on = token;
            break;
        }
        if (n_gen == a.max_tokens) break;
        int32_t in = token;
        item = (struct forward_item){.slot = slot, .pos = pos++, .n_tokens = 1};
        if (reference_embed(m, hidden, &in, 1) || reference_forward(m, &kv, hidden, &item, 1) ||
            reference_logits(m, logits, hidden, 1)) {
            fprintf(stderr, "strata-generate: %s\n", strata_last_error());
            goto done;
        }
    }
    t_decode = now_s() - t_decode;

    for (int i = 0; i < n_gen; ++i)
        printf("%s%d", i ? " " : "", generated[i]);
    printf("\n");
    int decoded = n_gen - 1; /* forward passes after the prefill */
    printf("prefill: %d tokens in %.1f ms (%.1f tokens/s)\n", a.n_prompt, t_prefill * 1e3,
           a.n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    printf("decode: %d tokens in %.1f ms (%.2f tokens/s)\n", decoded, t_decode * 1e3,
           decoded > 0 ? decoded / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
    if (stopped_on >= 0)
        printf("stopped: stop id %d after %d tokens\n", stopped_on, n_gen);
    else
        printf("stopped: max tokens (%d)\n", n_gen);
    exit_code = STRATA_EXIT_OK;
done:
    free(generated);
    free(scratch);
    free(logits);
    free(hidden);
    kv_cache_free(&kv);
    reference_model_free(m);
    safetensors_close(st);
    return exit_code;
}
