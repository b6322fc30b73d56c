/* strata-stage's command line (runtime/strata_stage_main.c): the flags, their defaults and
 * the checks between them, apart from what the process does with them; its flag parsers
 * also serve --role vision (runtime/strata_vision_main.c). */
#ifndef STRATA_RUNTIME_STRATA_STAGE_ARGS_H
#define STRATA_RUNTIME_STRATA_STAGE_ARGS_H

#include <stdio.h>

#include "runtime/base/cpu_pin.h"
#include "runtime/model/tp_shard.h"
#include "runtime/stage/stage_server.h"

struct args {
    const char *model_dir, *hf_config, *weights;
    int num_stages, stage_idx, layer_start, layer_end;
    int split_decode; /* --split decode: the layers from stage_plan_decode, not the even split */
    const char *listen, *port_file, *next_host, *next_port_file;
    int next_port;
    const char *device, *weights_dtype;
    int weights_in_file; /* --weights-in-file */
    int threads, max_seq, max_batch, chunk_size;
    struct cpu_pin cpus; /* --cpus LIST, where pin_cpus */
    int pin_cpus;
    size_t kv_memory;           /* --kv-memory SIZE (bytes), or */
    double kv_memory_fraction;  /* --kv-memory PCT (a share of the memory free after loading) */
    enum ops_dtype kv_dtype;    /* --kv-dtype */
    int no_prefix_cache;        /* --no-prefix-cache */
    int speculate, speculate_k; /* --speculate off|ngram (enum wire_speculate), --speculate-k */
    int speculate_waves;        /* --speculate-waves */
    const char *draft_model;    /* --draft-model DIR (stage 0) */
    const char *oracle_file;    /* --speculate-oracle FILE:ACCEPT (benchmarks): FILE, or NULL */
    char oracle_path[4096];
    double oracle_accept;
    int kv_recovery, kv_keep_mb;
    int send_kv, recv_kv, step_delay_ms, peer_timeout_ms, drain_timeout_ms, recovery_timeout_ms;
    int stage_stats;                 /* --stage-stats */
    int max_queue, queue_timeout_ms; /* stage 0's admission queue */
    int standby;
    const char *kv_out, *kv_restore, *out, *auth_key_file;
    const char *probe_links; /* --probe-links FILE: measure the link to the next stage, exit */
    const char *tls_cert, *tls_key, *tls_ca;
    int insecure;
    enum stage_log_level log_level;
    int tp, tp_rank, tp_tcp, tp_timeout_ms, kvp, kvp_rank, kvp_tokens;
    const char *tp_peers;
    enum tp_moe_mode moe;
};

/* A flag's integer value in [lo, hi] (runtime/base/cli.h), or -1 after naming the flag and
 * the range on stderr. */
int strata_stage_flag_int(const char *flag, const char *text, int lo, int hi, int *out);

/* --listen "ADDR:PORT", ":PORT" or "PORT" (NULL: 127.0.0.1 and port 0, any free one) into
 * host [cap] and *port: 0, or -1 after printing what is wrong. */
int strata_stage_parse_listen(const char *text, char *host, size_t cap, int *port);

/* --cpus LIST into *out: 0, or -1 after printing what is wrong. */
int strata_stage_flag_cpus(const char *text, struct cpu_pin *out);

/* Pins this process to --cpus (p NULL: none given, nothing to do) before it starts a thread,
 * so every thread inherits it: 0, or -1 after printing why not (a CPU it may not use, more
 * threads than CPUs). */
int strata_stage_pin_cpus(const struct cpu_pin *p, int threads);

/* The startup summary's line of the CPUs this process runs on and why (--cpus, or every CPU
 * it may use), on stdout. */
void strata_stage_print_cpus(int pinned);

/* --log-level error|warn|info|debug: 0, or -1 after printing what is wrong. */
int strata_stage_parse_log_level(const char *text, enum stage_log_level *out);

/* The --help text. */
void strata_stage_usage(FILE *out);

/* Fills `a` from argv: 0 ok, 1 for --help, -1 after printing what is wrong. */
int strata_stage_parse_args(struct args *a, int argc, char **argv);

#endif
