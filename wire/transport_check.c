/* strata-transport-check: end-to-end integrity check of the wire stack on loopback.
 *
 * A source thread sends alternating Activation and KvBlock frames of random sizes and
 * random contents through N hops (source -> relay 1 -> ... -> sink, one TCP connection
 * per hop, each opened with the authenticated Hello handshake). Every relay verifies,
 * reads and rebuilds each frame before forwarding it (so builder, verifier and reader are
 * all on the path), and the sink regenerates the expected contents from the seed and
 * compares every byte, the FNV-1a checksum of each payload and the step order. A Control
 * Shutdown frame ends the run. Exit 0 only if every frame arrived intact and in order. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/wire.h"

#define MAX_HOPS 16
#define KV_LAYERS 2
#define KV_HEADS 2
#define KV_HEAD_DIM 16

struct options {
    int hops, frames, max_tokens, hidden, timeout_ms;
    int corrupt_frame; /* >= 0: relay 1 flips one payload byte of this frame (self-test) */
    uint64_t seed;
    struct wire_auth_key key;
};

struct node {
    const struct options *opt;
    int index;                     /* 0 = source, hops = sink */
    struct wire_listener listener; /* where the previous node connects (not for the source) */
    int next_port;                 /* next node's port (not for the sink) */
    int status;
    char error[512];
    uint64_t frames, bytes, checksum_mismatches, order_mismatches;
};

static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_random(void *dst, size_t n, uint64_t *state) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = splitmix(state);
        memcpy(p + i, &r, n - i < 8 ? n - i : 8);
    }
}

#define FNV_OFFSET 0xcbf29ce484222325ull

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; ++i)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The contents of frame `step`: its kind, token count and payload bytes, all derived from
 * the seed so the sink can regenerate them. Buffers are malloc'd into *payload. */
struct frame_plan {
    int is_kv, tokens;
    size_t nbytes;
    uint8_t *payload; /* activation: hidden [T, H] f32; KV: k then v [L, 1, heads, T, D] */
};

static int plan_frame(struct frame_plan *plan, const struct options *opt, uint64_t step) {
    uint64_t state = opt->seed ^ (step * 0xd1b54a32d192ed03ull);
    plan->is_kv = (int)(step % 2);
    plan->tokens = 1 + (int)(splitmix(&state) % (uint64_t)opt->max_tokens);
    plan->nbytes = plan->is_kv ? 2 * (size_t)KV_LAYERS * KV_HEADS * plan->tokens * KV_HEAD_DIM * 4
                               : (size_t)plan->tokens * opt->hidden * 4;
    plan->payload = malloc(plan->nbytes);
    if (!plan->payload)
        return strata_set_error(STRATA_ENOMEM, "cannot allocate %zu bytes", plan->nbytes);
    fill_random(plan->payload, plan->nbytes, &state);
    return 0;
}

static int build_planned(struct wire_arena *arena, const struct frame_plan *plan, uint64_t step) {
    if (plan->is_kv) {
        struct wire_kv_block kv;
        int32_t length = plan->tokens;
        memset(&kv, 0, sizeof kv);
        kv.stage_from = 0;
        kv.stage_to = 1;
        kv.step = step;
        kv.nonce = step * 7 + 1;
        kv.layer_start = 0;
        kv.layer_end = KV_LAYERS;
        kv.lengths = &length;
        kv.num_lengths = 1;
        const int64_t shape[5] = {KV_LAYERS, 1, KV_HEADS, plan->tokens, KV_HEAD_DIM};
        struct wire_tensor *tensors[2] = {&kv.k, &kv.v};
        for (int i = 0; i < 2; ++i) {
            tensors[i]->defined = 1;
            tensors[i]->ndim = 5;
            memcpy(tensors[i]->shape, shape, sizeof shape);
            tensors[i]->nbytes = plan->nbytes / 2;
            tensors[i]->data = plan->payload + i * (plan->nbytes / 2);
        }
        return wire_build_kv_block(arena, &kv);
    }
    struct wire_activation act;
    memset(&act, 0, sizeof act);
    act.stage_from = 0;
    act.stage_to = 1;
    act.step = step;
    act.nonce = step * 7 + 1;
    act.hidden.defined = 1;
    act.hidden.ndim = 2;
    act.hidden.shape[0] = plan->tokens;
    act.hidden.shape[1] = (int64_t)plan->nbytes / 4 / plan->tokens;
    act.hidden.nbytes = plan->nbytes;
    act.hidden.data = plan->payload;
    return wire_build_activation(arena, &act);
}

static int fail_node(struct node *n, int code) {
    snprintf(n->error, sizeof n->error, "%s", strata_last_error());
    n->status = code;
    return code;
}

/* Opens the hop to the next node as the handshake client. */
static int connect_next(struct wire_conn *conn, struct node *n) {
    struct wire_hello self, peer;
    memset(&self, 0, sizeof self);
    self.stage_index = n->index;
    self.role = WIRE_ROLE_STAGE;
    snprintf(self.name, sizeof self.name, "node-%d", n->index);
    int rc = wire_connect(conn, NULL, n->next_port, 0, n->opt->timeout_ms);
    if (!rc) rc = wire_handshake_client(&peer, conn, &self, &n->opt->key, n->opt->timeout_ms);
    return rc;
}

static int accept_previous(struct wire_conn *conn, struct node *n) {
    struct wire_hello self, peer;
    memset(&self, 0, sizeof self);
    self.stage_index = n->index;
    self.role = WIRE_ROLE_STAGE;
    int rc = wire_accept(conn, &n->listener, 0, n->opt->timeout_ms);
    if (!rc) rc = wire_handshake_server(&peer, conn, &self, &n->opt->key, n->opt->timeout_ms);
    return rc;
}

static void *source_main(void *arg) {
    struct node *n = arg;
    struct wire_conn conn = {0};
    struct wire_arena arena = {0};
    struct frame_plan plan = {0};
    int rc = wire_arena_init(&arena, 0);
    if (!rc) rc = connect_next(&conn, n);
    for (uint64_t step = 0; !rc && step < (uint64_t)n->opt->frames; ++step) {
        rc = plan_frame(&plan, n->opt, step);
        if (!rc) rc = build_planned(&arena, &plan, step);
        if (!rc)
            rc = wire_send_frame(&conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                                 n->opt->timeout_ms);
        if (!rc) n->bytes += wire_arena_frame_len(&arena);
        n->frames += !rc;
        free(plan.payload);
        plan.payload = NULL;
    }
    struct wire_control stop = {.kind = WIRE_CONTROL_SHUTDOWN, .seq = (uint64_t)n->opt->frames};
    if (!rc) rc = wire_build_control(&arena, &stop);
    if (!rc)
        rc = wire_send_frame(&conn, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                             n->opt->timeout_ms);
    if (rc) fail_node(n, rc);
    wire_arena_free(&arena);
    wire_close(&conn);
    return NULL;
}

/* Self-test of the checker: rebuilds activation `act` with one payload bit flipped. */
static int build_corrupted(struct wire_arena *arena, struct wire_activation *act) {
    uint8_t *copy = malloc(act->hidden.nbytes);
    if (!copy)
        return strata_set_error(STRATA_ENOMEM, "cannot allocate %zu bytes", act->hidden.nbytes);
    memcpy(copy, act->hidden.data, act->hidden.nbytes);
    copy[act->hidden.nbytes / 2] ^= 0x10;
    act->hidden.data = copy;
    int rc = wire_build_activation(arena, act);
    free(copy);
    return rc;
}

/* Relay: read each frame into structs and rebuild it for the next hop. */
static int relay_frame(struct wire_arena *arena, const uint8_t *frame, size_t len,
                       enum wire_kind kind, const struct node *n) {
    int index = n->index;
    if (kind == WIRE_KIND_ACTIVATION) {
        struct wire_activation act;
        int rc = wire_read_activation(&act, frame, len);
        act.stage_from = index;
        act.stage_to = index + 1;
        if (!rc && index == 1 && act.step == (uint64_t)n->opt->corrupt_frame)
            return build_corrupted(arena, &act);
        return rc ? rc : wire_build_activation(arena, &act);
    }
    if (kind == WIRE_KIND_KV_BLOCK) {
        struct wire_kv_block kv;
        int rc = wire_read_kv_block(&kv, frame, len);
        kv.stage_from = index;
        kv.stage_to = index + 1;
        return rc ? rc : wire_build_kv_block(arena, &kv);
    }
    struct wire_control control;
    int rc = wire_read_control(&control, frame, len);
    return rc ? rc : wire_build_control(arena, &control);
}

/* Sink: compare one frame against the regenerated plan. Returns 1 if it is the shutdown. */
static int check_frame(struct node *n, const uint8_t *frame, size_t len, enum wire_kind kind,
                       uint64_t expected_step) {
    if (kind == WIRE_KIND_CONTROL) return 1;
    struct frame_plan plan;
    if (plan_frame(&plan, n->opt, expected_step)) return fail_node(n, STRATA_ENOMEM);
    const uint8_t *parts[2] = {NULL, NULL};
    size_t part_bytes[2] = {0, 0};
    uint64_t step = UINT64_MAX;
    int rc = 0;
    if (kind == WIRE_KIND_ACTIVATION) {
        struct wire_activation act;
        rc = wire_read_activation(&act, frame, len);
        step = act.step;
        parts[0] = act.hidden.data;
        part_bytes[0] = act.hidden.nbytes;
        if (!rc && act.stage_from != n->index - 1) n->order_mismatches++;
    } else {
        struct wire_kv_block kv;
        rc = wire_read_kv_block(&kv, frame, len);
        step = kv.step;
        parts[0] = kv.k.data;
        part_bytes[0] = kv.k.nbytes;
        parts[1] = kv.v.data;
        part_bytes[1] = kv.v.nbytes;
    }
    if (rc) {
        free(plan.payload);
        return fail_node(n, rc);
    }
    if (step != expected_step || plan.is_kv != (kind == WIRE_KIND_KV_BLOCK)) n->order_mismatches++;
    size_t total = part_bytes[0] + part_bytes[1];
    int same = total == plan.nbytes && memcmp(parts[0], plan.payload, part_bytes[0]) == 0 &&
               (!parts[1] || memcmp(parts[1], plan.payload + part_bytes[0], part_bytes[1]) == 0);
    uint64_t want = fnv1a(FNV_OFFSET, plan.payload, plan.nbytes);
    uint64_t got = fnv1a(fnv1a(FNV_OFFSET, parts[0], part_bytes[0]), parts[1], part_bytes[1]);
    if (!same || got != want) n->checksum_mismatches++;
    free(plan.payload);
    return 0;
}

static void *forward_main(void *arg) {
    struct node *n = arg;
    int is_sink = n->index == n->opt->hops;
    struct wire_conn in = {0}, out = {0};
    struct wire_arena arena = {0};
    int rc = wire_arena_init(&arena, 0);
    if (!rc) rc = accept_previous(&in, n);
    if (!rc && !is_sink) rc = connect_next(&out, n);
    for (uint64_t step = 0; !rc; ++step) {
        const uint8_t *frame;
        size_t len;
        enum wire_kind kind;
        rc = wire_recv_frame(&in, &frame, &len, n->opt->timeout_ms);
        if (!rc) rc = wire_verify(&kind, NULL, frame, len);
        if (rc) break;
        n->frames++;
        n->bytes += len;
        if (is_sink) {
            int done = check_frame(n, frame, len, kind, step);
            if (done != 0) {
                rc = done == 1 ? 0 : done;
                n->frames--;
                break;
            }
            continue;
        }
        rc = relay_frame(&arena, frame, len, kind, n);
        if (!rc)
            rc = wire_send_frame(&out, wire_arena_frame(&arena), wire_arena_frame_len(&arena),
                                 n->opt->timeout_ms);
        if (!rc && kind == WIRE_KIND_CONTROL) break;
    }
    if (rc && !n->status) fail_node(n, rc);
    wire_arena_free(&arena);
    wire_close(&in);
    wire_close(&out);
    return NULL;
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: strata-transport-check [options]\n"
        "Sends random Activation and KvBlock frames through N loopback hops (each relay\n"
        "verifies, reads and rebuilds them) and checks every byte and the order at the end.\n"
        "  --hops N            TCP hops (1..%d, default 3)\n"
        "  --frames M          frames to send (default 200)\n"
        "  --max-tokens T      rows per frame, random in 1..T (default 64)\n"
        "  --hidden H          hidden size of activations (default 1024)\n"
        "  --seed S            random seed (default 1)\n"
        "  --auth-key-file F   pre-shared key (default: $%s, else a random per-run key)\n"
        "  --timeout-ms MS     per-operation timeout (default 10000)\n"
        "  --corrupt-frame K   self-test: relay 1 flips a bit in activation frame K (even K,\n"
        "                      --hops >= 2); the check must then fail\n"
        "Exit codes: 0 all frames intact and in order, 1 mismatch or transport failure, 2 usage.\n",
        MAX_HOPS, WIRE_AUTH_KEY_ENV);
}

/* Fills *opt from the command line and loads the key. Returns -1 to go on, else the exit
 * code (--help or a bad command line). */
static int parse_args(struct options *opt, int argc, char **argv) {
    static const struct option longopts[] = {{"hops", required_argument, 0, 'n'},
                                             {"frames", required_argument, 0, 'f'},
                                             {"max-tokens", required_argument, 0, 't'},
                                             {"hidden", required_argument, 0, 'H'},
                                             {"seed", required_argument, 0, 's'},
                                             {"auth-key-file", required_argument, 0, 'k'},
                                             {"timeout-ms", required_argument, 0, 'o'},
                                             {"corrupt-frame", required_argument, 0, 'c'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *key_file = NULL;
    int c, bad = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'n': bad |= cli_parse_int(optarg, 1, MAX_HOPS, &opt->hops) != 0; break;
        case 'f': bad |= cli_parse_int(optarg, 1, 1000000, &opt->frames) != 0; break;
        case 't': bad |= cli_parse_int(optarg, 1, 1 << 16, &opt->max_tokens) != 0; break;
        case 'H': bad |= cli_parse_int(optarg, 1, 1 << 16, &opt->hidden) != 0; break;
        case 'o': bad |= cli_parse_int(optarg, 1, 3600000, &opt->timeout_ms) != 0; break;
        case 's': opt->seed = strtoull(optarg, NULL, 10); break;
        case 'k': key_file = optarg; break;
        case 'c': bad |= cli_parse_int(optarg, 0, 1000000, &opt->corrupt_frame) != 0; break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: bad = 1;
        }
    }
    if (bad || optind != argc) {
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    if (wire_auth_key_load(&opt->key, key_file, NULL)) {
        fprintf(stderr, "strata-transport-check: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    if (opt->key.len == 0) { /* no key given: a random one still exercises the HMAC path */
        uint64_t s = opt->seed ^ (uint64_t)time(NULL);
        opt->key.len = 32;
        fill_random(opt->key.bytes, 32, &s);
    }
    return -1;
}

/* Opens every relay's listener, runs one thread per node and returns the wall time in
 * seconds, or a negative value when a listener could not be opened. */
static double run_hops(struct node *nodes, const struct options *opt) {
    pthread_t threads[MAX_HOPS + 1];
    for (int i = 0; i <= opt->hops; ++i) {
        nodes[i].opt = opt;
        nodes[i].index = i;
        if (i > 0 && wire_listen(&nodes[i].listener, NULL, 0)) {
            fprintf(stderr, "strata-transport-check: %s\n", strata_last_error());
            return -1.0;
        }
    }
    for (int i = 0; i < opt->hops; ++i)
        nodes[i].next_port = nodes[i + 1].listener.port;
    double start = cli_now_sec();
    for (int i = 0; i <= opt->hops; ++i)
        pthread_create(&threads[i], NULL, i == 0 ? source_main : forward_main, &nodes[i]);
    for (int i = 0; i <= opt->hops; ++i)
        pthread_join(threads[i], NULL);
    double seconds = cli_now_sec() - start;
    for (int i = 1; i <= opt->hops; ++i)
        wire_listener_close(&nodes[i].listener);
    return seconds;
}

/* Prints the per-node failures and the summary; returns the exit code. */
static int report(const struct node *nodes, const struct options *opt, double seconds) {
    const struct node *sink = &nodes[opt->hops];
    int failed = 0;
    for (int i = 0; i <= opt->hops; ++i)
        if (nodes[i].status) {
            fprintf(stderr, "strata-transport-check: node %d failed: %s\n", i, nodes[i].error);
            failed = 1;
        }
    printf(
        "hops %d, frames sent %llu, received %llu, %.1f MB per hop, %.3f s (%.2f GB/s per hop)\n",
        opt->hops, (unsigned long long)nodes[0].frames, (unsigned long long)sink->frames,
        (double)nodes[0].bytes / 1e6, seconds, (double)nodes[0].bytes / seconds / 1e9);
    printf("payload mismatches %llu, order mismatches %llu\n",
           (unsigned long long)sink->checksum_mismatches,
           (unsigned long long)sink->order_mismatches);
    if (failed || sink->frames != (uint64_t)opt->frames || sink->checksum_mismatches ||
        sink->order_mismatches) {
        printf("FAIL\n");
        return STRATA_EXIT_FAILURE;
    }
    printf("OK: every byte and the order of all %d frames verified through %d hops\n", opt->frames,
           opt->hops);
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    struct options opt = {3, 200, 64, 1024, 10000, -1, 1, {0}};
    struct node nodes[MAX_HOPS + 1];
    int rc = parse_args(&opt, argc, argv);
    if (rc >= 0) return rc;
    memset(nodes, 0, sizeof nodes);
    double seconds = run_hops(nodes, &opt);
    wire_auth_key_clear(&opt.key);
    if (seconds < 0) return STRATA_EXIT_FAILURE;
    return report(nodes, &opt, seconds);
}
