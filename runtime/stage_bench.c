/* strata-stage-bench: helpers for tools/bench_pipeline.sh.
 *   make-model  writes a random-weight Qwen3 checkpoint (config.json + bf16 safetensors) big
 *               enough that compute, not messaging, dominates a decode step — the committed
 *               goldens are tiny — deterministic for a seed.
 *   hop         per-hop latency of one decode hidden state [1, H]: two threads ping-pong a
 *               real Activation frame over a TCP loopback connection (build, length-prefixed
 *               send, receive, verify + read, decode to f32 on each side); one hop = RTT / 2.
 * Exit codes: 0 ok, 1 failure, 2 usage. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/stage_tensors.h"
#include "wire/codec.h"
#include "wire/message.h"
#include "wire/tls.h"
#include "wire/transport.h"

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
    size_t header_cap = 256 + (size_t)list->count * (STAGE_TENSOR_NAME_MAX + 128);
    size_t header_len = 0, offset = 0, row_cap = 1;
    char *header = malloc(header_cap);
    if (!header) return strata_set_error(STRATA_ENOMEM, "out of memory");
    for (int i = 0; i < list->count; i++) {
        const struct stage_tensor *t = &list->items[i];
        size_t bytes = (size_t)numel_of(t) * 2;
        if ((size_t)t->shape[t->ndim - 1] > row_cap) row_cap = (size_t)t->shape[t->ndim - 1];
        header_len +=
            (size_t)snprintf(header + header_len, header_cap - header_len,
                             "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[", i ? "," : "{", t->name);
        for (int d = 0; d < t->ndim; d++)
            header_len += (size_t)snprintf(header + header_len, header_cap - header_len, "%s%lld",
                                           d ? "," : "", (long long)t->shape[d]);
        header_len += (size_t)snprintf(header + header_len, header_cap - header_len,
                                       "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    header_len += (size_t)snprintf(header + header_len, header_cap - header_len, "}");
    while (header_len % 8)
        header[header_len++] = ' ';
    uint16_t *row = malloc(sizeof(uint16_t) * row_cap);
    FILE *f = fopen(path, "wb");
    int ok = f && row;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)((uint64_t)header_len >> (8 * i));
    ok = ok && fwrite(prefix, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len;
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
    free(header);
    free(row);
    *total_bytes = offset;
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

static double now_us(void) {
    return (double)cli_now_ns() * 1e-3;
}

struct hop_side {
    struct wire_conn conn;
    struct wire_arena arena;
    float *out; /* [H] what this side sends */
    float *in;  /* [H] what it received, decoded */
    int hidden;
    int iters;
    int status;
    struct wire_tls *tls; /* server side: the TLS handshake runs on the echo thread */
};

/* One hop: build the activation of a decode row, send it; the peer receives, verifies,
 * reads and decodes it into its buffer. */
static int send_hidden(struct hop_side *s, uint64_t step) {
    struct wire_activation msg;
    memset(&msg, 0, sizeof msg);
    msg.stage_from = 0;
    msg.stage_to = 1;
    msg.step = step;
    msg.pos = step;
    msg.nonce = 1;
    msg.hidden = (struct wire_tensor){.defined = 1,
                                      .dtype = WIRE_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {1, s->hidden},
                                      .codec = WIRE_CODEC_NONE,
                                      .data = s->out,
                                      .nbytes = sizeof(float) * (size_t)s->hidden};
    int rc = wire_build_activation(&s->arena, &msg);
    if (rc == 0)
        rc = wire_send_frame(&s->conn, wire_arena_frame(&s->arena), wire_arena_frame_len(&s->arena),
                             5000);
    return rc;
}

static int recv_hidden(struct hop_side *s, uint64_t step) {
    const uint8_t *frame;
    size_t len;
    struct wire_activation msg;
    int rc = wire_recv_frame(&s->conn, &frame, &len, 5000);
    if (rc == 0) rc = wire_read_activation(&msg, frame, len);
    if (rc == 0 && (msg.step != step || msg.hidden.shape[1] != s->hidden))
        rc = strata_set_error(STRATA_EFORMAT, "hop bench: frame out of order");
    if (rc == 0) rc = wire_tensor_decode_f32(s->in, &msg.hidden);
    return rc;
}

static void *echo_main(void *arg) {
    struct hop_side *s = arg;
    if (s->tls) s->status = wire_tls_accept(&s->conn, s->tls, 2000);
    for (int i = 0; i < s->iters && s->status == 0; i++) {
        s->status = recv_hidden(s, (uint64_t)i);
        if (s->status == 0) {
            memcpy(s->out, s->in, sizeof(float) * (size_t)s->hidden);
            s->status = send_hidden(s, (uint64_t)i);
        }
    }
    return NULL;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* hop's flags: 0, or the usage exit code after printing the usage line. */
static int hop_args(int argc, char **argv, int *H, int *iters, int *psk) {
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden"))
            *H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            *iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tls") &&
                 (!strcmp(argv[i + 1], "psk") || !strcmp(argv[i + 1], "off")))
            *psk = !strcmp(argv[i + 1], "psk");
        else {
            fprintf(stderr,
                    "usage: strata-stage-bench hop [--hidden H] [--iters N] [--tls psk|off]\n");
            return STRATA_EXIT_USAGE;
        }
    }
    if (*H < 1 || *iters < 10) {
        fprintf(stderr, "usage: strata-stage-bench hop [--hidden H >= 1] [--iters N >= 10]\n");
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

static int hop(int argc, char **argv) {
    int H = 4096, iters = 5000, warmup = 500, rc = 0, psk = 0;
    struct wire_listener listener = {.fd = -1};
    struct hop_side a, b;
    pthread_t echo;
    double *one_way;
    if (hop_args(argc, argv, &H, &iters, &psk)) return STRATA_EXIT_USAGE;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.conn.fd = b.conn.fd = -1;
    a.hidden = b.hidden = H;
    b.iters = iters + warmup;
    one_way = malloc(sizeof(double) * (size_t)iters);
    a.out = malloc(sizeof(float) * (size_t)H);
    a.in = malloc(sizeof(float) * (size_t)H);
    b.out = malloc(sizeof(float) * (size_t)H);
    b.in = malloc(sizeof(float) * (size_t)H);
    if (!one_way || !a.out || !a.in || !b.out || !b.in) return STRATA_EXIT_FAILURE;
    for (int i = 0; i < H; i++)
        a.out[i] = rng_uniform();
    if ((rc = wire_arena_init(&a.arena, 0)) < 0 || (rc = wire_arena_init(&b.arena, 0)) < 0 ||
        (rc = wire_listen(&listener, NULL, 0)) < 0 ||
        (rc = wire_connect(&a.conn, NULL, listener.port, 0, 2000)) < 0 ||
        (rc = wire_accept(&b.conn, &listener, 0, 2000)) < 0)
        goto done;
    if (psk) { /* TLS 1.3 with an external PSK, as strata-stage --auth-key-file runs it */
        struct wire_auth_key key = {.len = 32};
        memset(key.bytes, 'k', key.len);
        rc = wire_tls_new(&b.tls, &(struct wire_tls_options){.psk = &key});
        if (rc < 0) goto done;
    }
    if (pthread_create(&echo, NULL, echo_main, &b) != 0) {
        rc = strata_set_error(STRATA_EIO, "cannot start the echo thread");
        goto done;
    }
    if (psk) rc = wire_tls_connect(&a.conn, b.tls, 2000); /* one context serves both sides */
    for (int i = 0; i < iters + warmup && rc == 0; i++) {
        double t0 = now_us();
        rc = send_hidden(&a, (uint64_t)i);
        if (rc == 0) rc = recv_hidden(&a, (uint64_t)i);
        if (i >= warmup) one_way[i - warmup] = (now_us() - t0) / 2;
    }
    pthread_join(echo, NULL);
    if (rc == 0 && b.status != 0) rc = b.status;
    if (rc == 0 && memcmp(a.in, a.out, sizeof(float) * (size_t)H) != 0)
        rc = strata_set_error(STRATA_EFORMAT, "hop bench: hidden state changed in transit");
    if (rc == 0) {
        qsort(one_way, (size_t)iters, sizeof(double), compare_double);
        printf(
            "per-hop latency%s, decode hidden state [1, %d] f32 (%zu bytes), %d hops: p50 %.1f us, "
            "p99 %.1f us (goal p50 <= 60 us)\n",
            psk ? " over TLS 1.3 (PSK)" : "", H, sizeof(float) * (size_t)H, iters,
            one_way[iters / 2], one_way[(size_t)(iters * 0.99)]);
    }
done:
    if (rc < 0) fprintf(stderr, "strata-stage-bench hop: %s\n", strata_last_error());
    wire_close(&a.conn);
    wire_close(&b.conn);
    wire_tls_free(b.tls);
    wire_listener_close(&listener);
    wire_arena_free(&a.arena);
    wire_arena_free(&b.arena);
    free(one_way);
    free(a.out);
    free(a.in);
    free(b.out);
    free(b.in);
    return rc < 0 ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "make-model")) return make_model(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "hop")) return hop(argc - 2, argv + 2);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: strata-stage-bench make-model --out DIR [size options] | hop [--hidden H] "
               "[--iters N] [--tls psk|off]\n"
               "Helpers for tools/bench_pipeline.sh: a random-weight Qwen3 checkpoint, and the "
               "per-hop latency of a decode hidden state over TCP loopback.\n");
        return STRATA_EXIT_OK;
    }
    fprintf(stderr, "usage: strata-stage-bench make-model ... | hop ... | --help\n");
    return STRATA_EXIT_USAGE;
}
