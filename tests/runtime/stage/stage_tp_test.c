/* The TP leader / follower backends (runtime/stage/stage_tp.h) in one process: rank 0's
 * wrapped backend on the test thread, rank 1's follower loop on another, joined by a real
 * collective group found through "@FILE" peers (TCP ring, then shared memory). Each golden
 * case, text and VL (M-RoPE positions, DeepStack features and the visual mask travel in the
 * forward command), is prefilled and decoded through the leader: the greedy ids equal
 * transformers', the logits stay within 1e-3 of the golden and are bit-identical over TCP
 * and shared memory; the same through KVP 2 (each rank caching half the positions); TP 2
 * and KVP 2 are bit-identical to one rank's plain CPU backend (text and VL);
 * the greedy shortcut (stage_backend_argmax) picks argmax of the same logits at every step;
 * freeing the leader stops the follower (status 0). KV handoff is
 * refused under TP, and malformed peer lists are refused before anything is opened. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "reference/kv_blocks.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/stage_tp.h"
#include "tests/reference/golden_case.h"
#include "wire/collective.h"

struct rank {
    const struct golden_case *gc;
    char peers[512];
    int rank, tcp_only, kvp; /* kvp: the two ranks are KVP 2 (else TP 2) */
    struct coll *coll;
    struct stage_tp_config tp;
    struct stage_backend *be;
    int rc;
    uint64_t calls;
    char error[512];
};

static int open_rank(struct rank *r) {
    const struct model_config *c = &r->gc->cfg;
    char group[32];
    snprintf(group, sizeof group, "test.tp2");
    struct stage_tp_net net = {.peers = r->peers,
                               .size = 2,
                               .rank = r->rank,
                               .group = group,
                               .tcp_only = r->tcp_only,
                               .timeout_ms = 10000};
    int rc = stage_tp_connect(&r->coll, &net);
    if (rc) return rc;
    /* KVP: 16 x 2^p positions per rank (attention's aligned blocks), the smallest that
     * holds the sequence on two ranks */
    int max_seq = r->gc->n_prompt + r->gc->n_steps, tokens = GRID_KV_BLOCK;
    while (r->kvp && 2 * tokens < max_seq)
        tokens *= 2;
    if (r->kvp) max_seq = 2 * tokens;
    if (r->kvp)
        r->tp = (struct stage_tp_config){
            .tp = 1, .kvp = 2, .kvp_rank = r->rank, .kvp_tokens = tokens, .coll = r->coll};
    else
        r->tp = (struct stage_tp_config){.tp = 2, .tp_rank = r->rank, .coll = r->coll};
    struct stage_backend_options bo = {.cfg = c,
                                       .weights = r->gc->st,
                                       .role = {0, c->num_layers, 1, 1, 0},
                                       .num_threads = 1,
                                       .max_seq = max_seq,
                                       .num_slots = 2,
                                       .tp = &r->tp};
    return stage_tp_open(&r->be, &bo);
}

static void *follower_main(void *arg) {
    struct rank *r = arg;
    r->rc = open_rank(r);
    if (!r->rc) r->rc = stage_tp_follow(r->be, r->coll, &r->calls);
    if (r->rc) snprintf(r->error, sizeof r->error, "%s", strata_last_error());
    stage_backend_free(r->be);
    coll_close(r->coll);
    return NULL;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Prefill (image rows replaced by the merger outputs, DeepStack on them, HF's M-RoPE ids
 * for a VL case) and greedy decode through `be`; returns logits [n_steps, V]. */
static float *decode(struct stage_backend *be, const struct golden_case *gc) {
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    float *hidden = calloc((size_t)S * H, sizeof(float));
    float *logits = calloc((size_t)gc->n_steps * V, sizeof(float));
    float *scratch = calloc((size_t)V, sizeof(float));
    float *deepstack = NULL;
    uint8_t *visual = NULL;
    int slot, dummy;
    int32_t mrope[3];
    assert_non_null(hidden);
    assert_non_null(logits);
    assert_non_null(scratch);
    /* a second slot taken and given back: acquire / release replay on the follower */
    assert_int_equal(stage_backend_kv_acquire(be, &dummy), 0);
    assert_int_equal(stage_backend_kv_acquire(be, &slot), 0);
    stage_backend_kv_release(be, dummy);
    assert_int_equal(stage_backend_embed(be, hidden, gc->prompt, S), 0);
    struct forward_item item = {.slot = slot, .pos = 0, .n_tokens = S};
    if (gc->has_vision) {
        deepstack = calloc((size_t)gc->num_deepstack * S * H, sizeof(float));
        visual = calloc((size_t)S, 1);
        assert_non_null(deepstack);
        assert_non_null(visual);
        for (int i = 0, v = 0; i < S; ++i) {
            if (gc->prompt[i] != gc->image_token_id) continue;
            visual[i] = 1;
            memcpy(hidden + (size_t)i * H, gc->vision_embeds + (size_t)v * H, H * sizeof(float));
            for (int k = 0; k < gc->num_deepstack; ++k)
                memcpy(deepstack + ((size_t)k * S + i) * H,
                       gc->deepstack + ((size_t)k * gc->n_visual + v) * H, H * sizeof(float));
            v++;
        }
        item.mrope_positions = gc->position_ids;
        item.deepstack = deepstack;
        item.visual_mask = visual;
        item.num_deepstack = gc->num_deepstack;
    }
    for (int step = 0; step < gc->n_steps; ++step) {
        if (step) {
            int32_t token = gc->generated[step - 1];
            assert_int_equal(stage_backend_embed(be, hidden, &token, 1), 0);
            item = (struct forward_item){.slot = slot, .pos = S + step - 1, .n_tokens = 1};
            if (gc->has_vision) {
                mrope[0] = mrope[1] = mrope[2] = item.pos + gc->rope_delta;
                item.mrope_positions = mrope;
            }
        }
        if (stage_backend_forward(be, hidden, &item, 1))
            fail_msg("%s step %d: %s", gc->name, step, strata_last_error());
        assert_int_equal(stage_backend_logits(be, logits + (size_t)step * V,
                                              hidden + (size_t)(item.n_tokens - 1) * H, 1),
                         0);
        /* the greedy shortcut (TP_OP_ARGMAX on the follower): argmax of the same logits */
        int32_t id = -1;
        assert_int_equal(
            stage_backend_argmax(be, &id, hidden + (size_t)(item.n_tokens - 1) * H, 1, scratch), 0);
        assert_int_equal(id, argmax(logits + (size_t)step * V, V));
    }
    free(scratch);
    stage_backend_kv_release(be, slot);
    free(hidden);
    free(deepstack);
    free(visual);
    return logits;
}

/* The same run on one rank (the plain CPU backend, no group). */
static float *run_one(const struct golden_case *gc) {
    struct stage_backend *be = NULL;
    struct stage_backend_options bo = {.cfg = &gc->cfg,
                                       .weights = gc->st,
                                       .role = {0, gc->cfg.num_layers, 1, 1, 0},
                                       .num_threads = 1,
                                       .max_seq = gc->n_prompt + gc->n_steps,
                                       .num_slots = 2};
    if (stage_backend_open(&be, &bo)) fail_msg("one rank: %s", strata_last_error());
    float *logits = decode(be, gc);
    stage_backend_free(be);
    return logits;
}

/* One TP 2 run of `gc` over a fresh group; returns rank 0's logits. */
static float *run_group(const struct golden_case *gc, int tcp_only, int kvp, const char *dir,
                        int round) {
    struct rank r[2];
    pthread_t th;
    memset(r, 0, sizeof r);
    for (int k = 0; k < 2; ++k) {
        r[k].gc = gc;
        r[k].rank = k;
        r[k].tcp_only = tcp_only;
        r[k].kvp = kvp;
        snprintf(r[k].peers, sizeof r[k].peers, "127.0.0.1:@%s/%d.0,127.0.0.1:@%s/%d.1", dir, round,
                 dir, round);
    }
    assert_int_equal(pthread_create(&th, NULL, follower_main, &r[1]), 0);
    if (open_rank(&r[0])) fail_msg("rank 0: %s", strata_last_error());
    struct kv_handoff h;
    int slot = 0;
    assert_int_equal(stage_backend_kv_pack(r[0].be, &h, &slot, 1), STRATA_EINVAL);
    float *logits = decode(r[0].be, gc);
    stage_backend_free(r[0].be); /* sends STOP */
    pthread_join(th, NULL);
    coll_close(r[0].coll);
    if (r[1].rc) fail_msg("follower: %s", r[1].error);
    assert_true(r[1].calls > (uint64_t)gc->n_steps * 4);
    return logits;
}

/* Text only: greedy decode through `be` with the prompt's first `cached` blocks attached from
 * the pool (kept by an earlier run under keys [n_keys]) and the rest prefilled after them;
 * the prompt's blocks are kept under the keys again at the end. Logits [n_steps, V]. */
static float *decode_keyed(struct stage_backend *be, const struct golden_case *gc,
                           const uint64_t *keys, int n_keys, int cached) {
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    const int from = cached * KV_BLOCK;
    float *hidden = calloc((size_t)S * H, sizeof(float));
    float *logits = calloc((size_t)gc->n_steps * V, sizeof(float));
    int slot;
    assert_true(hidden && logits);
    assert_int_equal(stage_backend_kv_acquire(be, &slot), 0);
    if (cached) assert_int_equal(stage_backend_kv_attach(be, slot, keys, cached), from);
    assert_int_equal(stage_backend_kv_reserve(be, slot, S + gc->n_steps - 1), 0);
    assert_int_equal(stage_backend_embed(be, hidden, gc->prompt + from, S - from), 0);
    struct forward_item item = {.slot = slot, .pos = from, .n_tokens = S - from};
    for (int step = 0; step < gc->n_steps; ++step) {
        if (step) {
            int32_t token = gc->generated[step - 1];
            assert_int_equal(stage_backend_embed(be, hidden, &token, 1), 0);
            item = (struct forward_item){.slot = slot, .pos = S + step - 1, .n_tokens = 1};
        }
        if (stage_backend_forward(be, hidden, &item, 1))
            fail_msg("%s step %d: %s", gc->name, step, strata_last_error());
        assert_int_equal(stage_backend_logits(be, logits + (size_t)step * V,
                                              hidden + (size_t)(item.n_tokens - 1) * H, 1),
                         0);
    }
    stage_backend_kv_register(be, slot, keys, n_keys);
    stage_backend_kv_release(be, slot);
    free(hidden);
    return logits;
}

/* The next turn of a chat through `be`: the prompt and its answer, the first `blocks` blocks
 * (kept by a keyed run under keys) attached and the rest prefilled in one chunk; each row's
 * logits must be the cold run's [n_steps, V] at its step. Returns the rows compared. */
static int next_turn(struct stage_backend *be, const struct golden_case *gc, const uint64_t *keys,
                     int blocks, const float *cold) {
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    const int written = S + gc->n_steps - 1, pos0 = blocks * KV_BLOCK, T = written - pos0;
    int32_t ids[128];
    float *hidden = calloc((size_t)T * H, sizeof(float));
    float *logits = calloc((size_t)V, sizeof(float));
    int slot;
    assert_true(hidden && logits && written <= 128 && T >= 1 && pos0 > S);
    memcpy(ids, gc->prompt, sizeof(int32_t) * (size_t)S);
    memcpy(ids + S, gc->generated, sizeof(int32_t) * (size_t)(gc->n_steps - 1));
    assert_int_equal(stage_backend_kv_acquire(be, &slot), 0);
    assert_int_equal(stage_backend_kv_attach(be, slot, keys, blocks), pos0);
    assert_int_equal(stage_backend_kv_reserve(be, slot, written), 0);
    assert_int_equal(stage_backend_embed(be, hidden, ids + pos0, T), 0);
    struct forward_item item = {.slot = slot, .pos = pos0, .n_tokens = T};
    if (stage_backend_forward(be, hidden, &item, 1))
        fail_msg("%s next turn: %s", gc->name, strata_last_error());
    for (int i = 0; i < T; ++i) {
        const int step = pos0 + i - S + 1;
        assert_int_equal(stage_backend_logits(be, logits, hidden + (size_t)i * H, 1), 0);
        if (memcmp(logits, cold + (size_t)step * V, sizeof(float) * (size_t)V))
            fail_msg("%s next turn: step %d differs from the cold run", gc->name, step);
    }
    stage_backend_kv_release(be, slot);
    free(hidden);
    free(logits);
    return T;
}

/* Prefix reuse under TP 2 and KVP 2: the long-prompt case run cold, then with its prompt's
 * first two blocks attached from every rank's pool (under KVP both lie in rank 0's range,
 * and rank 1 attaches none of its own), gives the same logits bit for bit; and the next turn,
 * the prompt and its answer, attaches the answer's blocks too (written by decode steps; under
 * KVP the third lies in rank 1's range) and gives the cold run's logits. */
static void test_prefix_reuse(void **state) {
    (void)state;
    char dir[] = "/tmp/stage_tp_prefix.XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct golden_case gc;
    if (golden_case_open(&gc, "qwen3_long_prompt")) fail_msg("%s", strata_last_error());
    const int n_keys = gc.n_prompt / KV_BLOCK, cached = (gc.n_prompt - 1) / KV_BLOCK;
    const int answered = (gc.n_prompt + gc.n_steps - 2) / KV_BLOCK; /* a row left to compute */
    const uint64_t keys[8] = {101, 102, 103, 104, 105, 106, 107, 108};
    const size_t n = (size_t)gc.n_steps * (size_t)gc.cfg.vocab_size;
    assert_true(cached >= 2 && n_keys <= 8 && answered > n_keys && answered <= 8);
    for (int kvp = 0; kvp < 2; ++kvp) {
        struct rank r[2];
        pthread_t th;
        memset(r, 0, sizeof r);
        for (int k = 0; k < 2; ++k) {
            r[k].gc = &gc;
            r[k].rank = k;
            r[k].kvp = kvp;
            snprintf(r[k].peers, sizeof r[k].peers, "127.0.0.1:@%s/%d.0,127.0.0.1:@%s/%d.1", dir,
                     kvp, dir, kvp);
        }
        assert_int_equal(pthread_create(&th, NULL, follower_main, &r[1]), 0);
        if (open_rank(&r[0])) fail_msg("rank 0: %s", strata_last_error());
        float *cold = decode_keyed(r[0].be, &gc, keys, n_keys, 0);
        int idle = 0;
        /* Under KVP the ranks answer together (each for its range of blocks). */
        assert_int_equal(stage_backend_kv_lookup(r[0].be, keys, cached, &idle), cached);
        float *warm = decode_keyed(r[0].be, &gc, keys, answered, cached);
        if (memcmp(cold, warm, n * sizeof(float)))
            fail_msg("%s: logits with a cached prefix differ from cold ones",
                     kvp ? "KVP 2" : "TP 2");
        assert_int_equal(stage_backend_kv_lookup(r[0].be, keys, answered, &idle), answered);
        const int rows = next_turn(r[0].be, &gc, keys, answered, cold);
        printf("%s: %d cached blocks, logits bit-identical to the cold run; the next turn on %d "
               "blocks of prompt and answer, %d rows: the cold logits\n",
               kvp ? "KVP 2" : "TP 2", cached, answered, rows);
        stage_backend_free(r[0].be);
        pthread_join(th, NULL);
        coll_close(r[0].coll);
        if (r[1].rc) fail_msg("follower: %s", r[1].error);
        free(cold);
        free(warm);
    }
    golden_case_close(&gc);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_golden_cases(void **state) {
    (void)state;
    char dir[] = "/tmp/stage_tp_test.XXXXXX";
    assert_non_null(mkdtemp(dir));
    static const char *const cases[] = {"qwen3_gqa_tied", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        struct golden_case gc;
        if (golden_case_open(&gc, cases[i])) fail_msg("%s: %s", cases[i], strata_last_error());
        const int V = gc.cfg.vocab_size;
        const size_t n = (size_t)gc.n_steps * V;
        float *tcp = run_group(&gc, 1, 0, dir, (int)i * 3);
        float *shm = run_group(&gc, 0, 0, dir, (int)i * 3 + 1);
        float *kvp = run_group(&gc, 0, 1, dir, (int)i * 3 + 2);
        float *one = run_one(&gc);
        if (memcmp(kvp, one, n * sizeof(float)) || memcmp(tcp, one, n * sizeof(float)))
            fail_msg("%s: TP 2 (%s) or KVP 2 (%s) logits differ from one rank's", cases[i],
                     memcmp(tcp, one, n * sizeof(float)) ? "differs" : "equal",
                     memcmp(kvp, one, n * sizeof(float)) ? "differs" : "equal");
        printf("%-16s TP 2 and KVP 2 bit-identical to one rank\n", cases[i]);
        free(one);
        double dkvp = 0.0;
        for (size_t k = 0; k < n; ++k)
            dkvp = fmax(dkvp, fabs((double)kvp[k] - (double)gc.logits[k]));
        for (int s = 0; s < gc.n_steps; ++s)
            if (argmax(kvp + (size_t)s * V, V) != gc.generated[s])
                fail_msg("%s KVP 2 step %d: id %d, golden %d", cases[i], s,
                         argmax(kvp + (size_t)s * V, V), gc.generated[s]);
        printf("%-16s KVP 2 leader/follower: ids equal, max |dlogit| %.3g\n", cases[i], dkvp);
        assert_true(dkvp <= 1e-3);
        free(kvp);
        double dmax = 0.0;
        for (size_t k = 0; k < n; ++k)
            dmax = fmax(dmax, fabs((double)tcp[k] - (double)gc.logits[k]));
        for (int s = 0; s < gc.n_steps; ++s)
            if (argmax(tcp + (size_t)s * V, V) != gc.generated[s])
                fail_msg("%s step %d: id %d, golden %d", cases[i], s,
                         argmax(tcp + (size_t)s * V, V), gc.generated[s]);
        printf("%-16s TP 2 leader/follower: ids equal, max |dlogit| %.3g, tcp == shm: %s\n",
               cases[i], dmax, memcmp(tcp, shm, n * sizeof(float)) ? "NO" : "yes");
        assert_true(dmax <= 1e-3);
        assert_memory_equal(tcp, shm, n * sizeof(float));
        free(tcp);
        free(shm);
        golden_case_close(&gc);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_refusals(void **state) {
    (void)state;
    struct coll *c = NULL;
    struct stage_tp_net net = {.peers = "127.0.0.1:1", .size = 2, .rank = 0, .group = "x"};
    assert_int_equal(stage_tp_connect(&c, &net), STRATA_EINVAL); /* one peer for TP 2 */
    net.peers = "127.0.0.1,127.0.0.1:2";
    assert_int_equal(stage_tp_connect(&c, &net), STRATA_EINVAL); /* no port */
    net.rank = 2;
    assert_int_equal(stage_tp_connect(&c, &net), STRATA_EINVAL);
    assert_null(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_cases),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_prefix_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
