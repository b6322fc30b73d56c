/* strata-stage: one process of a pipeline. Loads the weights of its layer range, prints what
 * it serves, and runs the TCP stage loop (runtime/stage/stage_server.h) until SIGINT/SIGTERM.
 * With --tp T it is one rank of its stage's tensor-parallel group (runtime/stage/stage_tp.h):
 * rank 0 serves the stage and leads, the others follow rank 0 until it stops.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage (including an empty or out-of-range shard),
 * 3 bad model, config, weights or KV file. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"
#include "runtime/stage/stage_server.h"
#include "runtime/stage/stage_tp.h"
#include "wire/auth.h"
#include "wire/tls.h"

static volatile sig_atomic_t stop_flag;

/* --role vision: the vision stage (runtime/strata_vision_main.c) takes the command line. */
int strata_vision_main(int argc, char **argv);

static int role_is_vision(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--role") && i + 1 < argc) return !strcmp(argv[i + 1], "vision");
        if (!strcmp(argv[i], "--role=vision")) return 1;
    }
    return 0;
}

/* The first SIGINT/SIGTERM starts the drain (stage_server_run), a second one ends it. */
static void on_signal(int sig) {
    (void)sig;
    if (stop_flag < 2) stop_flag = stop_flag + 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-stage (--model DIR | --hf-config FILE --weights PATH)\n"
            "                    --num-stages S (--stage-idx R | --stage-idx R --layer-start A "
            "--layer-end B)\n"
            "                    [--listen [ADDR:]PORT] [--port-file F]\n"
            "                    [--next-host H] (--next-port P | --next-port-file F)\n"
            "                    [options]\n"
            "       strata-stage --role vision --model DIR --next-port P ... (see --role vision "
            "--help)\n"
            "Runs stage R of an S-stage pipeline over TCP. Stage 0 embeds and serves clients;\n"
            "the last stage samples and sends tokens back to stage 0 (--next-* of the last\n"
            "stage point at stage 0).\n"
            "  --model DIR            Hugging Face model directory (config.json + safetensors)\n"
            "  --role language|vision language (default): a decoder-layer stage; vision: the\n"
            "                         vision stage in front of stage 0 (image files in)\n"
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
            "  --device cpu|cuda:N    compute backend: cpu (default) or GPU N (refused, with the\n"
            "                         reason, where the build or machine has no CUDA)\n"
            "  --threads T            matmul threads (default 1)\n"
            "  --weights-dtype D      bf16 (default: as stored) or q8 (8-bit blocks quantised at\n"
            "                         load, cpu only; other logits than bf16, so every stage of\n"
            "                         a pipeline must use the same: it is in the Hello's model\n"
            "                         fingerprint)\n"
            "  --max-seq N            KV positions per request (default 512)\n"
            "  --max-batch B          concurrent requests = KV slots (default 8)\n"
            "  --chunk-size C         prefill chunk rows (default 64)\n"
            "  --send-kv              send each request's KV after its prefill activation (on\n"
            "                         every stage: stage 0 keeps the later stages' blocks and a\n"
            "                         recovery replay restores them instead of recomputing)\n"
            "  --recv-kv              accept KV blocks from upstream\n"
            "  --kv-out FILE          write received KV blocks to FILE\n"
            "  --kv-restore FILE      restore a KV block (equal layer range only) at start\n"
            "  --out FILE             last stage: tokens + logits of the latest finished\n"
            "                         request, rewritten atomically as each one finishes\n"
            "                         (safetensors: tokens I32 [n], logits F32 [n, V])\n"
            "  --auth-key-file F      pre-shared key (else $STRATA_AUTH_KEY): TLS 1.3 on every\n"
            "                         link with it as external PSK (identity \"strata\")\n"
            "  --tls-cert F --tls-key F --tls-ca F   TLS 1.3 with this stage's certificate\n"
            "                         (PEM chain) and key; peers must present certificates\n"
            "                         from this CA (mutual authentication)\n"
            "  --insecure             plaintext links (warned at startup; with a key the Hello\n"
            "                         is still HMAC-authenticated). One of a key, certificates\n"
            "                         or --insecure is required (exit 2 without)\n"
            "  --peer-timeout-ms MS   a neighbour silent this long is dead (pinged; default "
            "10000, 0 = off)\n"
            "Tensor parallelism (each TP rank is its own strata-stage with the same stage flags):\n"
            "  --tp T                 TP degree of this stage: 1, 2, 4 or 8 (default 1)\n"
            "  --tp-rank R            this process's TP rank (0 .. T-1); rank 0 serves the stage\n"
            "                         and leads, the others follow it (no --listen / --next-*;\n"
            "                         they ignore SIGTERM/SIGINT and exit with their leader)\n"
            "  --kvp K --kvp-rank R   KV parallelism: this rank holds KV positions\n"
            "                         [R*N, (R+1)*N) of every request (Medha; N = --kvp-tokens,\n"
            "                         default ceil(max-seq / K) rounded up to 16 x 2^p); the\n"
            "                         stage's group is T x K\n"
            "                         ranks, group rank = R_kvp * T + R_tp\n"
            "  --kvp-tokens N         KV positions per KVP rank, 16 x a power of two\n"
            "  --tp-peers LIST        every group rank's address in group-rank order, "
            "comma-separated:\n"
            "                         HOST:PORT, or HOST:@FILE (listen on a free port, written to\n"
            "                         FILE; the other ranks read it there)\n"
            "  --moe expert|split     MoE under TP: whole experts per rank (default) or every\n"
            "                         expert's columns split\n"
            "  --tp-tcp               keep the group on TCP (default: shared memory when every\n"
            "                         rank is on this host)\n"
            "  --tp-timeout-ms MS     group open and each transfer (default 10000)\n"
            "  --drain-timeout-ms MS  on SIGTERM/SIGINT: stop accepting, refuse new requests and\n"
            "                         finish the ones in flight for at most MS, then exit 0\n"
            "                         (default 10000; 0 = exit at once; a second signal too)\n"
            "  --recovery-timeout-ms MS  stage 0: when a stage dies mid-request, hold the\n"
            "                         requests in flight this long for it (restarted) to rejoin,\n"
            "                         then replay them so they finish with the same tokens\n"
            "                         (default 10000; 0 = fail them at once)\n"
            "  --kv-recovery MODE     stage 0: a replay with every later stage's KV copy (their\n"
            "                         --send-kv) restores it and recomputes only the rows after\n"
            "                         it: auto (default; when the copies' bytes / measured link\n"
            "                         rate < the rows' measured compute), restore, or replay\n"
            "  --kv-keep-mb N         stage 0: memory for those copies (default 1024; a block\n"
            "                         past it is not kept and its request replays in full)\n"
            "  --standby              a standby for this stage: load the weights, wait while\n"
            "                         --listen's port is taken (the primary serves it) and take\n"
            "                         it over the moment the primary dies (needs a fixed port)\n"
            "  --step-delay-ms MS     testing: sleep before each microbatch (a slow device)\n"
            "  --log-level L          error|warn|info|debug (default info)\n"
            "  --help                 this text\n"
            "Exit codes: 0 ok (stopped by SIGINT/SIGTERM, after the drain), 1 runtime failure "
            "(listen, device),\n"
            "2 bad command line or shard, 3 bad model, config or weights.\n");
}

struct args {
    const char *model_dir, *hf_config, *weights;
    int num_stages, stage_idx, layer_start, layer_end;
    const char *listen, *port_file, *next_host, *next_port_file;
    int next_port;
    const char *device, *weights_dtype;
    int threads, max_seq, max_batch, chunk_size;
    int kv_recovery, kv_keep_mb;
    int send_kv, recv_kv, step_delay_ms, peer_timeout_ms, drain_timeout_ms, recovery_timeout_ms;
    int standby;
    const char *kv_out, *kv_restore, *out, *auth_key_file;
    const char *tls_cert, *tls_key, *tls_ca;
    int insecure;
    enum stage_log_level log_level;
    int tp, tp_rank, tp_tcp, tp_timeout_ms, kvp, kvp_rank, kvp_tokens;
    const char *tp_peers;
    enum tp_moe_mode moe;
};

/* A flag's integer value (runtime/base/cli.h), or -1 after naming the flag and the range. */
static int flag_int(const char *flag, const char *text, int lo, int hi, int *out) {
    if (cli_parse_int(text, lo, hi, out) == 0) return 0;
    fprintf(stderr, "strata-stage: %s %s\n", flag, strata_last_error());
    return -1;
}

enum option_id {
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
    O_WEIGHTS_DTYPE,
    O_MAX_SEQ,
    O_MAX_BATCH,
    O_CHUNK,
    O_SEND_KV,
    O_RECV_KV,
    O_KV_OUT,
    O_KV_RESTORE,
    O_KV_RECOVERY,
    O_KV_KEEP_MB,
    O_OUT,
    O_AUTH,
    O_TLS_CERT,
    O_TLS_KEY,
    O_TLS_CA,
    O_INSECURE,
    O_LOG,
    O_DELAY,
    O_PEER_TIMEOUT,
    O_TP,
    O_TP_RANK,
    O_TP_PEERS,
    O_MOE,
    O_TP_TCP,
    O_TP_TIMEOUT,
    O_KVP,
    O_KVP_RANK,
    O_KVP_TOKENS,
    O_DRAIN_TIMEOUT,
    O_ROLE,
    O_RECOVERY_TIMEOUT,
    O_STANDBY,
    O_HELP
};

static const struct option long_options[] = {{"model", 1, 0, O_MODEL},
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
                                             {"weights-dtype", 1, 0, O_WEIGHTS_DTYPE},
                                             {"max-seq", 1, 0, O_MAX_SEQ},
                                             {"max-batch", 1, 0, O_MAX_BATCH},
                                             {"chunk-size", 1, 0, O_CHUNK},
                                             {"send-kv", 0, 0, O_SEND_KV},
                                             {"recv-kv", 0, 0, O_RECV_KV},
                                             {"kv-out", 1, 0, O_KV_OUT},
                                             {"kv-restore", 1, 0, O_KV_RESTORE},
                                             {"kv-recovery", 1, 0, O_KV_RECOVERY},
                                             {"kv-keep-mb", 1, 0, O_KV_KEEP_MB},
                                             {"out", 1, 0, O_OUT},
                                             {"auth-key-file", 1, 0, O_AUTH},
                                             {"tls-cert", 1, 0, O_TLS_CERT},
                                             {"tls-key", 1, 0, O_TLS_KEY},
                                             {"tls-ca", 1, 0, O_TLS_CA},
                                             {"insecure", 0, 0, O_INSECURE},
                                             {"log-level", 1, 0, O_LOG},
                                             {"step-delay-ms", 1, 0, O_DELAY},
                                             {"peer-timeout-ms", 1, 0, O_PEER_TIMEOUT},
                                             {"tp", 1, 0, O_TP},
                                             {"tp-rank", 1, 0, O_TP_RANK},
                                             {"tp-peers", 1, 0, O_TP_PEERS},
                                             {"moe", 1, 0, O_MOE},
                                             {"tp-tcp", 0, 0, O_TP_TCP},
                                             {"tp-timeout-ms", 1, 0, O_TP_TIMEOUT},
                                             {"kvp", 1, 0, O_KVP},
                                             {"kvp-rank", 1, 0, O_KVP_RANK},
                                             {"kvp-tokens", 1, 0, O_KVP_TOKENS},
                                             {"drain-timeout-ms", 1, 0, O_DRAIN_TIMEOUT},
                                             {"role", 1, 0, O_ROLE},
                                             {"recovery-timeout-ms", 1, 0, O_RECOVERY_TIMEOUT},
                                             {"standby", 0, 0, O_STANDBY},
                                             {"help", 0, 0, O_HELP},
                                             {0, 0, 0, 0}};

static int parse_log_level(const char *text, enum stage_log_level *out) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(text, names[i])) {
            *out = (enum stage_log_level)i;
            return 0;
        }
    fprintf(stderr, "strata-stage: --log-level is error|warn|info|debug\n");
    return -1;
}

/* One option's value into `a`: 0, or -1 after printing what is wrong. */
static int parse_option(struct args *a, int c, const char *value) {
    int rc = 0;
    switch (c) {
    case O_MODEL: a->model_dir = value; break;
    case O_HF_CONFIG: a->hf_config = value; break;
    case O_WEIGHTS: a->weights = value; break;
    case O_NUM_STAGES: rc = flag_int("--num-stages", value, 1, 4096, &a->num_stages); break;
    case O_STAGE_IDX: rc = flag_int("--stage-idx", value, 0, 4095, &a->stage_idx); break;
    case O_LAYER_START:
        rc = flag_int("--layer-start", value, 0, MODEL_CONFIG_MAX_LAYERS, &a->layer_start);
        break;
    case O_LAYER_END:
        rc = flag_int("--layer-end", value, 0, MODEL_CONFIG_MAX_LAYERS, &a->layer_end);
        break;
    case O_LISTEN: a->listen = value; break;
    case O_PORT_FILE: a->port_file = value; break;
    case O_NEXT_HOST: a->next_host = value; break;
    case O_NEXT_PORT: rc = flag_int("--next-port", value, 1, 65535, &a->next_port); break;
    case O_NEXT_PORT_FILE: a->next_port_file = value; break;
    case O_DEVICE: a->device = value; break;
    case O_THREADS: rc = flag_int("--threads", value, 1, 1024, &a->threads); break;
    case O_WEIGHTS_DTYPE:
        a->weights_dtype = value;
        if (strcmp(value, "bf16") != 0 && strcmp(value, "q8") != 0) {
            fprintf(stderr, "strata-stage: --weights-dtype is bf16 or q8\n");
            rc = -1;
        }
        break;
    case O_MAX_SEQ: rc = flag_int("--max-seq", value, 1, 1 << 24, &a->max_seq); break;
    case O_MAX_BATCH: rc = flag_int("--max-batch", value, 1, 4096, &a->max_batch); break;
    case O_CHUNK: rc = flag_int("--chunk-size", value, 1, 1 << 20, &a->chunk_size); break;
    case O_SEND_KV: a->send_kv = 1; break;
    case O_RECV_KV: a->recv_kv = 1; break;
    case O_KV_OUT: a->kv_out = value; break;
    case O_KV_RESTORE: a->kv_restore = value; break;
    case O_KV_RECOVERY:
        a->kv_recovery = !strcmp(value, "auto")      ? STAGE_KV_RECOVERY_AUTO
                         : !strcmp(value, "restore") ? STAGE_KV_RECOVERY_RESTORE
                         : !strcmp(value, "replay")  ? STAGE_KV_RECOVERY_REPLAY
                                                     : -1;
        if (a->kv_recovery < 0) {
            fprintf(stderr, "strata-stage: --kv-recovery is auto, restore or replay\n");
            rc = -1;
        }
        break;
    case O_KV_KEEP_MB: rc = flag_int("--kv-keep-mb", value, 0, 1 << 24, &a->kv_keep_mb); break;
    case O_OUT: a->out = value; break;
    case O_AUTH: a->auth_key_file = value; break;
    case O_TLS_CERT: a->tls_cert = value; break;
    case O_TLS_KEY: a->tls_key = value; break;
    case O_TLS_CA: a->tls_ca = value; break;
    case O_INSECURE: a->insecure = 1; break;
    case O_PEER_TIMEOUT:
        rc = flag_int("--peer-timeout-ms", value, 0, 3600000, &a->peer_timeout_ms);
        break;
    case O_DRAIN_TIMEOUT:
        rc = flag_int("--drain-timeout-ms", value, 0, 3600000, &a->drain_timeout_ms);
        break;
    case O_STANDBY: a->standby = 1; break;
    case O_RECOVERY_TIMEOUT:
        rc = flag_int("--recovery-timeout-ms", value, 0, 3600000, &a->recovery_timeout_ms);
        break;
    case O_DELAY: rc = flag_int("--step-delay-ms", value, 0, 60000, &a->step_delay_ms); break;
    case O_LOG: rc = parse_log_level(value, &a->log_level); break;
    case O_TP: rc = flag_int("--tp", value, 1, COLL_MAX_RANKS, &a->tp); break;
    case O_TP_RANK: rc = flag_int("--tp-rank", value, 0, COLL_MAX_RANKS - 1, &a->tp_rank); break;
    case O_TP_PEERS: a->tp_peers = value; break;
    case O_KVP: rc = flag_int("--kvp", value, 1, COLL_MAX_RANKS, &a->kvp); break;
    case O_KVP_RANK: rc = flag_int("--kvp-rank", value, 0, COLL_MAX_RANKS - 1, &a->kvp_rank); break;
    case O_KVP_TOKENS: rc = flag_int("--kvp-tokens", value, 1, 1 << 24, &a->kvp_tokens); break;
    case O_TP_TCP: a->tp_tcp = 1; break;
    case O_TP_TIMEOUT:
        rc = flag_int("--tp-timeout-ms", value, 1, 3600000, &a->tp_timeout_ms);
        break;
    case O_MOE:
        if (!strcmp(value, "expert") || !strcmp(value, "split"))
            a->moe = value[0] == 's' ? TP_MOE_SPLIT : TP_MOE_EXPERT_PARALLEL;
        else {
            fprintf(stderr, "strata-stage: --moe is expert|split\n");
            rc = -1;
        }
        break;
    case O_ROLE:
        if (strcmp(value, "language") != 0) {
            fprintf(stderr, "strata-stage: --role is language or vision\n");
            rc = -1;
        }
        break;
    default: rc = -1;
    }
    return rc;
}

/* The TP flags together: 0, or -1 after printing the problem. */
static int check_tp_args(const struct args *a) {
    const char *why = NULL;
    const int world = a->tp * a->kvp;
    if (world == 1 && (a->tp_rank || a->kvp_rank || a->tp_peers))
        why = "--tp-rank, --kvp-rank and --tp-peers need --tp or --kvp >= 2";
    else if (world > 1 && !a->tp_peers)
        why = "--tp-peers is required with --tp or --kvp >= 2";
    else if (a->tp_rank >= a->tp)
        why = "--tp-rank must be below --tp";
    else if (a->kvp_rank >= a->kvp)
        why = "--kvp-rank must be below --kvp";
    else if (world > COLL_MAX_RANKS)
        why = "--tp x --kvp is larger than a group can be";
    else if (a->kvp_tokens && a->kvp == 1)
        why = "--kvp-tokens needs --kvp >= 2";
    else if (world > 1 && (a->send_kv || a->kv_restore))
        why = "--send-kv and --kv-restore are not supported with --tp / --kvp (each rank holds "
              "only its part of the KV cache)";
    if (why) fprintf(stderr, "strata-stage: %s\n", why);
    return why ? -1 : 0;
}

/* Checks across options, after all are read: 0, or -1 after printing the problem. */
static int check_args(struct args *a, int argc, char **argv) {
    int rc = 0;
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
    if (rc == 0 && a->num_stages > 1 && a->tp_rank == 0 && a->kvp_rank == 0 && !a->next_port &&
        !a->next_port_file) {
        fprintf(stderr, "strata-stage: --next-port or --next-port-file is required with "
                        "--num-stages > 1\n");
        rc = -1;
    }
    if (rc == 0 && (a->layer_start < 0) != (a->layer_end < 0)) {
        fprintf(stderr, "strata-stage: give both --layer-start and --layer-end\n");
        rc = -1;
    }
    return rc == 0 ? check_tp_args(a) : rc;
}

static void args_defaults(struct args *a) {
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
    a->tp = 1;
    a->kvp = 1;
    a->tp_timeout_ms = COLL_DEFAULT_TIMEOUT_MS;
    a->drain_timeout_ms = 10000;
    a->recovery_timeout_ms = 10000;
    a->kv_keep_mb = 1024;
}

/* Fills `a` from argv: 0 ok, 1 for --help, -1 after printing what is wrong. */
static int parse_args(struct args *a, int argc, char **argv) {
    int c, rc = 0;
    args_defaults(a);
    while (rc == 0 && (c = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        if (c == O_HELP) return 1;
        rc = parse_option(a, c, optarg);
    }
    return rc == 0 ? check_args(a, argc, argv) : rc;
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
    return flag_int("--listen", text, 0, 65535, port);
}

/* STRATA_E* of a failed open -> the documented exit code. */
static int open_exit_code(int rc) {
    switch (rc) {
    case STRATA_ERANGE:
    case STRATA_EINVAL: return STRATA_EXIT_USAGE; /* the shard or a flag */
    case STRATA_ENOTFOUND:
    case STRATA_EFORMAT: return STRATA_EXIT_INPUT; /* config, weights, tensors */
    default: return STRATA_EXIT_FAILURE;           /* device, memory */
    }
}

/* Everything strata-stage holds while it runs. */
struct run {
    struct model_config cfg;
    char *config_json;
    size_t config_len;
    struct safetensors *st;
    struct stage stage;
    struct wire_auth_key key;
    struct wire_security security;
    char listen_host[256];
    int listen_port;
    uint8_t fingerprint[WIRE_FINGERPRINT_BYTES];
    /* Tensor parallelism (--tp >= 2): the stage's group, this rank's place in it, and a
     * follower's backend (rank 0 has r->stage instead). */
    struct coll *coll;
    struct stage_tp_config tp;
    char group[64];
    struct stage_backend *follower;
};

static void run_close(struct run *r) {
    stage_close(&r->stage); /* a TP leader sends its followers STOP here */
    stage_backend_free(r->follower);
    coll_close(r->coll);
    safetensors_close(r->st);
    wire_security_free(&r->security);
    wire_auth_key_clear(&r->key);
    free(r->config_json);
}

static int open_config(struct run *r, const struct args *a) {
    char config_path[4096];
    if (a->model_dir)
        snprintf(config_path, sizeof config_path, "%s/config.json", a->model_dir);
    else
        snprintf(config_path, sizeof config_path, "%s", a->hf_config);
    if (cli_read_file(&r->config_json, &r->config_len, config_path) < 0 ||
        model_config_parse(&r->cfg, r->config_json, r->config_len, config_path) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    return STRATA_EXIT_OK;
}

/* A TP follower's backend: its shard of the stage's layers (no core, no listener). */
static int open_follower(struct run *r, const struct args *a, const struct stage_role *role) {
    int rc = stage_tp_open(&r->follower, &(struct stage_backend_options){.cfg = &r->cfg,
                                                                         .weights = r->st,
                                                                         .role = *role,
                                                                         .device = a->device,
                                                                         .num_threads = a->threads,
                                                                         .max_seq = a->max_seq,
                                                                         .num_slots = a->max_batch,
                                                                         .tp = &r->tp});
    if (rc < 0) {
        fprintf(stderr, "strata-stage: TP rank %d / KVP rank %d: %s\n", a->tp_rank, a->kvp_rank,
                strata_last_error());
        return open_exit_code(rc);
    }
    return STRATA_EXIT_OK;
}

/* Config, shard, weights, backend and core: returns an exit code (0 = opened). */
static int open_stage(struct run *r, const struct args *a) {
    struct stage_tensor_list report;
    struct stage_role role;
    const char *source = a->model_dir ? a->model_dir : a->weights;
    int rc;
    /* The shard first: a bad range is a command-line error whatever the weights hold. */
    rc = stage_role_for(&role, &r->cfg, a->stage_idx, a->num_stages, a->layer_start, a->layer_end);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    if (safetensors_open(&r->st, source) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    if (a->tp * a->kvp > 1 && (a->tp_rank > 0 || a->kvp_rank > 0))
        return open_follower(r, a, &role);
    rc = stage_open(&r->stage,
                    &(struct stage_open_options){.cfg = &r->cfg,
                                                 .weights = r->st,
                                                 .weights_source = source,
                                                 .stage_index = a->stage_idx,
                                                 .num_stages = a->num_stages,
                                                 .layer_start = role.layer_start,
                                                 .layer_end = role.layer_end,
                                                 .device = a->device,
                                                 .num_threads = a->threads,
                                                 .weights_dtype = a->weights_dtype,
                                                 .max_seq = a->max_seq,
                                                 .max_batch = a->max_batch,
                                                 .chunk_size = a->chunk_size,
                                                 .keep_logits = role.with_head && a->out,
                                                 .send_kv = a->send_kv,
                                                 .tp = a->tp * a->kvp > 1 ? &r->tp : NULL},
                    &report);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        if (report.count > 0) {
            fprintf(stderr,
                    "strata-stage: every missing or mis-shaped tensor of layers [%d, %d):\n",
                    role.layer_start, role.layer_end);
            stage_tensor_list_report(stderr, &report, r->st);
        }
        stage_tensor_list_free(&report);
        return open_exit_code(rc);
    }
    stage_core_set_recovery_timeout(r->stage.core, a->recovery_timeout_ms);
    stage_core_set_kv_recovery(r->stage.core, (enum stage_kv_recovery)a->kv_recovery,
                               (size_t)a->kv_keep_mb << 20);
    return STRATA_EXIT_OK;
}

/* The grid line of the summary: where this process sits in PP x TP. */
static void print_grid(const struct run *r, const struct args *a) {
    if (a->tp * a->kvp <= 1) {
        printf("grid: stage %d of %d, tp rank 0 of 1, kvp rank 0 of 1\n", a->stage_idx,
               a->num_stages);
        return;
    }
    const int leader = a->tp_rank == 0 && a->kvp_rank == 0;
    printf("grid: stage %d of %d, tp rank %d of %d, kvp rank %d of %d", a->stage_idx, a->num_stages,
           a->tp_rank, a->tp, a->kvp_rank, a->kvp);
    if (a->kvp > 1)
        printf(" (KV positions [%d, %d) of %d)", a->kvp_rank * r->tp.kvp_tokens,
               (a->kvp_rank + 1) * r->tp.kvp_tokens < a->max_seq
                   ? (a->kvp_rank + 1) * r->tp.kvp_tokens
                   : a->max_seq,
               a->max_seq);
    printf(" (%s), group \"%s\" over %s, moe %s\n",
           leader ? "leader: serves the stage" : "follower of group rank 0", r->group,
           coll_transport_of(r->coll) == COLL_SHM ? "shared memory" : "tcp",
           a->moe == TP_MOE_SPLIT ? "split" : "expert");
}

/* A follower's summary: its grid place and its shard (it has no core). */
static void print_follower(const struct run *r, const struct args *a) {
    char device[512];
    const struct stage_role *role = &r->follower->role;
    stage_backend_describe(r->follower, device, sizeof device);
    printf("strata-stage %d of %d\n", a->stage_idx, a->num_stages);
    print_grid(r, a);
    printf("shard: layers [%d, %d) of %d%s%s\n", role->layer_start, role->layer_end,
           r->cfg.num_layers, role->with_embed ? ", embedding" : "",
           role->with_head ? ", final norm + lm_head" : "");
    printf("%s\n", device);
    printf("kv cache: %d slots x %d positions = %zu bytes\n", r->follower->num_slots,
           r->follower->max_seq, stage_backend_kv_bytes(r->follower));
    fflush(stdout);
}

/* The startup summary: every line read from the backend that computes. */
static void print_summary(const struct run *r, const struct args *a) {
    const struct model_config *cfg = &r->cfg;
    struct stage_core_info info;
    char summary[512], device[512];
    if (r->follower) {
        print_follower(r, a);
        return;
    }
    stage_core_get_info(r->stage.core, &info);
    model_config_describe(cfg, summary, sizeof summary);
    stage_backend_describe(r->stage.backend, device, sizeof device);
    printf("strata-stage %d of %d\n", info.stage_index, info.num_stages);
    print_grid(r, a);
    printf("config: %s\n", summary);
    printf("config: hidden %d, heads %d, kv heads %d, head_dim %d, layers %d, vocab %d, MoE %s",
           cfg->hidden_size, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, cfg->num_layers,
           cfg->vocab_size, cfg->num_experts > 0 ? "yes" : "no");
    if (cfg->num_experts > 0)
        printf(" (%d experts, top-%d)", cfg->num_experts, cfg->num_experts_per_tok);
    printf("\nshard: layers [%d, %d) of %d%s%s\n", info.role.layer_start, info.role.layer_end,
           info.num_layers, info.role.with_embed ? ", embedding" : "",
           info.role.with_head ? ", final norm + lm_head" : "");
    printf("%s\n", device);
    printf("kv cache: %d slots x %d positions = %zu bytes\n", info.max_batch, info.max_seq,
           stage_core_kv_bytes(r->stage.core));
    fflush(stdout);
}

static int restore_kv(struct run *r, const char *path) {
    char *kv_bytes = NULL;
    size_t kv_len = 0;
    uint64_t nonce;
    int positions;
    struct stage_core_info info;
    if (cli_read_file(&kv_bytes, &kv_len, path) < 0 ||
        stage_core_restore_kv(r->stage.core, &nonce, &positions, (const uint8_t *)kv_bytes,
                              kv_len) < 0) {
        fprintf(stderr, "strata-stage: --kv-restore %s: %s\n", path, strata_last_error());
        free(kv_bytes);
        return STRATA_EXIT_INPUT;
    }
    free(kv_bytes);
    stage_core_get_info(r->stage.core, &info);
    printf("kv restore: request %llu, %d positions, layers [%d, %d) from %s\n",
           (unsigned long long)nonce, positions, info.role.layer_start, info.role.layer_end, path);
    fflush(stdout);
    return STRATA_EXIT_OK;
}

/* Every connection, idle ones included, is a descriptor: the soft limit (often 1024) goes
 * up to the hard one, so the accept path's own limits are what bounds them. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            strata_log(STRATA_LOG_DEBUG, "setrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    }
}

/* Link security (key or certificates) and the model fingerprint: the stage links and the
 * TP group use both. Returns an exit code. */
static int setup_links(struct run *r, const struct args *a) {
    if (wire_auth_key_load(&r->key, a->auth_key_file, NULL) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    struct wire_security_flags flags = {a->tls_cert, a->tls_key, a->tls_ca, a->insecure, &r->key};
    int rc = wire_security_setup(&r->security, &flags);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return rc == STRATA_EINVAL ? STRATA_EXIT_USAGE : STRATA_EXIT_FAILURE;
    }
    if (r->security.warning)
        strata_log(STRATA_LOG_WARN, "%s", r->security.warning);
    else
        strata_log(STRATA_LOG_INFO, "links: %s", wire_tls_describe(r->security.tls));
    /* q8 weights give other logits: stages (and TP ranks) must agree on them as on the
     * model, so the weights dtype joins the compute dtype in the fingerprint (bf16 keeps
     * "float32"). */
    const char *dtype =
        a->weights_dtype && !strcmp(a->weights_dtype, "q8") ? "float32+q8-weights" : "float32";
    if (wire_model_fingerprint(r->fingerprint, r->config_json, r->config_len, dtype) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}

/* --tp >= 2: joins the stage's TP group (all ranks must start within --tp-timeout-ms). */
static int open_group(struct run *r, const struct args *a) {
    struct stage_role role;
    if (stage_role_for(&role, &r->cfg, a->stage_idx, a->num_stages, a->layer_start, a->layer_end) <
        0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    /* The name carries everything the ranks must agree on: the Hello refuses another. */
    struct grid_config grid = {.pp = a->num_stages,
                               .tp = a->tp,
                               .kvp = a->kvp,
                               .kvp_tokens = a->kvp_tokens,
                               .moe = a->moe};
    if (grid_config_check(&grid, &r->cfg, a->max_seq) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    snprintf(r->group, sizeof r->group, "s%d.L%d-%d.tp%d.kvp%dx%d.%s", a->stage_idx,
             role.layer_start, role.layer_end, a->tp, a->kvp, grid.kvp_tokens,
             a->moe == TP_MOE_SPLIT ? "split" : "expert");
    struct stage_tp_net net = {.peers = a->tp_peers,
                               .size = a->tp * a->kvp,
                               .rank = a->kvp_rank * a->tp + a->tp_rank,
                               .group = r->group,
                               .tcp_only = a->tp_tcp,
                               .timeout_ms = a->tp_timeout_ms,
                               .tls = r->security.tls,
                               .key = r->security.hello_key,
                               .fingerprint = r->fingerprint};
    if (stage_tp_connect(&r->coll, &net) < 0) {
        fprintf(stderr, "strata-stage: TP group: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    r->tp = (struct stage_tp_config){.tp = a->tp,
                                     .tp_rank = a->tp_rank,
                                     .moe = a->moe,
                                     .kvp = a->kvp,
                                     .kvp_rank = a->kvp_rank,
                                     .kvp_tokens = grid.kvp_tokens,
                                     .coll = r->coll};
    strata_log(STRATA_LOG_INFO, "group \"%s\": rank %d of %d connected over %s", r->group, net.rank,
               net.size, coll_transport_of(r->coll) == COLL_SHM ? "shared memory" : "tcp");
    return STRATA_EXIT_OK;
}

/* Every rank of the group has loaded its weights: the leader serves (and so sends
 * commands) only then, however long a rank takes to load (up to an hour). */
static int wait_group_loaded(struct run *r) {
    const int timeout = coll_timeout(r->coll);
    float one = 1.0f;
    int rc = coll_set_timeout(r->coll, 3600000);
    if (rc == 0) rc = coll_allreduce_sum(r->coll, &one, 1);
    coll_set_timeout(r->coll, timeout);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: waiting for the group to load: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}

/* A TP follower: runs rank 0's calls until it stops (exit 0) or the group fails (exit 1).
 * SIGTERM / SIGINT are ignored: a scheduler stopping a whole job or pod set (scancel
 * --signal=TERM, a StatefulSet scaled down) signals every rank at once, and the leader must
 * be able to drain its requests through its followers first; its STOP then ends them. */
static int follow(struct run *r, const struct args *a) {
    uint64_t calls = 0;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    int rc = stage_tp_follow(r->follower, r->coll, &calls);
    if (rc < 0) {
        fprintf(stderr,
                "strata-stage: TP rank %d / KVP rank %d: the group failed after %llu calls: %s\n",
                a->tp_rank, a->kvp_rank, (unsigned long long)calls, strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    strata_log(STRATA_LOG_INFO, "TP rank %d / KVP rank %d: leader stopped after %llu calls",
               a->tp_rank, a->kvp_rank, (unsigned long long)calls);
    return STRATA_EXIT_OK;
}

/* Serves until SIGINT/SIGTERM: returns the exit code. */
static int serve(struct run *r, const struct args *a) {
    struct stage_server_options so;
    int last = a->stage_idx == a->num_stages - 1;
    memset(&so, 0, sizeof so);
    so.listen_port = r->listen_port;
    so.listen_host = r->listen_host;
    so.port_file = a->port_file;
    so.next_host = a->next_host;
    so.next_port = a->next_port;
    so.next_port_file = a->next_port_file;
    so.tls = r->security.tls;
    so.key = r->security.hello_key;
    so.recv_kv = a->recv_kv;
    so.kv_out_path = a->kv_out;
    so.out_path = last ? a->out : NULL;
    so.log_level = a->log_level;
    so.step_delay_ms = a->step_delay_ms;
    so.peer_timeout_ms = a->peer_timeout_ms;
    so.drain_timeout_ms = a->drain_timeout_ms;
    so.standby = a->standby;
    so.group = r->coll; /* NULL without TP / KVP; only the leader serves */
    memcpy(so.fingerprint, r->fingerprint, sizeof so.fingerprint);
    if (a->out && !last)
        strata_log(STRATA_LOG_WARN, "--out is written by the last stage only; ignored here");
    raise_fd_limit();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (stage_server_run(r->stage.core, &so, &stop_flag) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    struct args a;
    struct run r;
    if (role_is_vision(argc, argv)) return strata_vision_main(argc, argv);
    int code, parsed = parse_args(&a, argc, argv);
    memset(&r, 0, sizeof r);
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
    if (parse_listen(a.listen, r.listen_host, sizeof r.listen_host, &r.listen_port) < 0)
        return STRATA_EXIT_USAGE;
    if (a.standby && r.listen_port == 0) {
        fprintf(stderr, "strata-stage: --standby needs a fixed --listen port (the primary's)\n");
        return STRATA_EXIT_USAGE;
    }
    code = open_config(&r, &a);
    /* Without TP the links are set up after the weights load (a bad shard or checkpoint is
     * reported first); a TP group needs them before, to connect its ranks. */
    if (code == STRATA_EXIT_OK && a.tp * a.kvp > 1) code = setup_links(&r, &a);
    if (code == STRATA_EXIT_OK && a.tp * a.kvp > 1) code = open_group(&r, &a);
    if (code == STRATA_EXIT_OK) code = open_stage(&r, &a);
    if (code == STRATA_EXIT_OK && r.coll) code = wait_group_loaded(&r);
    if (code == STRATA_EXIT_OK) print_summary(&r, &a);
    if (code == STRATA_EXIT_OK && a.kv_restore) code = restore_kv(&r, a.kv_restore);
    if (code == STRATA_EXIT_OK && a.tp * a.kvp == 1) code = setup_links(&r, &a);
    if (code == STRATA_EXIT_OK) code = r.follower ? follow(&r, &a) : serve(&r, &a);
    run_close(&r);
    return code;
}
