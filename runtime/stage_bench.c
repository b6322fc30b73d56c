/* strata-stage-bench: helpers for tools/bench_pipeline.sh.
 *   make-model  writes a random-weight Qwen3 checkpoint (config.json + bf16 safetensors) big
 *               enough that compute, not messaging, dominates a decode step — the committed
 *               goldens are tiny — deterministic for a seed.
 *   make-draft  a self-speculative draft of a checkpoint: its embedding, its first N layers,
 *               its final norm and head, unchanged (for --draft-model). On the random
 *               checkpoints no trained pair exists; the first layers of the target itself are
 *               a real smaller model with the same vocabulary whose guesses cost what a draft
 *               model's do.
 *   ngram-text  n-gram drafts on real text: each file's first part as the prompt and the rest
 *               as the answer a model writes (or an old and a new version of a file: an
 *               edit), replayed step by step with stage 0's own drafter and pace; prints
 *               the drafts accepted and the decode steps against one token per step.
 *   hop, probe-link  the link measurements (runtime/stage_bench_link.c): one decode hidden
 *               state's per-hop latency over TCP loopback, and a link between two boxes as
 *               the stages' frames cross it (strata-plan's "link").
 * Exit codes: 0 ok, 1 failure, 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/cli.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_write.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/ngram_draft.h"
#include "runtime/stage/spec_pace.h"
#include "runtime/stage_bench.h"
#include "runtime/text/tokenizer.h"
#include "wire/message.h"

#include <cjson/cJSON.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static float rng_uniform(void) { /* [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* config.json of the benchmark model; also parsed back for the manifest. */
static int format_config(char *buf, size_t cap, int H, int I, int L, int nh, int nkv, int D,
                         int V) {
    int n = snprintf(
        buf, cap,
        "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"model_type\": \"qwen3\",\n"
        "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
        "  \"vocab_size\": %d,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000.0,\n"
        "  \"tie_word_embeddings\": true,\n  \"attention_bias\": false,\n"
        "  \"max_position_embeddings\": 4096,\n  \"eos_token_id\": %d,\n"
        "  \"torch_dtype\": \"bfloat16\"\n}\n",
        H, I, L, nh, nkv, D, V, V - 1);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

static int64_t numel_of(const struct stage_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; ++d)
        n *= t->shape[d];
    return n;
}

/* Writes exactly the manifest's tensors as bf16: uniform with variance 1/fan_in (the
 * embedding 0.25), vectors (norms) near 1. */
static int write_weights(const char *path, const struct stage_tensor_list *list,
                         size_t *total_bytes) {
    struct st_write_entry *entries = calloc((size_t)list->count + 1, sizeof *entries);
    size_t row_cap = 1;
    uint64_t bytes = 0;
    if (!entries) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int i = 0; i < list->count; i++) {
        const struct stage_tensor *t = &list->items[i];
        if ((size_t)t->shape[t->ndim - 1] > row_cap) row_cap = (size_t)t->shape[t->ndim - 1];
        entries[i] = (struct st_write_entry){.name = t->name, .dtype = ST_BF16, .ndim = t->ndim};
        memcpy(entries[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    FILE *f = fopen(path, "wb");
    uint16_t *row = malloc(row_cap * sizeof *row);
    int ok = f && row && safetensors_write_header(f, entries, list->count, NULL, 0, &bytes) == 0;
    for (int i = 0; ok && i < list->count; i++) {
        const struct stage_tensor *t = &list->items[i];
        int64_t cols = t->shape[t->ndim - 1], rows = numel_of(t) / cols;
        int is_norm = t->ndim == 1;
        float scale = is_norm                       ? 0.1f
                      : t->slot == STAGE_SLOT_EMBED ? 0.866f
                                                    : 1.732f / sqrtf((float)cols);
        for (int64_t r = 0; ok && r < rows; r++) {
            for (int64_t c = 0; c < cols; c++)
                row[c] = f32_to_bf16(rng_uniform() * scale + (is_norm ? 1.0f : 0.0f));
            ok = fwrite(row, 2, (size_t)cols, f) == (size_t)cols;
        }
    }
    if (f && fclose(f)) ok = 0;
    free(entries);
    free(row);
    *total_bytes = (size_t)bytes;
    return ok ? STRATA_OK : strata_set_error(STRATA_EIO, "cannot write %s", path);
}

static int make_model(int argc, char **argv) {
    const char *out = NULL;
    int H = 1024, L = 8, V = 4096, I = 2816, nh = 16, nkv = 8, D = 64;
    char path[4096], json[2048];
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--hidden"))
            H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab"))
            V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--intermediate"))
            I = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads"))
            nh = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads"))
            nkv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim"))
            D = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            rng_state ^= strtoull(argv[i + 1], NULL, 10) * 0x2545F4914F6CDD1DULL;
        else {
            fprintf(stderr, "strata-stage-bench make-model: unknown option %s\n", argv[i]);
            return STRATA_EXIT_USAGE;
        }
    }
    if (!out || H < 8 || L < 1 || V < 8 || I < 8 || nh < 1 || nkv < 1 || nh % nkv || D < 2 ||
        D % 2) {
        fprintf(stderr, "usage: strata-stage-bench make-model --out DIR [--hidden H] [--layers L] "
                        "[--vocab V] [--intermediate I] [--heads N] [--kv-heads N] [--head-dim D] "
                        "[--seed S]\n");
        return STRATA_EXIT_USAGE;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "strata-stage-bench: mkdir %s: %s\n", out, strerror(errno));
        return STRATA_EXIT_FAILURE;
    }
    int len = format_config(json, sizeof json, H, I, L, nh, nkv, D, V);
    snprintf(path, sizeof path, "%s/config.json", out);
    FILE *f = len < 0 ? NULL : fopen(path, "w");
    if (!f || fwrite(json, 1, (size_t)len, f) != (size_t)len || fclose(f)) {
        fprintf(stderr, "strata-stage-bench: cannot write %s\n", path);
        return STRATA_EXIT_FAILURE;
    }
    /* The tensors are the manifest's for the whole model, so strata-stage loads them. */
    struct model_config cfg;
    struct stage_tensor_list list = {0};
    struct stage_role all = {0, L, 1, 1, 0};
    size_t bytes = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    int rc = model_config_parse(&cfg, json, (size_t)len, "config.json");
    if (rc == 0) rc = stage_tensor_list_build(&list, &cfg, &all, NULL);
    if (rc == 0) rc = write_weights(path, &list, &bytes);
    stage_tensor_list_free(&list);
    if (rc < 0) {
        fprintf(stderr, "strata-stage-bench: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    printf("wrote %s: qwen3 H=%d L=%d V=%d I=%d heads %d/%d D=%d, %.1f MB bf16\n", out, H, L, V, I,
           nh, nkv, D, bytes / 1e6);
    return STRATA_EXIT_OK;
}

/* ---------------------------------------------------------------- make-draft */

/* The layer index of "model.layers.<i>.<rest>", or -1 for a tensor outside the layers. */
static int layer_of(const char *name) {
    static const char prefix[] = "model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1)) return -1;
    char *end;
    long l = strtol(name + sizeof prefix - 1, &end, 10);
    return end == name + sizeof prefix - 1 || *end != '.' || l < 0 || l > 1000000 ? -1 : (int)l;
}

/* The target's config.json with num_hidden_layers N: mlp_only_layers and layer_types keep the
 * entries of the layers the draft keeps. */
static int draft_config(char **out, const char *from, int n) {
    char path[4096], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", from);
    int rc = cli_read_file_max(&text, &len, path, 1 << 20);
    if (rc < 0) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return strata_set_error(STRATA_EFORMAT, "%s: not JSON", path);
    if (cJSON_GetObjectItem(root, "text_config") || cJSON_GetObjectItem(root, "vision_config")) {
        cJSON_Delete(root);
        return strata_set_error(STRATA_EINVAL,
                                "%s: a vision-language model; a draft is a text model", path);
    }
    cJSON_ReplaceItemInObject(root, "num_hidden_layers", cJSON_CreateNumber(n));
    cJSON *mlp_only = cJSON_GetObjectItem(root, "mlp_only_layers");
    for (int i = cJSON_GetArraySize(mlp_only) - 1; cJSON_IsArray(mlp_only) && i >= 0; --i)
        if (cJSON_GetArrayItem(mlp_only, i)->valuedouble >= n)
            cJSON_DeleteItemFromArray(mlp_only, i);
    cJSON *types = cJSON_GetObjectItem(root, "layer_types");
    while (cJSON_IsArray(types) && cJSON_GetArraySize(types) > n)
        cJSON_DeleteItemFromArray(types, cJSON_GetArraySize(types) - 1);
    *out = cJSON_Print(root);
    cJSON_Delete(root);
    return *out ? STRATA_OK : strata_set_error(STRATA_ENOMEM, "out of memory");
}

/* model.safetensors of the draft: the kept tensors' bytes as they are, in the target's order. */
static int draft_weights(const char *path, const struct safetensors *st, int n, size_t *bytes) {
    const int count = safetensors_count(st);
    struct st_write_entry *entries = calloc((size_t)count + 1, sizeof *entries);
    int kept = 0;
    uint64_t total = 0;
    if (!entries) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int i = 0; i < count; ++i) {
        const struct st_tensor *t = safetensors_at(st, i);
        if (layer_of(t->name) >= n) continue;
        entries[kept] =
            (struct st_write_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(entries[kept++].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    static const char *const format[2] = {"format", "pt"};
    FILE *f = fopen(path, "wb");
    int ok = f && safetensors_write_header(f, entries, kept, format, 1, &total) == 0;
    for (int i = 0; ok && i < count; ++i) {
        const struct st_tensor *t = safetensors_at(st, i);
        if (layer_of(t->name) < n) ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
    }
    if (f && fclose(f)) ok = 0;
    free(entries);
    *bytes = (size_t)total;
    return ok ? STRATA_OK : strata_set_error(STRATA_EIO, "cannot write %s", path);
}

static int make_draft(int argc, char **argv) {
    const char *from = NULL, *out = NULL;
    int n = 0;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--from"))
            from = argv[i + 1];
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--layers"))
            n = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "strata-stage-bench make-draft: unknown option %s\n", argv[i]);
            return STRATA_EXIT_USAGE;
        }
    }
    if (!from || !out || n < 1 || argc % 2) {
        fprintf(stderr, "usage: strata-stage-bench make-draft --from DIR --layers N --out DIR\n");
        return STRATA_EXIT_USAGE;
    }
    struct model_config cfg;
    struct safetensors *st = NULL;
    char *json = NULL, path[4096];
    size_t bytes = 0;
    int rc = model_config_load(&cfg, from);
    if (rc == 0 && n >= cfg.num_layers)
        rc = strata_set_error(STRATA_ERANGE, "--layers %d: a draft has fewer than %s's %d layers",
                              n, from, cfg.num_layers);
    if (rc == 0) rc = safetensors_open(&st, from);
    if (rc == 0) rc = draft_config(&json, from, n);
    if (rc == 0 && mkdir(out, 0755) != 0 && errno != EEXIST)
        rc = strata_set_error(STRATA_EIO, "mkdir %s: %s", out, strerror(errno));
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/config.json", out);
        FILE *f = fopen(path, "w");
        if (!f || fputs(json, f) == EOF || fputc('\n', f) == EOF || fclose(f))
            rc = strata_set_error(STRATA_EIO, "cannot write %s", path);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        rc = draft_weights(path, st, n, &bytes);
    }
    free(json);
    safetensors_close(st);
    if (rc < 0) {
        fprintf(stderr, "strata-stage-bench make-draft: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    printf("wrote %s: the first %d of %s's %d layers, its embedding, norm and head, %.1f MB\n", out,
           n, from, cfg.num_layers, bytes / 1e6);
    return STRATA_EXIT_OK;
}

/* ---------------------------------------------------------------- ngram-text */

struct replay {
    int answer, steps, drafted, accepted;
};

/* Decodes answer [A] after prompt [P] as stage 0 would with n-gram drafts and k per step, a
 * model that writes exactly the answer standing in for the last stage: the first token comes
 * from the prefill; each step feeds the last token and the drafts, and emits the drafts that
 * equal the answer plus one token. */
static int replay_ngram(const int32_t *prompt, int P, const int32_t *answer, int A, int k,
                        struct replay *r) {
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(P + A + 1));
    int32_t out[WIRE_SPECULATE_MAX_K];
    if (!seq) return strata_set_error(STRATA_ENOMEM, "out of memory");
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)P);
    struct spec_pace pace;
    spec_pace_start(&pace, k);
    *r = (struct replay){.answer = A};
    int g = A > 0;
    if (g) seq[P] = answer[0];
    while (g < A) {
        int d = spec_pace_next(&pace);
        if (d > A - g - 1) d = A - g - 1; /* no drafts past the answer's end */
        const int got = d > 0 ? ngram_draft(seq, P + g, d, out) : 0;
        int acc = 0;
        while (acc < got && out[acc] == answer[g + acc])
            acc++;
        memcpy(seq + P + g, answer + g, sizeof(int32_t) * (size_t)(acc + 1));
        g += acc + 1;
        r->steps++;
        r->drafted += got;
        r->accepted += acc;
        if (got > 0) spec_pace_after(&pace, got, acc);
    }
    free(seq);
    return STRATA_OK;
}

static int encode_file(const struct tokenizer *tok, const char *path, struct tokenizer_ids *ids) {
    char *text = NULL;
    size_t len = 0;
    int rc = cli_read_file_max(&text, &len, path, 64u << 20);
    if (rc == 0) rc = tokenizer_encode(tok, text, len, ids);
    free(text);
    return rc < 0 ? strata_set_error(rc, "%s: %s", path, strata_last_error()) : STRATA_OK;
}

/* The part of path [len] after its last '/'. */
static const char *base_name(const char *path, size_t len) {
    const char *b = path + len;
    while (b > path && b[-1] != '/')
        b--;
    return b;
}

static void print_replay(const char *what, int P, const struct replay *r) {
    printf("%-44.44s %7d %7d %6d %8d %8d %8.2f %9.2f\n", what, P, r->answer, r->steps, r->drafted,
           r->accepted, r->drafted ? (double)r->accepted / r->drafted : 0.0,
           r->steps ? (double)(r->answer > 0 ? r->answer - 1 : 0) / r->steps : 1.0);
}

static int ngram_text(int argc, char **argv) {
    const char *dir = NULL;
    int k = 4;
    double share = 0.5;
    int i = 0;
    for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (!strcmp(argv[i], "--tokenizer"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--k"))
            k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt-share"))
            share = atof(argv[i + 1]);
        else
            break;
    }
    if (!dir || k < 1 || k > WIRE_SPECULATE_MAX_K || !(share > 0 && share < 1) || i >= argc) {
        fprintf(
            stderr,
            "usage: strata-stage-bench ngram-text --tokenizer DIR [--k K] [--prompt-share F] "
            "(FILE | OLD:NEW)...\n"
            "  FILE: its first F (default 0.5) of tokens the prompt, the rest the answer;\n"
            "  OLD:NEW: OLD's text then NEW's the prompt (an edit to apply), NEW the answer.\n");
        return STRATA_EXIT_USAGE;
    }
    struct tokenizer *tok = NULL;
    if (tokenizer_load(&tok, dir) < 0) {
        fprintf(stderr, "strata-stage-bench ngram-text: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    printf("n-gram drafts on real text: up to %d per step, stage 0's pace; a model writing "
           "exactly the answer verifies them\n",
           k);
    printf("%-44s %7s %7s %6s %8s %8s %8s %9s\n", "text", "prompt", "answer", "steps", "drafted",
           "accepted", "accept", "tok/step");
    struct replay total = {0};
    int rc = 0;
    for (; i < argc && rc == 0; ++i) {
        struct tokenizer_ids a = {0}, b = {0};
        const char *colon = strchr(argv[i], ':');
        int P = 0, A = 0;
        const int32_t *answer = NULL;
        char old[4096], label[256];
        snprintf(label, sizeof label, "%.200s", base_name(argv[i], strlen(argv[i])));
        if (colon) { /* OLD:NEW, labelled by the two base names */
            snprintf(old, sizeof old, "%.*s", (int)(colon - argv[i]), argv[i]);
            snprintf(label, sizeof label, "%.100s:%.100s", base_name(old, strlen(old)),
                     base_name(colon + 1, strlen(colon + 1)));
            if ((rc = encode_file(tok, old, &a)) == 0 &&
                (rc = encode_file(tok, colon + 1, &b)) == 0) {
                P = (int)a.n;
                A = (int)b.n;
                answer = b.ids;
            }
        } else if ((rc = encode_file(tok, argv[i], &a)) == 0) {
            P = (int)(share * (double)a.n);
            A = (int)a.n - P;
            answer = a.ids + P;
        }
        struct replay r = {0};
        if (rc == 0 && P + A > (1 << 24))
            rc = strata_set_error(STRATA_ERANGE, "%s: more than 16M tokens", argv[i]);
        if (rc == 0 && (rc = replay_ngram(a.ids, P, answer, A, k, &r)) == 0) {
            print_replay(label, P, &r);
            total.answer += r.answer;
            total.steps += r.steps;
            total.drafted += r.drafted;
            total.accepted += r.accepted;
        }
        tokenizer_ids_free(&a);
        tokenizer_ids_free(&b);
    }
    tokenizer_free(tok);
    if (rc < 0) {
        fprintf(stderr, "strata-stage-bench ngram-text: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    print_replay("all", 0, &total);
    printf("(tok/step: answer tokens after the first per decode step; without drafts 1.00)\n");
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "make-model")) return make_model(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "make-draft")) return make_draft(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "ngram-text")) return ngram_text(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "hop")) return stage_bench_hop(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "probe-link"))
        return stage_bench_probe_link(argc - 2, argv + 2);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: strata-stage-bench make-model --out DIR [size options]\n"
               "       strata-stage-bench make-draft --from DIR --layers N --out DIR\n"
               "       strata-stage-bench ngram-text --tokenizer DIR [--k K] [--prompt-share F] "
               "(FILE | OLD:NEW)...\n"
               "       strata-stage-bench hop [--hidden H] [--iters N] [--tls psk|off]\n"
               "       strata-stage-bench probe-link (--listen | --connect HOST:PORT) ... "
               "(probe-link --help)\n"
               "Helpers for the benchmarks: a random-weight Qwen3 checkpoint; a draft model made\n"
               "of a checkpoint's first N layers (its embedding, norm and head kept); what n-gram\n"
               "drafts would accept on real text; the per-hop latency of a decode hidden state\n"
               "over TCP loopback; a link between two boxes as the stages' frames cross it.\n");
        return STRATA_EXIT_OK;
    }
    fprintf(
        stderr,
        "usage: strata-stage-bench make-model ... | make-draft ... | ngram-text ... | hop ... |\n"
        "       probe-link ... | --help\n");
    return STRATA_EXIT_USAGE;
}
