/* strata-stage: one process of a pipeline. Loads the weights of its layer range, prints what
 * it serves, and runs the TCP stage loop (runtime/stage/stage_server.h) until SIGINT/SIGTERM.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage (including an empty or out-of-range shard),
 * 3 bad model, config, weights or KV file. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/model.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_server.h"
#include "wire/auth.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-stage (--model DIR | --hf-config FILE --weights PATH)\n"
            "                    --num-stages S (--stage-idx R | --stage-idx R --layer-start A "
            "--layer-end B)\n"
            "                    [--listen [ADDR:]PORT] [--port-file F]\n"
            "                    [--next-host H] (--next-port P | --next-port-file F)\n"
            "                    [options]\n"
            "Runs stage R of an S-stage pipeline over TCP. Stage 0 embeds and serves clients;\n"
            "the last stage samples and sends tokens back to stage 0 (--next-* of the last\n"
            "stage point at stage 0).\n"
            "  --model DIR            Hugging Face model directory (config.json + safetensors)\n"
            "  --hf-config FILE       config.json (with --weights)\n"
            "  --weights PATH         model.safetensors, its directory or an index.json\n"
            "  --num-stages S         pipeline length (>= 1)\n"
            "  --stage-idx R          this stage (0 .. S-1); layers default to the even split\n"
            "  --layer-start A --layer-end B  explicit layer range [A, B)\n"
            "  --listen [ADDR:]PORT   listen address (default 127.0.0.1:0 = any free port)\n"
            "  --port-file F          write the bound port to F\n"
            "  --next-host H          next stage host (default 127.0.0.1)\n"
            "  --next-port P          next stage port\n"
            "  --next-port-file F     read the next stage's port from F (re-read on reconnect)\n"
            "  --device cpu|cuda:N    compute device (only cpu in this build)\n"
            "  --threads T            matmul threads (default 1)\n"
            "  --max-seq N            KV positions per request (default 512)\n"
            "  --max-batch B          concurrent requests = KV slots (default 8)\n"
            "  --chunk-size C         prefill chunk rows (default 64)\n"
            "  --send-kv              send each request's KV after its prefill activation\n"
            "  --recv-kv              accept KV blocks from upstream\n"
            "  --kv-out FILE          write received KV blocks to FILE\n"
            "  --kv-restore FILE      restore a KV block (equal layer range only) at start\n"
            "  --out FILE             last stage: tokens + logits of the latest finished\n"
            "                         request, rewritten atomically as each one finishes\n"
            "                         (safetensors: tokens I32 [n], logits F32 [n, V])\n"
            "  --auth-key-file F      pre-shared key (else $STRATA_AUTH_KEY; none = no auth)\n"
            "  --peer-timeout-ms MS   a neighbour silent this long is dead (pinged; default "
            "10000, 0 = off)\n"
            "  --step-delay-ms MS     testing: sleep before each microbatch (a slow device)\n"
            "  --log-level L          error|warn|info|debug (default info)\n"
            "  --help                 this text\n"
            "Exit codes: 0 ok (stopped by SIGINT/SIGTERM), 1 runtime failure (listen, device),\n"
            "2 bad command line or shard, 3 bad model, config or weights.\n");
}

struct args {
    const char *model_dir, *hf_config, *weights;
    int num_stages, stage_idx, layer_start, layer_end;
    const char *listen, *port_file, *next_host, *next_port_file;
    int next_port;
    const char *device;
    int threads, max_seq, max_batch, chunk_size;
    int send_kv, recv_kv, step_delay_ms, peer_timeout_ms;
    const char *kv_out, *kv_restore, *out, *auth_key_file;
    enum stage_log_level log_level;
};

static int parse_int(const char *text, int lo, int hi, int *out, const char *flag) {
    char *end;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < lo || v > hi) {
        fprintf(stderr, "strata-stage: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi,
                text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(struct args *a, int argc, char **argv) {
    enum {
        O_MODEL = 1000,
        O_HF_CONFIG,
        O_WEIGHTS,
        O_NUM_STAGES,
        O_STAGE_IDX,
        O_LAYER_START,
        O_LAYER_END,
        O_LISTEN,
        O_PORT_FILE,
        O_NEXT_HOST,
        O_NEXT_PORT,
        O_NEXT_PORT_FILE,
        O_DEVICE,
        O_THREADS,
        O_MAX_SEQ,
        O_MAX_BATCH,
        O_CHUNK,
        O_SEND_KV,
        O_RECV_KV,
        O_KV_OUT,
        O_KV_RESTORE,
        O_OUT,
        O_AUTH,
        O_LOG,
        O_DELAY,
        O_PEER_TIMEOUT,
        O_HELP
    };
    static const struct option options[] = {{"model", 1, 0, O_MODEL},
                                            {"hf-config", 1, 0, O_HF_CONFIG},
                                            {"weights", 1, 0, O_WEIGHTS},
                                            {"num-stages", 1, 0, O_NUM_STAGES},
                                            {"stage-idx", 1, 0, O_STAGE_IDX},
                                            {"layer-start", 1, 0, O_LAYER_START},
                                            {"layer-end", 1, 0, O_LAYER_END},
                                            {"listen", 1, 0, O_LISTEN},
                                            {"port-file", 1, 0, O_PORT_FILE},
                                            {"next-host", 1, 0, O_NEXT_HOST},
                                            {"next-port", 1, 0, O_NEXT_PORT},
                                            {"next-port-file", 1, 0, O_NEXT_PORT_FILE},
                                            {"device", 1, 0, O_DEVICE},
                                            {"threads", 1, 0, O_THREADS},
                                            {"max-seq", 1, 0, O_MAX_SEQ},
                                            {"max-batch", 1, 0, O_MAX_BATCH},
                                            {"chunk-size", 1, 0, O_CHUNK},
                                            {"send-kv", 0, 0, O_SEND_KV},
                                            {"recv-kv", 0, 0, O_RECV_KV},
                                            {"kv-out", 1, 0, O_KV_OUT},
                                            {"kv-restore", 1, 0, O_KV_RESTORE},
                                            {"out", 1, 0, O_OUT},
                                            {"auth-key-file", 1, 0, O_AUTH},
                                            {"log-level", 1, 0, O_LOG},
                                            {"step-delay-ms", 1, 0, O_DELAY},
                                            {"peer-timeout-ms", 1, 0, O_PEER_TIMEOUT},
                                            {"help", 0, 0, O_HELP},
                                            {0, 0, 0, 0}};
    int c, rc = 0;
    memset(a, 0, sizeof *a);
    a->num_stages = 1;
    a->stage_idx = -1;
    a->layer_start = a->layer_end = -1;
    a->device = "cpu";
    a->threads = 1;
    a->max_seq = 512;
    a->max_batch = 8;
    a->chunk_size = 64;
    a->log_level = STAGE_LOG_INFO;
    a->peer_timeout_ms = 10000;
    while (rc == 0 && (c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case O_MODEL: a->model_dir = optarg; break;
        case O_HF_CONFIG: a->hf_config = optarg; break;
        case O_WEIGHTS: a->weights = optarg; break;
        case O_NUM_STAGES: rc = parse_int(optarg, 1, 4096, &a->num_stages, "--num-stages"); break;
        case O_STAGE_IDX: rc = parse_int(optarg, 0, 4095, &a->stage_idx, "--stage-idx"); break;
        case O_LAYER_START:
            rc = parse_int(optarg, 0, MODEL_CONFIG_MAX_LAYERS, &a->layer_start, "--layer-start");
            break;
        case O_LAYER_END:
            rc = parse_int(optarg, 0, MODEL_CONFIG_MAX_LAYERS, &a->layer_end, "--layer-end");
            break;
        case O_LISTEN: a->listen = optarg; break;
        case O_PORT_FILE: a->port_file = optarg; break;
        case O_NEXT_HOST: a->next_host = optarg; break;
        case O_NEXT_PORT: rc = parse_int(optarg, 1, 65535, &a->next_port, "--next-port"); break;
        case O_NEXT_PORT_FILE: a->next_port_file = optarg; break;
        case O_DEVICE: a->device = optarg; break;
        case O_THREADS: rc = parse_int(optarg, 1, 1024, &a->threads, "--threads"); break;
        case O_MAX_SEQ: rc = parse_int(optarg, 1, 1 << 24, &a->max_seq, "--max-seq"); break;
        case O_MAX_BATCH: rc = parse_int(optarg, 1, 4096, &a->max_batch, "--max-batch"); break;
        case O_CHUNK: rc = parse_int(optarg, 1, 1 << 20, &a->chunk_size, "--chunk-size"); break;
        case O_SEND_KV: a->send_kv = 1; break;
        case O_RECV_KV: a->recv_kv = 1; break;
        case O_KV_OUT: a->kv_out = optarg; break;
        case O_KV_RESTORE: a->kv_restore = optarg; break;
        case O_OUT: a->out = optarg; break;
        case O_AUTH: a->auth_key_file = optarg; break;
        case O_PEER_TIMEOUT:
            rc = parse_int(optarg, 0, 3600000, &a->peer_timeout_ms, "--peer-timeout-ms");
            break;
        case O_DELAY: rc = parse_int(optarg, 0, 60000, &a->step_delay_ms, "--step-delay-ms"); break;
        case O_LOG:
            if (!strcmp(optarg, "error"))
                a->log_level = STAGE_LOG_ERROR;
            else if (!strcmp(optarg, "warn"))
                a->log_level = STAGE_LOG_WARN;
            else if (!strcmp(optarg, "info"))
                a->log_level = STAGE_LOG_INFO;
            else if (!strcmp(optarg, "debug"))
                a->log_level = STAGE_LOG_DEBUG;
            else {
                fprintf(stderr, "strata-stage: --log-level is error|warn|info|debug\n");
                rc = -1;
            }
            break;
        case O_HELP: return 1;
        default: rc = -1;
        }
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "strata-stage: unexpected argument '%s'\n", argv[optind]);
        rc = -1;
    }
    if (rc == 0 && a->model_dir && (a->hf_config || a->weights)) {
        fprintf(stderr, "strata-stage: give either --model DIR or --hf-config FILE --weights "
                        "PATH, not both\n");
        rc = -1;
    }
    if (rc == 0 && !a->model_dir && !(a->hf_config && a->weights)) {
        fprintf(stderr, "strata-stage: give --model DIR or --hf-config FILE --weights PATH\n");
        rc = -1;
    }
    if (rc == 0 && a->stage_idx < 0) {
        if (a->num_stages == 1)
            a->stage_idx = 0;
        else {
            fprintf(stderr, "strata-stage: --stage-idx is required with --num-stages > 1\n");
            rc = -1;
        }
    }
    if (rc == 0 && a->stage_idx >= a->num_stages) {
        fprintf(stderr, "strata-stage: --stage-idx %d is outside [0, %d)\n", a->stage_idx,
                a->num_stages);
        rc = -1;
    }
    if (rc == 0 && a->num_stages > 1 && !a->next_port && !a->next_port_file) {
        fprintf(stderr, "strata-stage: --next-port or --next-port-file is required with "
                        "--num-stages > 1\n");
        rc = -1;
    }
    if (rc == 0 && (a->layer_start < 0) != (a->layer_end < 0)) {
        fprintf(stderr, "strata-stage: give both --layer-start and --layer-end\n");
        rc = -1;
    }
    return rc;
}

/* Splits "ADDR:PORT" or "PORT". */
static int parse_listen(const char *text, char *host, size_t cap, int *port) {
    const char *colon = text ? strrchr(text, ':') : NULL;
    snprintf(host, cap, "127.0.0.1");
    *port = 0;
    if (!text) return 0;
    if (colon) {
        if (colon > text) /* ":PORT" keeps the default address */
            snprintf(host, cap, "%.*s", (int)(colon - text), text);
        text = colon + 1;
    }
    return parse_int(text, 0, 65535, port, "--listen");
}

static int read_whole_file(char **out, size_t *len, const char *path) {
    FILE *f = fopen(path, "rb");
    long size;
    *out = NULL;
    if (!f) return strata_set_error(STRATA_ENOTFOUND, "cannot open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return strata_set_error(STRATA_EIO, "cannot read %s", path);
    }
    *out = malloc((size_t)size + 1);
    if (!*out || fread(*out, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        free(*out);
        *out = NULL;
        return strata_set_error(STRATA_EIO, "cannot read %s", path);
    }
    fclose(f);
    *len = (size_t)size;
    return 0;
}

/* Lists every tensor the shard needs that the checkpoint lacks or has in another shape,
 * all of them (the status message alone is truncated), before loading anything. */
static int check_tensors(const struct model_config *cfg, const struct safetensors *st,
                         const struct args *a) {
    struct stage_tensor_list list;
    struct stage_role role = {.layer_start = a->layer_start,
                              .layer_end = a->layer_end,
                              .with_embed = a->stage_idx == 0,
                              .with_head = a->stage_idx == a->num_stages - 1};
    const char *source = a->model_dir ? a->model_dir : a->weights;
    int rc;
    memset(&list, 0, sizeof list);
    rc = stage_tensor_list_build(&list, cfg, &role, st);
    if (rc == 0) rc = stage_tensor_list_check(&list, st, source);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        if (list.count > 0) {
            fprintf(stderr,
                    "strata-stage: every missing or mis-shaped tensor of layers [%d, %d):\n",
                    a->layer_start, a->layer_end);
            stage_tensor_list_report(stderr, &list, st);
        }
    }
    stage_tensor_list_free(&list);
    return rc;
}

int main(int argc, char **argv) {
    struct args a;
    struct model_config cfg;
    struct safetensors *st = NULL;
    struct reference_model *model = NULL;
    struct stage_core *core = NULL;
    struct wire_auth_key key;
    struct stage_server_options so;
    struct stage_core_options co;
    char config_path[4096], listen_host[256], summary[512], *config_json = NULL;
    size_t config_len = 0;
    int code = STRATA_EXIT_FAILURE, L, first, last;
    memset(&key, 0, sizeof key);
    int parsed = parse_args(&a, argc, argv), listen_port;
    if (parsed == 1) {
        usage(stdout);
        return STRATA_EXIT_OK;
    }
    if (parsed < 0) {
        /* The message above names the problem; the full flag list is one --help away. */
        fprintf(stderr, "usage: strata-stage --model DIR --num-stages S --stage-idx R ... "
                        "(strata-stage --help lists every flag)\n");
        return STRATA_EXIT_USAGE;
    }
    stage_log_setup(a.stage_idx, a.log_level);
    if (parse_listen(a.listen, listen_host, sizeof listen_host, &listen_port) < 0)
        return STRATA_EXIT_USAGE;
    if (strcmp(a.device, "cpu") != 0) {
        fprintf(stderr,
                "strata-stage: device '%s' is not available: this build runs the CPU "
                "reference backend only (--device cpu)\n",
                a.device);
        return strncmp(a.device, "cuda:", 5) == 0 ? STRATA_EXIT_FAILURE : STRATA_EXIT_USAGE;
    }
    if (a.model_dir)
        snprintf(config_path, sizeof config_path, "%s/config.json", a.model_dir);
    else
        snprintf(config_path, sizeof config_path, "%s", a.hf_config);
    if (read_whole_file(&config_json, &config_len, config_path) < 0 ||
        model_config_parse(&cfg, config_json, config_len, config_path) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    L = cfg.num_layers;
    if (a.layer_start < 0) { /* even split (runtime/model/stage_plan.h) */
        struct stage_range *ranges = calloc((size_t)a.num_stages, sizeof *ranges);
        if (!ranges || stage_plan_even(ranges, L, a.num_stages) < 0) {
            fprintf(stderr,
                    "strata-stage: stage %d of %d: the shard is empty or out of range: %s\n",
                    a.stage_idx, a.num_stages, ranges ? strata_last_error() : "out of memory");
            free(ranges);
            code = STRATA_EXIT_USAGE;
            goto done;
        }
        a.layer_start = ranges[a.stage_idx].layer_start;
        a.layer_end = ranges[a.stage_idx].layer_end;
        free(ranges);
    }
    first = a.stage_idx == 0;
    last = a.stage_idx == a.num_stages - 1;
    if (a.layer_start >= a.layer_end || a.layer_end > L || (first && a.layer_start != 0) ||
        (last && a.layer_end != L)) {
        fprintf(stderr,
                "strata-stage: stage %d of %d gets layers [%d, %d) of a %d-layer model: the shard "
                "is empty or out of range (stage 0 must start at 0, the last must end at %d)\n",
                a.stage_idx, a.num_stages, a.layer_start, a.layer_end, L, L);
        code = STRATA_EXIT_USAGE;
        goto done;
    }
    if (safetensors_open(&st, a.model_dir ? a.model_dir : a.weights) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    if (check_tensors(&cfg, st, &a) < 0) {
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    if (reference_model_load(&model, &cfg, st,
                             &(struct reference_load_options){.layer_start = a.layer_start,
                                                              .layer_end = a.layer_end,
                                                              .with_embed = first,
                                                              .with_head = last,
                                                              .num_threads = a.threads}) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        code = STRATA_EXIT_INPUT;
        goto done;
    }
    memset(&co, 0, sizeof co);
    co.cfg = &cfg;
    co.model = model;
    co.stage_index = a.stage_idx;
    co.num_stages = a.num_stages;
    co.layer_start = a.layer_start;
    co.layer_end = a.layer_end;
    co.max_seq = a.max_seq;
    co.max_batch = a.max_batch;
    co.chunk_size = a.chunk_size;
    co.keep_logits = last && a.out != NULL;
    co.send_kv = a.send_kv;
    if (stage_core_init(&core, &co) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        goto done;
    }
    model_config_describe(&cfg, summary, sizeof summary);
    printf("strata-stage %d of %d\n", a.stage_idx, a.num_stages);
    printf("config: %s\n", summary);
    printf("config: hidden %d, heads %d, kv heads %d, head_dim %d, layers %d, vocab %d, MoE %s",
           cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, L, cfg.vocab_size,
           cfg.num_experts > 0 ? "yes" : "no");
    if (cfg.num_experts > 0)
        printf(" (%d experts, top-%d)", cfg.num_experts, cfg.num_experts_per_tok);
    printf("\nshard: layers [%d, %d) of %d%s%s\n", a.layer_start, a.layer_end, L,
           first ? ", embedding" : "", last ? ", final norm + lm_head" : "");
    printf("device: cpu, %d thread%s\n", a.threads, a.threads == 1 ? "" : "s");
    printf("weights: %d tensors, %zu bytes (+%zu bytes widened)\n",
           reference_model_num_tensors(model), reference_model_weight_bytes(model),
           reference_model_extra_bytes(model));
    printf("kv cache: %d slots x %d positions = %zu bytes\n", a.max_batch, a.max_seq,
           stage_core_kv_bytes(core));
    fflush(stdout);
    if (a.kv_restore) {
        char *kv_bytes = NULL;
        size_t kv_len = 0;
        uint64_t nonce;
        int positions;
        if (read_whole_file(&kv_bytes, &kv_len, a.kv_restore) < 0 ||
            stage_core_restore_kv(core, &nonce, &positions, (const uint8_t *)kv_bytes, kv_len) <
                0) {
            fprintf(stderr, "strata-stage: --kv-restore %s: %s\n", a.kv_restore,
                    strata_last_error());
            free(kv_bytes);
            code = STRATA_EXIT_INPUT;
            goto done;
        }
        free(kv_bytes);
        printf("kv restore: request %llu, %d positions, layers [%d, %d) from %s\n",
               (unsigned long long)nonce, positions, a.layer_start, a.layer_end, a.kv_restore);
        fflush(stdout);
    }
    if (wire_auth_key_load(&key, a.auth_key_file, NULL) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        code = STRATA_EXIT_USAGE;
        goto done;
    }
    memset(&so, 0, sizeof so);
    so.listen_port = listen_port;
    so.stage_index = a.stage_idx;
    so.num_stages = a.num_stages;
    so.layer_start = a.layer_start;
    so.layer_end = a.layer_end;
    so.num_layers = L;
    so.listen_host = listen_host;
    so.port_file = a.port_file;
    so.next_host = a.next_host;
    so.next_port = a.next_port;
    so.next_port_file = a.next_port_file;
    so.key = &key;
    so.recv_kv = a.recv_kv;
    so.kv_out_path = a.kv_out;
    so.out_path = last ? a.out : NULL;
    so.log_level = a.log_level;
    so.step_delay_ms = a.step_delay_ms;
    so.peer_timeout_ms = a.peer_timeout_ms;
    if (wire_model_fingerprint(so.fingerprint, config_json, config_len, "float32") < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        goto done;
    }
    if (a.out && !last)
        strata_log(STRATA_LOG_WARN, "--out is written by the last stage only; ignored here");
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (stage_server_run(core, &so, &stop_flag) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        goto done;
    }
    code = STRATA_EXIT_OK;
done:
    stage_core_free(core);
    reference_model_free(model);
    safetensors_close(st);
    wire_auth_key_clear(&key);
    free(config_json);
    return code;
}
