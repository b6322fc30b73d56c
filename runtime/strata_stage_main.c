/* strata-stage: one process of a pipeline. Loads the weights of its layer range, prints what
 * it serves, and runs the TCP stage loop (runtime/stage/stage_server.h) until SIGINT/SIGTERM.
 * With --tp T it is one rank of its stage's tensor-parallel group (runtime/stage/stage_tp.h):
 * rank 0 serves the stage and leads, the others follow rank 0 until it stops.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage (including an empty or out-of-range shard),
 * 3 bad model, config, weights or KV file. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime/base/cli.h"
#include "runtime/strata_stage_args.h"
#include "runtime/base/log.h"
#include "runtime/base/progress_printer.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "reference/kv_cache.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/oracle_draft.h"
#include "runtime/stage/stage_open.h"
#include "runtime/stage/stage_server.h"
#include "runtime/stage/stage_tp.h"
#include "runtime/strata_stage_probe.h"
#include "wire/auth.h"
#include "wire/message.h"
#include "wire/tls.h"

static volatile sig_atomic_t stop_flag;

/* --role vision: the vision stage (runtime/strata_vision_main.c) takes the command line. */
int strata_vision_main(int argc, char **argv);

/* --calibrate: measures the box for the performance model (runtime/strata_calibrate_main.c). */
int strata_calibrate_main(int argc, char **argv);

static int wants_calibrate(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--calibrate")) return 1;
    return 0;
}

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
    uint8_t fingerprint[WIRE_FINGERPRINT_BYTES];       /* the ring's Hello: model, weights */
    uint8_t group_fingerprint[WIRE_FINGERPRINT_BYTES]; /* a TP group's: the KV dtype too */
    /* Tensor parallelism (--tp >= 2): the stage's group, this rank's place in it, and a
     * follower's backend (rank 0 has r->stage instead). */
    struct coll *coll;
    struct stage_tp_config tp;
    char group[64];
    struct stage_backend *follower;
    struct oracle_draft *oracle;   /* --speculate-oracle (benchmarks) */
    struct model_config draft_cfg; /* --draft-model: its config and weights */
    struct safetensors *draft_st;
};

static void run_close(struct run *r) {
    stage_close(&r->stage); /* a TP leader sends its followers STOP here */
    oracle_draft_free(r->oracle);
    safetensors_close(r->draft_st);
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
    if (model_config_read(&r->config_json, &r->config_len, config_path) < 0 ||
        model_config_parse(&r->cfg, r->config_json, r->config_len, config_path) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    return STRATA_EXIT_OK;
}

/* --split decode: this stage's range from stage_plan_decode over the config's shapes (every
 * stage computes the same split from the same config.json). Returns an exit code. */
static int resolve_split(struct run *r, struct args *a) {
    struct stage_memory_model mm;
    struct stage_memory_options mo = {
        .kv_dtype_bytes = 4, .max_seq = 1, .batch = 1, .chunk_tokens = 1};
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    if (!a->split_decode) return STRATA_EXIT_OK;
    if (a->num_stages > STAGE_PLAN_MAX_STAGES ||
        stage_memory_model_build(&mm, &r->cfg, NULL, &mo) < 0 ||
        stage_plan_decode(ranges, &mm, a->num_stages) < 0) {
        fprintf(stderr, "strata-stage: --split decode: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    a->layer_start = ranges[a->stage_idx].layer_start;
    a->layer_end = ranges[a->stage_idx].layer_end;
    return STRATA_EXIT_OK;
}

/* Config, shard, weights, backend and core: returns an exit code (0 = opened). */
static int open_stage(struct run *r, const struct args *a) {
    struct stage_tensor_list report;
    struct stage_role role;
    const char *source = a->model_dir ? a->model_dir : a->weights;
    struct progress_printer progress; /* stderr: stdout's summary is what tests parse */
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
    if (a->draft_model && a->stage_idx == 0) {
        if (model_config_load(&r->draft_cfg, a->draft_model) < 0 ||
            safetensors_open(&r->draft_st, a->draft_model) < 0) {
            fprintf(stderr, "strata-stage: --draft-model: %s\n", strata_last_error());
            return STRATA_EXIT_INPUT;
        }
    }
    if (a->oracle_file && a->stage_idx == 0 &&
        oracle_draft_load(&r->oracle, a->oracle_file, a->oracle_accept) < 0) {
        fprintf(stderr, "strata-stage: --speculate-oracle: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    progress_printer_init(&progress, stderr, "loading weights",
                          progress_mode_from_env("STRATA_PROGRESS"));
    struct stage_open_options o = {.cfg = &r->cfg,
                                   .weights = r->st,
                                   .weights_source = source,
                                   .stage_index = a->stage_idx,
                                   .num_stages = a->num_stages,
                                   .layer_start = role.layer_start,
                                   .layer_end = role.layer_end,
                                   .device = a->device,
                                   .num_threads = a->threads,
                                   .weights_dtype = a->weights_dtype,
                                   .weights_in_file = a->weights_in_file,
                                   .max_seq = a->max_seq,
                                   .max_batch = a->max_batch,
                                   .kv_memory = a->kv_memory,
                                   .kv_memory_fraction = a->kv_memory_fraction,
                                   .kv_dtype = a->kv_dtype,
                                   .chunk_size = a->chunk_size,
                                   .keep_logits = role.with_head && a->out,
                                   .send_kv = a->send_kv,
                                   .speculate = a->speculate,
                                   .speculate_k = a->speculate_k,
                                   .speculate_waves = a->speculate_waves,
                                   .oracle = r->oracle,
                                   .draft_cfg = r->draft_st ? &r->draft_cfg : NULL,
                                   .draft_weights = r->draft_st,
                                   .tp = a->tp * a->kvp > 1 ? &r->tp : NULL,
                                   .progress = progress_printer_callback(&progress),
                                   .now_sec = cli_now_sec};
    /* A TP / KVP rank other than the group's rank 0 follows it: its shard's backend only. */
    int follower = a->tp * a->kvp > 1 && (a->tp_rank > 0 || a->kvp_rank > 0);
    rc = follower ? stage_open_follower(&r->follower, &o, &report)
                  : stage_open(&r->stage, &o, &report);
    if (rc < 0 && follower)
        strata_wrap_error(rc, "TP rank %d / KVP rank %d", a->tp_rank, a->kvp_rank);
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
    if (follower) return STRATA_EXIT_OK;
    stage_core_set_recovery_timeout(r->stage.core, a->recovery_timeout_ms);
    stage_core_set_prefix_cache(r->stage.core, !a->no_prefix_cache);
    if ((rc = stage_core_set_admission(r->stage.core, a->max_queue, a->queue_timeout_ms)) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
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

/* The summary's KV line: the pool as blocks, bytes and tokens, and the per-request caps. */
static void print_kv(const struct stage_backend *be) {
    struct stage_kv_usage u;
    char size[32];
    stage_backend_kv_usage(be, &u);
    stage_plan_format_size(size, sizeof size, stage_backend_kv_bytes(be));
    printf("kv cache: %d blocks of %d positions = %lld tokens, %s %s; up to %d requests of at "
           "most %d positions\n",
           u.blocks, u.block_positions, (long long)u.blocks * u.block_positions, size,
           kv_dtype_name(u.dtype), be->num_slots, be->max_seq);
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
    strata_stage_print_cpus(a->pin_cpus);
    print_kv(r->follower);
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
    strata_stage_print_cpus(a->pin_cpus);
    print_kv(r->stage.backend);
    if (info.stage_index == 0 && r->oracle)
        printf("speculation: ORACLE drafts from %s, each right with probability %g, %d per "
               "decode step (a benchmark instrument)\n",
               a->oracle_file, a->oracle_accept, a->speculate_k ? a->speculate_k : 4);
    else if (info.stage_index == 0 && r->stage.draft)
        printf("speculation: draft model %s (%d layers, hidden %d), %s by default, up to %d per "
               "decode step\n",
               a->draft_model, r->draft_cfg.num_layers, r->draft_cfg.hidden_size,
               a->speculate == WIRE_SPECULATE_DRAFT   ? "drafts"
               : a->speculate == WIRE_SPECULATE_NGRAM ? "ngram drafts"
                                                      : "off",
               a->speculate_k ? a->speculate_k : 4);
    else if (info.stage_index == 0 && a->speculate == WIRE_SPECULATE_NGRAM)
        printf("speculation: ngram drafts, up to %d per decode step, for requests that do not "
               "choose\n",
               a->speculate_k ? a->speculate_k : 4);
    else if (info.stage_index == 0)
        printf("speculation: off for requests that do not choose (--speculate ngram)\n");
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
     * "float32"). v2: the 16-lane accumulation of reference/ops_q8.h (session 24), whose
     * logits differ in the last bits from the first version's 8 lanes. */
    const char *dtype =
        a->weights_dtype && !strcmp(a->weights_dtype, "q8") ? "float32+q8v2-weights" : "float32";
    /* A TP / KVP group's ranks must also store their KV alike (their pools and logits go
     * together); stages of a ring need not (each stage's cache is its own, and a KV block
     * names the dtype it was stored as: kv_cache_restore refuses another), and a vision
     * stage has none. */
    char group_dtype[96];
    snprintf(group_dtype, sizeof group_dtype, "%s+kv-%s", dtype, kv_dtype_name(a->kv_dtype));
    if (wire_model_fingerprint(r->fingerprint, r->config_json, r->config_len, dtype) < 0 ||
        wire_model_fingerprint(r->group_fingerprint, r->config_json, r->config_len, group_dtype) <
            0) {
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
                               .fingerprint = r->group_fingerprint};
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
    so.stage_stats = a->stage_stats;
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
    if (wants_calibrate(argc, argv)) return strata_calibrate_main(argc, argv);
    int code, parsed = strata_stage_parse_args(&a, argc, argv);
    memset(&r, 0, sizeof r);
    if (parsed == 1) {
        strata_stage_usage(stdout);
        return STRATA_EXIT_OK;
    }
    if (parsed < 0) {
        /* The message above names the problem; the full flag list is one --help away. */
        fprintf(stderr, "usage: strata-stage --model DIR --num-stages S --stage-idx R ... "
                        "(strata-stage --help lists every flag)\n");
        return STRATA_EXIT_USAGE;
    }
    /* Before any thread starts (the pool, the links'), so that every one inherits it. */
    if (strata_stage_pin_cpus(a.pin_cpus ? &a.cpus : NULL, a.threads) < 0) return STRATA_EXIT_USAGE;
    stage_log_setup(a.stage_idx, a.log_level);
    if (strata_stage_parse_listen(a.listen, r.listen_host, sizeof r.listen_host, &r.listen_port) <
        0)
        return STRATA_EXIT_USAGE;
    if (a.standby && r.listen_port == 0) {
        fprintf(stderr, "strata-stage: --standby needs a fixed --listen port (the primary's)\n");
        return STRATA_EXIT_USAGE;
    }
    code = open_config(&r, &a);
    if (code == STRATA_EXIT_OK && a.probe_links) { /* the links, not the model: no weights */
        code = setup_links(&r, &a);
        if (code == STRATA_EXIT_OK)
            code = strata_stage_probe_links(&a, r.listen_host, r.listen_port, r.security.tls,
                                            r.cfg.hidden_size);
        run_close(&r);
        return code;
    }
    if (code == STRATA_EXIT_OK) code = resolve_split(&r, &a);
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
