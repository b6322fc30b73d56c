/* strata-bench-backend: decode tokens/s at several batch sizes and prefill tokens/s of one
 * stage backend (the whole model on one device, through the backend seam the stage core
 * uses), on random bf16 checkpoints shaped like Qwen3-0.6B, Qwen3-8B and a Qwen3-MoE, each
 * next to its bandwidth roofline. `./strata bench gpu` runs it with --device cuda:0 (the CUDA
 * issue's benchmark); `--device cpu` measures the CPU backend the same way.
 *
 * Roofline (a bound on decode, which streams the weights once per step): bytes read per step
 * = the weights a step touches (all dense weights; for MoE the expected distinct experts of
 * B tokens, E·(1 − (1 − k/E)^B), per layer) + the KV of every sequence at its mean length,
 * divided by the device's measured bandwidth: on a GPU the device-to-device copy rate
 * counted as read + write traffic (2·bytes / time, as CUDA's bandwidthTest reports), on the
 * CPU the read bandwidth at the backend's thread count. Tokens/s of the roofline = B / that
 * time. A measurement, not a test: nothing is asserted.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage, 77 the device is not available (the reason
 * is printed as "skipped: ..."). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if STRATA_HAVE_CUDA /* a build with the toolkit (BUILD's local_defines) */
#include "kernels/cuda_device.h"
#endif
#include "reference/tools/bandwidth.h"
#include "reference/tools/random_checkpoint.h"
#include "runtime/base/cli.h"
#include "runtime/base/progress_printer.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/backend.h"

#define PROG "strata-bench-backend"
#define EXIT_SKIPPED 77
#define MAX_BATCHES 8

struct shape {
    const char *name, *about;
    const char *config; /* config.json text */
};

/* Shapes from the public configs (Qwen/Qwen3-0.6B, Qwen/Qwen3-8B; the MoE one is
 * Qwen3-30B-A3B's layer with 12 of its 48 layers, to fit a 64 GiB disk and 78 GiB card). */
static const struct shape SHAPES[] = {
    {"qwen3-0.6b", "Qwen3-0.6B: H 1024, 28 layers, 16/8 heads, FFN 3072, tied",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 151936, \"hidden_size\": 1024,"
     " \"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
     " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000, \"tie_word_embeddings\": true, \"attention_bias\": false,"
     " \"max_position_embeddings\": 40960, \"eos_token_id\": 151645}"},
    {"qwen3-8b", "Qwen3-8B: H 4096, 36 layers, 32/8 heads, FFN 12288, untied (~16 GB)",
     "{\"model_type\": \"qwen3\", \"vocab_size\": 151936, \"hidden_size\": 4096,"
     " \"intermediate_size\": 12288, \"num_hidden_layers\": 36, \"num_attention_heads\": 32,"
     " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000, \"tie_word_embeddings\": false, \"attention_bias\": false,"
     " \"max_position_embeddings\": 40960, \"eos_token_id\": 151645}"},
    {"qwen3-moe", "Qwen3-30B-A3B layers x12: H 2048, 32/4 heads, 128 experts top-8 of 768",
     "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 151936, \"hidden_size\": 2048,"
     " \"intermediate_size\": 6144, \"moe_intermediate_size\": 768, \"num_experts\": 128,"
     " \"num_experts_per_tok\": 8, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
     " \"mlp_only_layers\": [], \"num_hidden_layers\": 12, \"num_attention_heads\": 32,"
     " \"num_key_value_heads\": 4, \"head_dim\": 128, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000, \"tie_word_embeddings\": false, \"attention_bias\": false,"
     " \"max_position_embeddings\": 40960, \"eos_token_id\": 151645}"},
    /* Small enough for a 2-core CPU host running three copies (`./strata bench tp --moe`):
     * Qwen3-MoE's routing (top-8, normalised) on Qwen3-0.6B's attention, ~2.9 GB. */
    {"qwen3-moe-small",
     "Qwen3-MoE-shaped small: H 1024, 16 layers, 16/8 heads, 64 experts top-8 of 384",
     "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 151936, \"hidden_size\": 1024,"
     " \"intermediate_size\": 3072, \"moe_intermediate_size\": 384, \"num_experts\": 64,"
     " \"num_experts_per_tok\": 8, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
     " \"mlp_only_layers\": [], \"num_hidden_layers\": 16, \"num_attention_heads\": 16,"
     " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000, \"tie_word_embeddings\": true, \"attention_bias\": false,"
     " \"max_position_embeddings\": 40960, \"eos_token_id\": 151645}"},
};
#define NUM_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

struct bench_args {
    const char *device, *dir;
    int shapes[NUM_SHAPES], n_shapes;
    int batches[MAX_BATCHES], n_batches;
    int threads, steps, prefill, context, keep;
};

static void usage(FILE *f) {
    fprintf(
        f, "usage: " PROG " [--device D] [--shapes LIST] [--batch LIST] [options]\n"
           "\n"
           "Decode tokens/s at each batch size and prefill tokens/s of one backend holding\n"
           "the whole model, next to the bandwidth roofline, on random bf16 checkpoints.\n"
           "\n"
           "  --device D       cpu (default) or cuda:N\n"
           "  --shapes LIST    qwen3-0.6b,qwen3-8b,qwen3-moe,qwen3-moe-small (default qwen3-0.6b)\n"
           "  --batch LIST     decode batch sizes (default 1,8,32)\n"
           "  --steps N        timed decode steps per batch size (default 16)\n"
           "  --context N      tokens each sequence holds before decoding (default 128)\n"
           "  --prefill N      prompt length of the prefill measurement (default 2048; 0 = off)\n"
           "  --threads T      CPU worker threads (default 2)\n"
           "  --dir DIR        where checkpoints are written (default /tmp/strata-bench-<shape>),\n"
           "                   reused when its config.json matches\n"
           "  --keep           keep the written checkpoints\n"
           "  -h, --help       this text\n"
           "Exit codes: 0 ok, 1 failure, 2 usage, 77 device not available (\"skipped: ...\").\n");
}

static int parse_list(int *out, int cap, const char *text, int lo, int hi) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (n == cap || cli_parse_int(t, lo, hi, &out[n++]) < 0) return -1;
    return n;
}

static int parse_shapes(struct bench_args *a, const char *text) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    a->n_shapes = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < NUM_SHAPES && strcmp(SHAPES[k].name, t))
            ++k;
        if (k == NUM_SHAPES || a->n_shapes == NUM_SHAPES) return -1;
        a->shapes[a->n_shapes++] = k;
    }
    return a->n_shapes ? 0 : -1;
}

/* Returns -1 to go on, else the exit code. */
static int parse_args(struct bench_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"device", 1, 0, 'd'},
                                         {"shapes", 1, 0, 's'},
                                         {"batch", 1, 0, 'b'},
                                         {"steps", 1, 0, 'n'},
                                         {"context", 1, 0, 'c'},
                                         {"prefill", 1, 0, 'p'},
                                         {"threads", 1, 0, 't'},
                                         {"dir", 1, 0, 'D'},
                                         {"keep", 0, 0, 'k'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct bench_args){.device = "cpu",
                             .n_shapes = 1,
                             .n_batches = 3,
                             .threads = 2,
                             .steps = 16,
                             .prefill = 2048,
                             .context = 128};
    a->batches[0] = 1, a->batches[1] = 8, a->batches[2] = 32;
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': a->device = optarg; break;
        case 's': bad = parse_shapes(a, optarg) < 0; break;
        case 'b':
            bad = (a->n_batches = parse_list(a->batches, MAX_BATCHES, optarg, 1, 256)) <= 0;
            break;
        case 'n': bad = cli_parse_int(optarg, 1, 100000, &a->steps) < 0; break;
        case 'c': bad = cli_parse_int(optarg, 1, 1 << 20, &a->context) < 0; break;
        case 'p': bad = cli_parse_int(optarg, 0, 1 << 20, &a->prefill) < 0; break;
        case 't': bad = cli_parse_int(optarg, 1, 256, &a->threads) < 0; break;
        case 'D': a->dir = optarg; break;
        case 'k': a->keep = 1; break;
        case 'h': usage(stdout); return 0;
        default: bad = 1;
        }
    }
    if (bad || optind < argc) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* ------------------------------------------------------------------ checkpoints */

static int same_file_text(const char *path, const char *text) {
    char *have = NULL;
    size_t len = 0;
    int same = cli_read_file(&have, &len, path) == 0 && len == strlen(text) &&
               memcmp(have, text, len) == 0;
    free(have);
    return same;
}

/* Writes (or reuses) the shape's checkpoint in dir. */
static int prepare_checkpoint(const char *dir, const struct shape *sh, int *wrote) {
    char path[4200], model[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    *wrote = 0;
    if (same_file_text(path, sh->config) && access(model, R_OK) == 0) return 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return strata_set_error(STRATA_EIO, "%s: %s", dir, strerror(errno));
    FILE *f = fopen(path, "w");
    if (!f || fputs(sh->config, f) < 0 || fclose(f) != 0)
        return strata_set_error(STRATA_EIO, "cannot write %s", path);
    struct model_config cfg;
    struct stage_tensor_list list = {0};
    int rc = model_config_load(&cfg, dir);
    struct stage_role all = {0, cfg.num_layers, 1, 1, 0};
    fprintf(stderr, PROG ": writing %s (%s)...\n", dir, sh->about);
    if (!rc) rc = stage_tensor_list_build(&list, &cfg, &all, NULL);
    if (!rc) rc = random_checkpoint_write(dir, &list, 0x5eed);
    stage_tensor_list_free(&list);
    *wrote = rc == 0;
    return rc;
}

/* ------------------------------------------------------------------ roofline */

static double tensor_bytes(const struct stage_tensor *t) {
    double n = 2.0; /* bf16 as stored */
    for (int d = 0; d < t->ndim; ++d)
        n *= (double)t->shape[d];
    return n;
}

/* Weight bytes one decode step of `batch` tokens reads: every tensor but the embedding
 * (only `batch` rows of it are gathered) unless it is also the tied head; experts scaled by
 * the expected fraction of distinct experts the batch's tokens route to. */
static double step_weight_bytes(const struct stage_tensor_list *list,
                                const struct model_config *cfg, int batch) {
    double frac = 1.0, sum = 0.0;
    if (cfg->num_experts > 0)
        frac = 1.0 - pow(1.0 - (double)cfg->num_experts_per_tok / cfg->num_experts, batch);
    for (int i = 0; i < list->count; ++i) {
        const struct stage_tensor *t = &list->items[i];
        if (t->kind == STAGE_TENSOR_EMBED && !list->head_is_embed) continue;
        int expert = t->slot >= STAGE_SLOT_EXPERT_GATE && t->slot <= STAGE_SLOT_EXPERTS_DOWN;
        sum += tensor_bytes(t) * (expert ? frac : 1.0);
    }
    return sum;
}

/* KV bytes a step reads: every layer's f32 keys and values of `batch` sequences of `ctx`. */
static double step_kv_bytes(const struct model_config *cfg, int batch, int ctx) {
    return 2.0 * 4.0 * cfg->num_layers * cfg->num_kv_heads * cfg->head_dim * (double)ctx * batch;
}

/* Bytes per second the roofline divides by (see the file comment). */
static int device_bandwidth(double *bw, const char *what, size_t cap, const struct bench_args *a) {
#if STRATA_HAVE_CUDA
    if (cli_device_is_cuda(a->device)) {
        int rc = cuda_copy_bandwidth(bw, (size_t)1 << 30, 5);
        if (rc) return rc;
        snprintf((char *)what, cap, "device copy, read + write");
        return 0;
    }
#endif
    *bw = host_read_bandwidth((size_t)1 << 30, a->threads);
    snprintf((char *)what, cap, "host read, %d threads", a->threads);
    return *bw > 0 ? 0 : strata_set_error(STRATA_ENOMEM, "no memory for the bandwidth buffer");
}

/* ------------------------------------------------------------------ measurements */

struct run {
    struct stage_backend *be;
    const struct model_config *cfg;
    float *hidden, *logits;
    int32_t *tokens;
    int slots[256];
};

/* Fills `batch` acquired slots with `ctx` tokens each (one forward of every prompt). */
static int fill_context(struct run *r, int batch, int ctx) {
    struct forward_item items[256];
    int rc = 0;
    for (int b = 0; b < batch * ctx; ++b)
        r->tokens[b] = (int32_t)((b * 7919 + 13) % r->cfg->vocab_size);
    for (int b = 0; !rc && b < batch; ++b) {
        rc = stage_backend_kv_acquire(r->be, &r->slots[b]);
        items[b] = (struct forward_item){.slot = r->slots[b], .pos = 0, .n_tokens = ctx};
    }
    if (!rc) rc = stage_backend_embed(r->be, r->hidden, r->tokens, batch * ctx);
    if (!rc) rc = stage_backend_forward(r->be, r->hidden, items, batch);
    return rc;
}

/* Decode tokens/s of `batch` sequences after `ctx` tokens each, over `steps` timed steps.
 * Greedy tokens come from stage_backend_argmax, as the stage core takes them (on a CUDA
 * backend: argmax on the device, one id per row copied back). Two untimed steps first: a
 * CUDA backend runs a batch size's first decode step eagerly and instantiates its graph
 * at the second (runtime/stage/backend_cuda.c). */
static int measure_decode(double *tok_s, struct run *r, int batch, int ctx, int steps) {
    int rc = fill_context(r, batch, ctx);
    struct forward_item items[256];
    double t0 = 0;
    for (int s = -2; !rc && s < steps; ++s) {
        if (s == 0) t0 = cli_now_sec();
        for (int b = 0; b < batch; ++b)
            items[b] =
                (struct forward_item){.slot = r->slots[b], .pos = ctx + s + 2, .n_tokens = 1};
        rc = stage_backend_embed(r->be, r->hidden, r->tokens, batch);
        if (!rc) rc = stage_backend_forward(r->be, r->hidden, items, batch);
        if (!rc) rc = stage_backend_argmax(r->be, r->tokens, r->hidden, batch, r->logits);
    }
    *tok_s = rc ? 0 : (double)batch * steps / (cli_now_sec() - t0);
    for (int b = 0; b < batch; ++b)
        stage_backend_kv_release(r->be, r->slots[b]);
    return rc;
}

/* Prefill tokens/s of one `n`-token prompt (the last row's logits included). */
static int measure_prefill(double *tok_s, struct run *r, int n) {
    int H = r->cfg->hidden_size, slot = 0, rc = stage_backend_kv_acquire(r->be, &slot);
    for (int i = 0; i < n; ++i)
        r->tokens[i] = (int32_t)((i * 104729 + 7) % r->cfg->vocab_size);
    double t0 = cli_now_sec();
    struct forward_item item = {.slot = slot, .pos = 0, .n_tokens = n};
    if (!rc) rc = stage_backend_embed(r->be, r->hidden, r->tokens, n);
    if (!rc) rc = stage_backend_forward(r->be, r->hidden, &item, 1);
    if (!rc) rc = stage_backend_logits(r->be, r->logits, r->hidden + (size_t)(n - 1) * H, 1);
    *tok_s = rc ? 0 : n / (cli_now_sec() - t0);
    stage_backend_kv_release(r->be, slot);
    return rc;
}

static int max_batch(const struct bench_args *a) {
    int m = 1;
    for (int i = 0; i < a->n_batches; ++i)
        m = a->batches[i] > m ? a->batches[i] : m;
    return m;
}

/* Opens the backend and allocates the buffers for every measurement of one shape. */
static int open_run(struct run *r, const struct model_config *cfg, const struct safetensors *st,
                    const struct bench_args *a) {
    int B = max_batch(a), rows = B * a->context > a->prefill ? B * a->context : a->prefill;
    struct stage_backend_options o = {
        .cfg = cfg,
        .weights = st,
        .role = {0, cfg->num_layers, 1, 1, 0},
        .device = a->device,
        .num_threads = a->threads,
        .max_seq =
            (a->context + a->steps + 2 > a->prefill ? a->context + a->steps + 2 : a->prefill),
        .num_slots = B};
    struct progress_printer progress; /* stderr, when the load is long (progress_printer.h) */
    progress_printer_init(&progress, stderr, "loading weights",
                          progress_mode_from_env("STRATA_PROGRESS"));
    o.progress = progress_printer_callback(&progress);
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    int rc = stage_backend_open(&r->be, &o);
    r->hidden = malloc((size_t)rows * (size_t)cfg->hidden_size * sizeof(float));
    r->logits = malloc((size_t)B * (size_t)cfg->vocab_size * sizeof(float));
    r->tokens = malloc((size_t)rows * sizeof(int32_t));
    if (!rc && (!r->hidden || !r->logits || !r->tokens))
        rc = strata_set_error(STRATA_ENOMEM, "out of memory for the activations");
    return rc;
}

static void close_run(struct run *r) {
    stage_backend_free(r->be);
    free(r->hidden);
    free(r->logits);
    free(r->tokens);
}

/* ------------------------------------------------------------------ report */

static int bench_shape(const struct shape *sh, const struct bench_args *a, double bw,
                       const char *bw_what) {
    char dir[4096], desc[1024];
    int wrote = 0, rc;
    if (a->dir) { /* --dir is created (one level) as the default's /tmp is there */
        if (mkdir(a->dir, 0755) != 0 && errno != EEXIST)
            return strata_set_error(STRATA_EIO, "--dir %s: %s", a->dir, strerror(errno));
        snprintf(dir, sizeof dir, "%s/%s", a->dir, sh->name);
    } else
        snprintf(dir, sizeof dir, "/tmp/strata-bench-%s", sh->name);
    double t0 = cli_now_sec();
    if ((rc = prepare_checkpoint(dir, sh, &wrote))) return rc;
    struct model_config cfg;
    struct safetensors *st = NULL;
    struct stage_tensor_list list = {0};
    struct stage_role all = {0, 0, 1, 1, 0};
    struct run r = {0};
    rc = model_config_load(&cfg, dir);
    all.layer_end = cfg.num_layers;
    if (!rc) rc = safetensors_open(&st, dir);
    if (!rc) rc = stage_tensor_list_build(&list, &cfg, &all, st);
    if (!rc) rc = open_run(&r, &cfg, st, a);
    if (!rc) {
        stage_backend_describe(r.be, desc, sizeof desc);
        printf("\n%s — %s\n", sh->name, sh->about);
        for (char *line = strtok(desc, "\n"); line; line = strtok(NULL, "\n"))
            printf("  %s\n", line);
        printf("  ready in %.1f s%s\n", cli_now_sec() - t0, wrote ? " (checkpoint written)" : "");
        printf("  roofline bandwidth %.1f GB/s (%s)\n", bw / 1e9, bw_what);
        printf("  %6s %14s %16s %16s %8s\n", "batch", "decode tok/s", "MB read / step",
               "roofline tok/s", "ratio");
    }
    for (int i = 0; !rc && i < a->n_batches; ++i) {
        int B = a->batches[i];
        double tok_s = 0, ctx = a->context + a->steps / 2.0;
        rc = measure_decode(&tok_s, &r, B, a->context, a->steps);
        double bytes = step_weight_bytes(&list, &cfg, B) + step_kv_bytes(&cfg, B, (int)ctx);
        double roof = B / (bytes / bw);
        if (!rc)
            printf("  %6d %14.2f %16.1f %16.2f %7.1f%%\n", B, tok_s, bytes / 1e6, roof,
                   100.0 * tok_s / roof);
    }
    if (!rc && a->prefill > 0) {
        double tok_s = 0;
        rc = measure_prefill(&tok_s, &r, a->prefill);
        if (!rc) printf("  prefill %d tokens: %.1f tokens/s\n", a->prefill, tok_s);
    }
    close_run(&r);
    stage_tensor_list_free(&list);
    safetensors_close(st);
    if (wrote && !a->keep) random_checkpoint_remove(dir);
    return rc;
}

int main(int argc, char **argv) {
    static struct bench_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    if (cli_device_is_cuda(a.device)) {
        char reason[256] = "this build has no CUDA backend (nvcc not found when it was built)";
#if STRATA_HAVE_CUDA
        if (!cuda_device_available(reason, sizeof reason))
#endif
        {
            printf("skipped: %s\n", reason);
            return EXIT_SKIPPED;
        }
    }
    double bw = 0;
    char bw_what[64];
    if ((rc = device_bandwidth(&bw, bw_what, sizeof bw_what, &a))) {
        fprintf(stderr, PROG ": bandwidth: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    printf("strata-bench-backend: device %s, %d decode steps after %d context tokens per "
           "sequence\n",
           a.device, a.steps, a.context);
    for (int i = 0; i < a.n_shapes; ++i) {
        if ((rc = bench_shape(&SHAPES[a.shapes[i]], &a, bw, bw_what))) {
            fprintf(stderr, PROG ": %s: %s\n", SHAPES[a.shapes[i]].name, strata_last_error());
            return rc == STRATA_EDEVICE ? EXIT_SKIPPED : STRATA_EXIT_FAILURE;
        }
    }
    return STRATA_EXIT_OK;
}
