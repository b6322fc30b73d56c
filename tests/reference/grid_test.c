/* Tensor and KV parallelism in the reference decoder: every golden case at every
 * TP degree its shapes allow (2 and 4; both MoE modes), at KVP 2 and 4, and TP 2 x KVP 2,
 * each rank a thread loading only its slice (TP) or holding only its token range of the KV
 * cache (KVP), the ranks joined by in-process collectives with the same rank-order sum as
 * wire/collective.h (one group per TP group and one per KVP group). Checks, per case and
 * grid:
 *   - the logits bit-identical to one rank's (memcmp): the row-parallel sums and attention
 *     are fixed trees whose subtrees are the ranks' parts (reference/ops.h), so TP and KVP
 *     change no bit;
 *   - greedy ids equal transformers' and max |Δlogit| vs the golden <= 1e-3 (printed);
 *   - every rank's logits bit-identical (the all-gathered head), two runs bit-identical, and
 *     a two-stage pipeline split at every layer bit-identical to one stage at the same TP.
 * Each rank loads fewer weight bytes than the whole model (its slice, never the whole).
 * A 1,800-token context over 4 KVP ranks of 512 positions (and TP 2 x KVP 4) gives one
 * rank's logits bit for bit.
 * Text cases only: the VL cases' text stacks take the same path (their vision inputs travel
 * with the forward items, which TP does not touch). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "runtime/base/status.h"
#include "runtime/model/tp_shard.h"
#include "tests/reference/golden_case.h"
#include "tests/reference/test_group.h"

#define LOGIT_TOLERANCE 1e-3
#define MAX_TP 4
#define MAX_RANKS 8

struct job {
    const struct golden_case *gc;
    const int *bounds;
    int n_stages, tp, rank, kvp, kvp_rank, kvp_tokens, max_seq;
    enum tp_moe_mode moe;
    struct test_rank coll, kvp_coll;
    int kv_positions; /* the KV cache's positions per slot on this rank */
    float *logits;    /* [n_steps, V] out */
    size_t weight_bytes;
    char error[256];
};

static int run_steps(struct job *j, struct reference_model **stage, struct kv_cache *kv) {
    const struct golden_case *gc = j->gc;
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    float *hidden = calloc((size_t)S * (size_t)H, sizeof(float));
    int rc = hidden ? 0 : STRATA_ENOMEM;
    struct forward_item item = {.slot = 0, .pos = 0, .n_tokens = S};
    if (!rc) rc = reference_embed(stage[0], hidden, gc->prompt, S);
    for (int step = 0; step < gc->n_steps && !rc; ++step) {
        if (step) {
            int32_t token = gc->generated[step - 1];
            rc = reference_embed(stage[0], hidden, &token, 1);
            item = (struct forward_item){.slot = 0, .pos = S + step - 1, .n_tokens = 1};
        }
        for (int s = 0; s < j->n_stages && !rc; ++s)
            rc = reference_forward(stage[s], &kv[s], hidden, &item, 1);
        if (!rc)
            rc = reference_logits(stage[j->n_stages - 1], j->logits + (size_t)step * V,
                                  hidden + (size_t)(item.n_tokens - 1) * H, 1);
    }
    free(hidden);
    return rc;
}

static void *rank_main(void *arg) {
    struct job *j = arg;
    const struct golden_case *gc = j->gc;
    const struct model_config *c = &gc->cfg;
    struct reference_model *stage[8] = {0};
    struct kv_cache kv[8];
    struct tp_shard shard;
    const int max_seq = j->max_seq;
    int rc = tp_shard_init(&shard, c, j->tp, j->rank, j->moe);
    memset(kv, 0, sizeof kv);
    j->logits = calloc((size_t)gc->n_steps * (size_t)c->vocab_size, sizeof(float));
    for (int s = 0; s < j->n_stages && !rc; ++s) {
        struct reference_load_options o = {
            .layer_start = j->bounds[s],
            .layer_end = j->bounds[s + 1],
            .with_embed = s == 0,
            .with_head = s == j->n_stages - 1,
            .num_threads = 1,
            .tp = &shard,
            .coll = {.ctx = &j->coll,
                     .allreduce_sum = test_group_sum,
                     .allgather = test_group_gather},
            .kvp = {.kvp = j->kvp,
                    .rank = j->kvp_rank,
                    .tokens = j->kvp_tokens,
                    .max_seq = max_seq,
                    .coll = {.ctx = &j->kvp_coll, .allgather = test_group_gather}}};
        int slot;
        rc = reference_model_load(&stage[s], c, gc->st, &o);
        if (!rc) {
            j->weight_bytes += reference_model_weight_bytes(stage[s]);
            j->kv_positions = reference_model_kv_positions(stage[s], max_seq);
            rc = kv_cache_init(&kv[s], o.layer_start, o.layer_end,
                               reference_model_kv_heads(stage[s]), c->head_dim, j->kv_positions, 1,
                               0, OPS_F32);
        }
        if (!rc) rc = kv_cache_acquire(&kv[s], &slot);
    }
    if (!rc) rc = run_steps(j, stage, kv);
    if (rc) snprintf(j->error, sizeof j->error, "rank %d: %s", j->rank, strata_last_error());
    for (int s = 0; s < j->n_stages; ++s) {
        reference_model_free(stage[s]);
        kv_cache_free(&kv[s]);
    }
    free(j->coll.tmp);
    free(j->kvp_coll.tmp);
    return NULL;
}

/* The grid of one run: TP degree, KVP degree and tokens per KVP rank (0 = the smallest
 * 16 x 2^p whose K groups hold the sequence; the cache then holds K x that many positions). */
struct grid {
    int tp, kvp, kvp_tokens;
    enum tp_moe_mode moe;
};

/* Runs the case on tp x kvp rank threads over stages `bounds`; returns rank 0's logits after
 * checking every rank's are identical. *bytes = rank 0's weight bytes, *positions its KV
 * positions per slot. */
static float *run_grid(const struct golden_case *gc, const struct grid *gr, const int *bounds,
                       int n_stages, size_t *bytes, int *positions) {
    const int T = gr->tp, K = gr->kvp, W = T * K, total = gc->n_prompt + gc->n_steps;
    int tokens = gr->kvp_tokens, max_seq = total;
    if (K > 1 && !tokens)
        for (tokens = GRID_KV_BLOCK; tokens * K < total; tokens *= 2) {
        }
    if (K > 1) max_seq = tokens * K;
    struct test_group tp_groups[MAX_RANKS], kvp_groups[MAX_RANKS];
    struct job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    const size_t n = (size_t)gc->n_steps * (size_t)gc->cfg.vocab_size;
    assert_true(W <= MAX_RANKS);
    for (int k = 0; k < K; ++k) {
        tp_groups[k] = (struct test_group){.size = T};
        pthread_barrier_init(&tp_groups[k].barrier, NULL, (unsigned)T);
    }
    for (int t = 0; t < T; ++t) {
        kvp_groups[t] = (struct test_group){.size = K};
        pthread_barrier_init(&kvp_groups[t].barrier, NULL, (unsigned)K);
    }
    for (int r = 0; r < W; ++r) {
        const int t = r % T, k = r / T; /* grid order: TP fastest */
        jobs[r] = (struct job){.gc = gc,
                               .bounds = bounds,
                               .n_stages = n_stages,
                               .tp = T,
                               .rank = t,
                               .kvp = K,
                               .kvp_rank = k,
                               .kvp_tokens = tokens,
                               .max_seq = max_seq,
                               .moe = gr->moe,
                               .coll = {.g = &tp_groups[k], .rank = t},
                               .kvp_coll = {.g = &kvp_groups[t], .rank = k}};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < W; ++r)
        pthread_join(th[r], NULL);
    for (int k = 0; k < K; ++k)
        pthread_barrier_destroy(&tp_groups[k].barrier);
    for (int t = 0; t < T; ++t)
        pthread_barrier_destroy(&kvp_groups[t].barrier);
    for (int r = 0; r < W; ++r)
        if (jobs[r].error[0]) fail_msg("%s TP %d KVP %d: %s", gc->name, T, K, jobs[r].error);
    for (int r = 1; r < W; ++r) {
        if (memcmp(jobs[r].logits, jobs[0].logits, n * sizeof(float)))
            fail_msg("%s TP %d KVP %d: rank %d's logits differ from rank 0's", gc->name, T, K, r);
        free(jobs[r].logits);
    }
    if (bytes) *bytes = jobs[0].weight_bytes;
    if (positions) *positions = jobs[0].kv_positions;
    return jobs[0].logits;
}

static double max_delta(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m) m = d;
    }
    return m;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

static void check_case(const char *name, int tp, enum tp_moe_mode moe, int *ran) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
    const int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, whole[2] = {0, L};
    const size_t n = (size_t)gc.n_steps * (size_t)V;
    if (tp_check(&gc.cfg, tp, moe)) {
        printf("%-18s TP %d %s: not allowed by the shapes (%s)\n", name, tp,
               moe == TP_MOE_SPLIT ? "split" : "expert", strata_last_error());
        golden_case_close(&gc);
        return;
    }
    size_t bytes1 = 0, bytes = 0;
    float *one = run_grid(&gc, &(struct grid){1, 1, 0, moe}, whole, 1, &bytes1, NULL);
    float *got = run_grid(&gc, &(struct grid){tp, 1, 0, moe}, whole, 1, &bytes, NULL);
    float *again = run_grid(&gc, &(struct grid){tp, 1, 0, moe}, whole, 1, NULL, NULL);
    int mismatches = 0;
    for (int s = 0; s < gc.n_steps; ++s)
        if (argmax(got + (size_t)s * V, V) != gc.generated[s]) mismatches++;
    const double dg = max_delta(got, gc.logits, n), d1 = max_delta(got, one, n);
    printf("%-18s TP %d%s: ids %s, max |dlogit| vs golden %.3g, vs TP 1 %.3g (%s); weights "
           "%zu of %zu bytes per rank\n",
           name, tp,
           gc.cfg.num_experts > 0 ? (moe == TP_MOE_SPLIT ? " (moe split)" : " (moe expert)") : "",
           mismatches ? "DIFFER" : "equal", dg, d1,
           memcmp(got, one, n * sizeof(float)) ? "NOT bit-identical" : "bit-identical", bytes,
           bytes1);
    if (memcmp(got, one, n * sizeof(float)))
        fail_msg("%s TP %d: logits differ from TP 1's (max |dlogit| %.3g)", name, tp, d1);
    assert_int_equal(mismatches, 0);
    assert_true(dg <= LOGIT_TOLERANCE);
    assert_true(bytes < bytes1);
    if (memcmp(got, again, n * sizeof(float))) fail_msg("%s TP %d: two runs differ", name, tp);
    if (!gc.has_vision)
        for (int k = 1; k < L; ++k) {
            int split[3] = {0, k, L};
            float *parts = run_grid(&gc, &(struct grid){tp, 1, 0, moe}, split, 2, NULL, NULL);
            if (memcmp(parts, got, n * sizeof(float)))
                fail_msg("%s TP %d: split at %d differs from one stage", name, tp, k);
            free(parts);
        }
    free(one);
    free(got);
    free(again);
    golden_case_close(&gc);
    (*ran)++;
}

static void test_text_cases(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; golden_case_names[i]; ++i) {
        if (strstr(golden_case_names[i], "_vl")) continue;
        for (int tp = 2; tp <= MAX_TP; tp *= 2) {
            check_case(golden_case_names[i], tp, TP_MOE_EXPERT_PARALLEL, &ran);
            if (strstr(golden_case_names[i], "moe"))
                check_case(golden_case_names[i], tp, TP_MOE_SPLIT, &ran);
        }
    }
    assert_true(ran >= 8);
}

/* KVP (optionally x TP): golden ids, max |dlogit| <= 1e-3, every rank equal, two runs and
 * every two-stage split bit-identical; each rank's cache holds fewer positions than the
 * sequence (the context would not fit one rank of that size). */
static void check_kvp(const char *name, const struct grid *gr, int *ran) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
    const int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, whole[2] = {0, L};
    const int total = gc.n_prompt + gc.n_steps;
    const size_t n = (size_t)gc.n_steps * (size_t)V;
    if (tp_check(&gc.cfg, gr->tp, gr->moe)) {
        golden_case_close(&gc);
        return;
    }
    int held = 0, mismatches = 0;
    float *one = run_grid(&gc, &(struct grid){1, 1, 0, gr->moe}, whole, 1, NULL, NULL);
    float *got = run_grid(&gc, gr, whole, 1, NULL, &held);
    float *again = run_grid(&gc, gr, whole, 1, NULL, NULL);
    for (int s = 0; s < gc.n_steps; ++s)
        if (argmax(got + (size_t)s * V, V) != gc.generated[s]) mismatches++;
    const double dg = max_delta(got, gc.logits, n), d1 = max_delta(got, one, n);
    printf("%-18s TP %d x KVP %d: %d-token sequence, %d positions per rank; ids %s, max |dlogit| "
           "vs golden %.3g, vs one rank %.3g (%s)\n",
           name, gr->tp, gr->kvp, total, held, mismatches ? "DIFFER" : "equal", dg, d1,
           memcmp(got, one, n * sizeof(float)) ? "NOT bit-identical" : "bit-identical");
    if (memcmp(got, one, n * sizeof(float)))
        fail_msg("%s TP %d x KVP %d: logits differ from one rank's (max |dlogit| %.3g)", name,
                 gr->tp, gr->kvp, d1);
    assert_int_equal(mismatches, 0);
    assert_true(dg <= LOGIT_TOLERANCE);
    assert_true(held < total);
    if (memcmp(got, again, n * sizeof(float)))
        fail_msg("%s KVP %d: two runs differ", name, gr->kvp);
    for (int k = 1; k < L; ++k) {
        int split[3] = {0, k, L};
        float *parts = run_grid(&gc, gr, split, 2, NULL, NULL);
        if (memcmp(parts, got, n * sizeof(float)))
            fail_msg("%s KVP %d: split at %d differs from one stage", name, gr->kvp, k);
        free(parts);
    }
    free(one);
    free(got);
    free(again);
    golden_case_close(&gc);
    (*ran)++;
}

static void test_kvp_cases(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; golden_case_names[i]; ++i) {
        if (strstr(golden_case_names[i], "_vl")) continue;
        check_kvp(golden_case_names[i], &(struct grid){1, 2, 0, TP_MOE_EXPERT_PARALLEL}, &ran);
        check_kvp(golden_case_names[i], &(struct grid){1, 4, 0, TP_MOE_EXPERT_PARALLEL}, &ran);
        check_kvp(golden_case_names[i], &(struct grid){2, 2, 0, TP_MOE_EXPERT_PARALLEL}, &ran);
    }
    assert_true(ran >= 15);
}

/* Medha's goal at the model level: a 1,800-token prompt (prefilled in one call, which KVP
 * attends in tiles of 512 rows to bound the kept scores) and 8 decode steps on a tiny model,
 * one rank with a 1,808-position cache vs 4 KVP ranks of 512 positions each (none holds the
 * context) and TP 2 x KVP 4 (tiles of 1,024 rows): the logits are bit-identical. */
static void test_long_context(void **state) {
    (void)state;
    struct golden_case gc;
    if (golden_case_open(&gc, "qwen3_gqa_tied")) fail_msg("%s", strata_last_error());
    enum { PROMPT = 1800, STEPS = 8 };
    struct golden_case lc = gc;
    int32_t *ids = malloc((PROMPT + STEPS) * sizeof(int32_t));
    assert_non_null(ids);
    for (int i = 0; i < PROMPT + STEPS; ++i)
        ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)gc.cfg.vocab_size);
    lc.prompt = ids;
    lc.n_prompt = PROMPT;
    lc.generated = ids + PROMPT; /* teacher-forced decode ids */
    lc.n_steps = STEPS;
    const int L = gc.cfg.num_layers, whole[2] = {0, L};
    const size_t n = (size_t)STEPS * (size_t)gc.cfg.vocab_size;
    int held = 0;
    float *one =
        run_grid(&lc, &(struct grid){1, 1, 0, TP_MOE_EXPERT_PARALLEL}, whole, 1, NULL, NULL);
    float *kvp4 =
        run_grid(&lc, &(struct grid){1, 4, 512, TP_MOE_EXPERT_PARALLEL}, whole, 1, NULL, &held);
    float *grid8 =
        run_grid(&lc, &(struct grid){2, 4, 512, TP_MOE_EXPERT_PARALLEL}, whole, 1, NULL, NULL);
    printf("qwen3_gqa_tied 1,800-token prompt + %d steps: KVP 4 x %d positions and TP 2 x KVP 4 "
           "%s one rank's logits\n",
           STEPS, held,
           memcmp(kvp4, one, n * sizeof(float)) || memcmp(grid8, one, n * sizeof(float))
               ? "DIFFER from"
               : "bit-identical to");
    assert_int_equal(held, 512);
    assert_memory_equal(kvp4, one, n * sizeof(float));
    assert_memory_equal(grid8, one, n * sizeof(float));
    free(one);
    free(kvp4);
    free(grid8);
    free(ids);
    golden_case_close(&gc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_cases),
        cmocka_unit_test(test_kvp_cases),
        cmocka_unit_test(test_long_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
