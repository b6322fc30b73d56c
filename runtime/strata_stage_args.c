/* strata-stage's command line: see strata_stage_args.h. */
#include "runtime/strata_stage_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_cache.h"
#include "runtime/base/cli.h"
#include "runtime/base/cpu_pin.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/tp_shard.h"
#include "runtime/stage/stage_core.h"
#include "wire/collective.h"
#include "wire/message.h"

void strata_stage_usage(FILE *out) {
    fprintf(
        out,
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
        "  --split even|decode    the default range: even (the same layer count per stage)\n"
        "                         or decode (every stage streams about as many weight bytes\n"
        "                         per decoded token, the last stage's lm_head counted; give\n"
        "                         it to every stage; strata-plan --split decode shows it)\n"
        "  --listen [ADDR:]PORT   listen address (default 127.0.0.1:0 = any free port)\n"
        "  --port-file F          write the bound port to F\n"
        "  --next-host H          next stage host (default 127.0.0.1)\n"
        "  --next-port P          next stage port\n"
        "  --next-port-file F     read the next stage's port from F (re-read on reconnect)\n"
        "  --device cpu|cuda:N    compute backend: cpu (default) or GPU N (refused, with the\n"
        "                         reason, where the build or machine has no CUDA)\n"
        "  --threads T            matmul threads (default 1)\n"
        "  --cpus LIST            run on these CPUs only (0-3,8, as taskset -c; at least one\n"
        "                         per thread): stages sharing a box each on cores of their\n"
        "                         own (lscpu -e: one CPU per core keeps two stages off one\n"
        "                         core's hyperthreads). Default: the CPUs it started with\n"
        "  --weights-dtype D      bf16 (default: as stored) or q8 (8-bit blocks quantised at\n"
        "                         load, cpu only; other logits than bf16, so every stage of\n"
        "                         a pipeline must use the same: it is in the Hello's model\n"
        "                         fingerprint)\n"
        "  --weights-in-file      cpu: leave the matrices in the checkpoint's page cache\n"
        "                         (reclaimable under memory pressure) instead of moving\n"
        "                         them into huge-page memory at load (decode ~25%% faster)\n"
        "  --max-seq N            KV positions a request may fill (default 512)\n"
        "  --max-batch B          requests in flight at most (default 8)\n"
        "  --kv-memory SIZE|PCT   the KV pool: blocks of 16 positions in SIZE bytes (64M,\n"
        "                         12G) or PCT of the memory free after loading (50%%);\n"
        "                         a request reserves prompt + max_tokens when it starts\n"
        "                         and gives its blocks back when it ends (default: every\n"
        "                         request in flight can reach --max-seq)\n"
        "  --no-prefix-cache      stage 0: prefill every prompt in full (default: a prompt\n"
        "                         starting with whole 16-token blocks of a finished one\n"
        "                         reuses their KV on every stage, bit for bit the same)\n"
        "  --speculate off|ngram|draft  stage 0: speculative decoding for requests that do\n"
        "                         not choose (default off; draft with --draft-model): ngram\n"
        "                         drafts the tokens that followed the latest earlier\n"
        "                         occurrence of the last tokens, draft a draft model's; the last\n"
        "                         stage keeps those it would have sampled, so a trip round\n"
        "                         the ring yields up to k + 1 tokens and the output is bit\n"
        "                         for bit the same\n"
        "  --speculate-k K        stage 0: drafts per decode step, 1..16 (default 4; fewer\n"
        "                         while drafts miss)\n"
        "  --speculate-waves W    stage 0 of a pipeline: decode steps of one request in flight,\n"
        "                         1..4 (default 1): each later one is drafted on the guess that\n"
        "                         those before it are accepted whole, so the stages work on one\n"
        "                         request together; a step whose guess fails is dropped\n"
        "  --draft-model DIR      stage 0: a smaller model with the same tokenizer that drafts\n"
        "                         tokens (--speculate draft, the default with it), whole on\n"
        "                         this stage's device beside its layers\n"
        "  --speculate-oracle FILE:P  a benchmark instrument, stage 0: drafts from a\n"
        "                         recorded run (lines \"PROMPT_IDS GENERATED_IDS\"), each\n"
        "                         right with probability P, for requests that do not choose\n"
        "                         (./strata bench speculate)\n"
        "  --kv-dtype f32|bf16|f16  what the KV cache stores, cpu and cuda alike (default\n"
        "                         f16: half of f32's bytes, greedy ids equal to\n"
        "                         transformers' on every golden; f32 is the exact mode;\n"
        "                         README's serving section has the measured\n"
        "                         error). The ranks of a TP / KVP group must agree (their\n"
        "                         Hello checks it); a KV block restores only into its own\n"
        "                         dtype\n"
        "  --chunk-size C         prefill chunk rows (default 64)\n"
        "  --send-kv              send each request's KV after its prefill activation (on\n"
        "                         every stage: stage 0 keeps the later stages' blocks and a\n"
        "                         recovery replay restores them instead of recomputing)\n"
        "  --recv-kv              accept KV blocks from upstream\n"
        "  --kv-out FILE          write received KV blocks to FILE\n"
        "  --kv-restore FILE      restore a KV block (equal layer range only) at start\n"
        "  --probe-links FILE     instead of serving: measure the link to the next stage\n"
        "                         with the stages' own frames and TLS (every stage of the\n"
        "                         ring with its usual flags plus this; each echoes the\n"
        "                         stage before it; each waits --peer-timeout-ms for its\n"
        "                         neighbours), write it to FILE as strata-plan --hosts'\n"
        "                         link object (latency_us, gbps and the mean one-way time\n"
        "                         of a token's, a row's and 8, 64, 256 rows' frames), exit\n"
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
        "  --max-queue N          stage 0: requests that find every KV slot in use wait\n"
        "                         for one in arrival order, at most N of them (default\n"
        "                         256; 0 = refuse at once); beyond, EBUSY (HTTP 429)\n"
        "  --queue-timeout-ms MS  stage 0: longest such wait, then EBUSY (default 30000;\n"
        "                         0 = no limit)\n"
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
        "  --stage-stats          log where the stage's time goes, once a second while it\n"
        "                         works: microbatches, and per microbatch the compute, the\n"
        "                         sends, and the wait for the next frame (the hop and the\n"
        "                         other stages' steps); then the microbatches with prompt\n"
        "                         rows (prefill chunks) and those of decode rows only, each\n"
        "                         with its compute; ./strata bench pipeline and bench\n"
        "                         predict read them\n"
        "  --log-level L          error|warn|info|debug (default info)\n"
        "  --help                 this text\n"
        "Loading progress goes to stderr when it is a terminal or the load takes over 2 s;\n"
        "STRATA_PROGRESS=1 always shows it, STRATA_PROGRESS=0 never.\n"
        "Exit codes: 0 ok (stopped by SIGINT/SIGTERM, after the drain), 1 runtime failure "
        "(listen, device),\n"
        "2 bad command line or shard, 3 bad model, config or weights.\n");
}

/* A flag's integer value (runtime/base/cli.h), or -1 after naming the flag and the range. */
int strata_stage_flag_int(const char *flag, const char *text, int lo, int hi, int *out) {
    if (cli_parse_int(text, lo, hi, out) == 0) return 0;
    fprintf(stderr, "strata-stage: %s %s\n", flag, strata_last_error());
    return -1;
}

int strata_stage_flag_cpus(const char *text, struct cpu_pin *out) {
    if (cpu_pin_parse(text, out) == 0) return 0;
    fprintf(stderr, "strata-stage: --cpus %s\n", strata_last_error());
    return -1;
}

int strata_stage_pin_cpus(const struct cpu_pin *p, int threads) {
    char list[256];
    if (!p || cpu_pin_apply(p, threads) == 0) return 0;
    cpu_pin_format(p, list, sizeof list);
    fprintf(stderr, "strata-stage: --cpus %s: %s\n", list, strata_last_error());
    return -1;
}

void strata_stage_print_cpus(int pinned) {
    struct cpu_pin now;
    char list[256];
    if (cpu_pin_current(&now) < 0) return;
    cpu_pin_format(&now, list, sizeof list);
    printf("cpus: %s (%d, %s)\n", list, now.count, pinned ? "pinned by --cpus" : "as started");
}

int strata_stage_parse_listen(const char *text, char *host, size_t cap, int *port) {
    const char *colon = text ? strrchr(text, ':') : NULL;
    snprintf(host, cap, "127.0.0.1");
    *port = 0;
    if (!text) return 0;
    if (colon) {
        if (colon > text) /* ":PORT" keeps the default address */
            snprintf(host, cap, "%.*s", (int)(colon - text), text);
        text = colon + 1;
    }
    return strata_stage_flag_int("--listen", text, 0, 65535, port);
}

enum option_id {
    O_MODEL = 1000,
    O_HF_CONFIG,
    O_WEIGHTS,
    O_NUM_STAGES,
    O_STAGE_IDX,
    O_LAYER_START,
    O_LAYER_END,
    O_SPLIT,
    O_LISTEN,
    O_PORT_FILE,
    O_NEXT_HOST,
    O_NEXT_PORT,
    O_NEXT_PORT_FILE,
    O_DEVICE,
    O_THREADS,
    O_CPUS,
    O_WEIGHTS_DTYPE,
    O_WEIGHTS_IN_FILE,
    O_MAX_SEQ,
    O_MAX_BATCH,
    O_CHUNK,
    O_SEND_KV,
    O_RECV_KV,
    O_KV_OUT,
    O_KV_RESTORE,
    O_PROBE_LINKS,
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
    O_STAGE_STATS,
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
    O_MAX_QUEUE,
    O_QUEUE_TIMEOUT,
    O_KV_MEMORY,
    O_KV_DTYPE,
    O_NO_PREFIX_CACHE,
    O_SPECULATE,
    O_SPECULATE_K,
    O_SPECULATE_ORACLE,
    O_SPECULATE_WAVES,
    O_DRAFT_MODEL,
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
                                             {"split", 1, 0, O_SPLIT},
                                             {"listen", 1, 0, O_LISTEN},
                                             {"port-file", 1, 0, O_PORT_FILE},
                                             {"next-host", 1, 0, O_NEXT_HOST},
                                             {"next-port", 1, 0, O_NEXT_PORT},
                                             {"next-port-file", 1, 0, O_NEXT_PORT_FILE},
                                             {"device", 1, 0, O_DEVICE},
                                             {"threads", 1, 0, O_THREADS},
                                             {"cpus", 1, 0, O_CPUS},
                                             {"weights-dtype", 1, 0, O_WEIGHTS_DTYPE},
                                             {"weights-in-file", 0, 0, O_WEIGHTS_IN_FILE},
                                             {"max-seq", 1, 0, O_MAX_SEQ},
                                             {"max-batch", 1, 0, O_MAX_BATCH},
                                             {"chunk-size", 1, 0, O_CHUNK},
                                             {"send-kv", 0, 0, O_SEND_KV},
                                             {"recv-kv", 0, 0, O_RECV_KV},
                                             {"kv-out", 1, 0, O_KV_OUT},
                                             {"kv-restore", 1, 0, O_KV_RESTORE},
                                             {"probe-links", 1, 0, O_PROBE_LINKS},
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
                                             {"stage-stats", 0, 0, O_STAGE_STATS},
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
                                             {"max-queue", 1, 0, O_MAX_QUEUE},
                                             {"kv-memory", 1, 0, O_KV_MEMORY},
                                             {"kv-dtype", 1, 0, O_KV_DTYPE},
                                             {"no-prefix-cache", 0, 0, O_NO_PREFIX_CACHE},
                                             {"speculate", 1, 0, O_SPECULATE},
                                             {"speculate-k", 1, 0, O_SPECULATE_K},
                                             {"speculate-oracle", 1, 0, O_SPECULATE_ORACLE},
                                             {"speculate-waves", 1, 0, O_SPECULATE_WAVES},
                                             {"draft-model", 1, 0, O_DRAFT_MODEL},
                                             {"queue-timeout-ms", 1, 0, O_QUEUE_TIMEOUT},
                                             {"standby", 0, 0, O_STANDBY},
                                             {"help", 0, 0, O_HELP},
                                             {0, 0, 0, 0}};

int strata_stage_parse_log_level(const char *text, enum stage_log_level *out) {
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
    case O_NUM_STAGES:
        rc = strata_stage_flag_int("--num-stages", value, 1, 4096, &a->num_stages);
        break;
    case O_STAGE_IDX:
        rc = strata_stage_flag_int("--stage-idx", value, 0, 4095, &a->stage_idx);
        break;
    case O_LAYER_START:
        rc = strata_stage_flag_int("--layer-start", value, 0, MODEL_CONFIG_MAX_LAYERS,
                                   &a->layer_start);
        break;
    case O_LAYER_END:
        rc = strata_stage_flag_int("--layer-end", value, 0, MODEL_CONFIG_MAX_LAYERS, &a->layer_end);
        break;
    case O_SPLIT:
        if (strcmp(value, "even") && strcmp(value, "decode")) {
            fprintf(stderr, "strata-stage: --split wants even or decode\n");
            rc = -1;
        }
        a->split_decode = !strcmp(value, "decode");
        break;
    case O_LISTEN: a->listen = value; break;
    case O_PORT_FILE: a->port_file = value; break;
    case O_NEXT_HOST: a->next_host = value; break;
    case O_NEXT_PORT:
        rc = strata_stage_flag_int("--next-port", value, 1, 65535, &a->next_port);
        break;
    case O_NEXT_PORT_FILE: a->next_port_file = value; break;
    case O_DEVICE: a->device = value; break;
    case O_THREADS: rc = strata_stage_flag_int("--threads", value, 1, 1024, &a->threads); break;
    case O_CPUS:
        rc = strata_stage_flag_cpus(value, &a->cpus);
        a->pin_cpus = rc == 0;
        break;
    case O_WEIGHTS_IN_FILE: a->weights_in_file = 1; break;
    case O_WEIGHTS_DTYPE:
        a->weights_dtype = value;
        if (strcmp(value, "bf16") != 0 && strcmp(value, "q8") != 0) {
            fprintf(stderr, "strata-stage: --weights-dtype is bf16 or q8\n");
            rc = -1;
        }
        break;
    case O_MAX_SEQ: rc = strata_stage_flag_int("--max-seq", value, 1, 1 << 24, &a->max_seq); break;
    case O_MAX_BATCH:
        rc = strata_stage_flag_int("--max-batch", value, 1, 4096, &a->max_batch);
        break;
    case O_CHUNK:
        rc = strata_stage_flag_int("--chunk-size", value, 1, 1 << 20, &a->chunk_size);
        break;
    case O_SEND_KV: a->send_kv = 1; break;
    case O_RECV_KV: a->recv_kv = 1; break;
    case O_KV_OUT: a->kv_out = value; break;
    case O_KV_RESTORE: a->kv_restore = value; break;
    case O_PROBE_LINKS: a->probe_links = value; break;
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
    case O_KV_KEEP_MB:
        rc = strata_stage_flag_int("--kv-keep-mb", value, 0, 1 << 24, &a->kv_keep_mb);
        break;
    case O_OUT: a->out = value; break;
    case O_AUTH: a->auth_key_file = value; break;
    case O_TLS_CERT: a->tls_cert = value; break;
    case O_TLS_KEY: a->tls_key = value; break;
    case O_TLS_CA: a->tls_ca = value; break;
    case O_INSECURE: a->insecure = 1; break;
    case O_PEER_TIMEOUT:
        rc = strata_stage_flag_int("--peer-timeout-ms", value, 0, 3600000, &a->peer_timeout_ms);
        break;
    case O_DRAIN_TIMEOUT:
        rc = strata_stage_flag_int("--drain-timeout-ms", value, 0, 3600000, &a->drain_timeout_ms);
        break;
    case O_STANDBY: a->standby = 1; break;
    case O_RECOVERY_TIMEOUT:
        rc = strata_stage_flag_int("--recovery-timeout-ms", value, 0, 3600000,
                                   &a->recovery_timeout_ms);
        break;
    case O_MAX_QUEUE:
        rc = strata_stage_flag_int("--max-queue", value, 0, 1 << 20, &a->max_queue);
        break;
    case O_KV_MEMORY:
        if (stage_backend_parse_kv_memory(value, &a->kv_memory, &a->kv_memory_fraction) < 0) {
            fprintf(stderr, "strata-stage: %s\n", strata_last_error());
            rc = -1;
        }
        break;
    case O_NO_PREFIX_CACHE: a->no_prefix_cache = 1; break;
    case O_SPECULATE:
        if (strcmp(value, "off") && strcmp(value, "ngram") && strcmp(value, "draft")) {
            fprintf(stderr, "strata-stage: --speculate is off, ngram or draft, not '%s'\n", value);
            rc = -1;
        }
        a->speculate = !strcmp(value, "ngram")   ? WIRE_SPECULATE_NGRAM
                       : !strcmp(value, "draft") ? WIRE_SPECULATE_DRAFT
                                                 : WIRE_SPECULATE_OFF;
        break;
    case O_DRAFT_MODEL: a->draft_model = value; break;
    case O_SPECULATE_WAVES:
        rc = strata_stage_flag_int("--speculate-waves", value, 1, 4, &a->speculate_waves);
        break;
    case O_SPECULATE_ORACLE: {
        const char *colon = strrchr(value, ':');
        char *end = NULL;
        if (colon) a->oracle_accept = strtod(colon + 1, &end);
        if (!colon || colon == value || end == colon + 1 || *end || !(a->oracle_accept >= 0) ||
            !(a->oracle_accept <= 1) || (size_t)(colon - value) >= sizeof a->oracle_path) {
            fprintf(stderr,
                    "strata-stage: --speculate-oracle is FILE:P with P in [0, 1], not '%s'\n",
                    value);
            rc = -1;
            break;
        }
        memcpy(a->oracle_path, value, (size_t)(colon - value));
        a->oracle_path[colon - value] = '\0';
        a->oracle_file = a->oracle_path;
        break;
    }
    case O_SPECULATE_K:
        rc =
            strata_stage_flag_int("--speculate-k", value, 1, WIRE_SPECULATE_MAX_K, &a->speculate_k);
        break;
    case O_KV_DTYPE:
        if (kv_dtype_parse(value, &a->kv_dtype) < 0) {
            fprintf(stderr, "strata-stage: --kv-dtype: %s\n", strata_last_error());
            rc = -1;
        }
        break;
    case O_QUEUE_TIMEOUT:
        rc = strata_stage_flag_int("--queue-timeout-ms", value, 0, 3600000, &a->queue_timeout_ms);
        break;
    case O_DELAY:
        rc = strata_stage_flag_int("--step-delay-ms", value, 0, 60000, &a->step_delay_ms);
        break;
    case O_STAGE_STATS: a->stage_stats = 1; break;
    case O_LOG: rc = strata_stage_parse_log_level(value, &a->log_level); break;
    case O_TP: rc = strata_stage_flag_int("--tp", value, 1, COLL_MAX_RANKS, &a->tp); break;
    case O_TP_RANK:
        rc = strata_stage_flag_int("--tp-rank", value, 0, COLL_MAX_RANKS - 1, &a->tp_rank);
        break;
    case O_TP_PEERS: a->tp_peers = value; break;
    case O_KVP: rc = strata_stage_flag_int("--kvp", value, 1, COLL_MAX_RANKS, &a->kvp); break;
    case O_KVP_RANK:
        rc = strata_stage_flag_int("--kvp-rank", value, 0, COLL_MAX_RANKS - 1, &a->kvp_rank);
        break;
    case O_KVP_TOKENS:
        rc = strata_stage_flag_int("--kvp-tokens", value, 1, 1 << 24, &a->kvp_tokens);
        break;
    case O_TP_TCP: a->tp_tcp = 1; break;
    case O_TP_TIMEOUT:
        rc = strata_stage_flag_int("--tp-timeout-ms", value, 1, 3600000, &a->tp_timeout_ms);
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
    /* A draft model drafts by default; drafting by one needs one. */
    if (rc == 0 && a->draft_model && a->speculate == WIRE_SPECULATE_DEFAULT)
        a->speculate = WIRE_SPECULATE_DRAFT;
    if (rc == 0 && a->speculate == WIRE_SPECULATE_DRAFT && !a->draft_model) {
        fprintf(stderr, "strata-stage: --speculate draft needs --draft-model DIR\n");
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
    if (rc == 0 && a->split_decode && a->layer_start >= 0) {
        fprintf(stderr, "strata-stage: --split decode chooses the range: not with --layer-start\n");
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
    a->chunk_size = STAGE_PLAN_DEFAULT_CHUNK;
    a->log_level = STAGE_LOG_INFO;
    a->peer_timeout_ms = 10000;
    a->tp = 1;
    a->kvp = 1;
    a->tp_timeout_ms = COLL_DEFAULT_TIMEOUT_MS;
    a->drain_timeout_ms = 10000;
    a->recovery_timeout_ms = 10000;
    a->max_queue = 256;
    a->kv_dtype = OPS_F16; /* README "KV storage type": ten times closer than bf16, half of f32 */
    a->queue_timeout_ms = 30000;
    a->kv_keep_mb = 1024;
}

int strata_stage_parse_args(struct args *a, int argc, char **argv) {
    int c, rc = 0;
    args_defaults(a);
    while (rc == 0 && (c = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        if (c == O_HELP) return 1;
        rc = parse_option(a, c, optarg);
    }
    return rc == 0 ? check_args(a, argc, argv) : rc;
}
