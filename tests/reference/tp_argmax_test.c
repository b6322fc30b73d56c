/* The vocab-parallel greedy shortcut (reference_logits_argmax): on every text golden
 * at TP 1, 2 and 4 (where the shapes allow), each rank a thread holding its slice, a greedy
 * decode that feeds back the shortcut's own ids gives at every step, on every rank, exactly
 * argmax() of the all-gathered logits (reference_logits) of the same rows, and the golden's
 * ids; the prompt's rows (many rows in one call) agree too. The tie rule itself is
 * tests/reference/sampler_test's test_split_argmax_ties. */
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
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/model/tp_shard.h"
#include "tests/reference/golden_case.h"
#include "tests/reference/test_group.h"

#define MAX_TP 4

struct job {
    const struct golden_case *gc;
    int tp, rank;
    struct test_rank coll;
    int32_t *ids; /* [n_steps] the shortcut's ids, fed back */
    int mismatch; /* steps or prompt rows where the shortcut and the full argmax differ */
    char error[256];
};

/* Both heads over rows [n, H]: the shortcut's ids into `ids`, mismatches counted. */
static int both_heads(struct job *j, struct reference_model *m, float *logits, int32_t *ids,
                      const float *rows, int n) {
    const int V = j->gc->cfg.vocab_size;
    int rc = reference_logits(m, logits, rows, n);
    if (!rc) rc = reference_logits_argmax(m, ids, rows, n);
    for (int i = 0; i < n && !rc; ++i)
        if (ids[i] != argmax(logits + (size_t)i * V, V)) j->mismatch++;
    return rc;
}

static int decode(struct job *j, struct reference_model *m, struct kv_cache *kv) {
    const struct golden_case *gc = j->gc;
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    float *hidden = calloc((size_t)S * (size_t)H, sizeof(float));
    float *logits = calloc((size_t)S * (size_t)V, sizeof(float));
    int32_t *row_ids = calloc((size_t)S, sizeof(int32_t));
    int rc = hidden && logits && row_ids ? 0 : STRATA_ENOMEM;
    struct forward_item item = {.slot = 0, .pos = 0, .n_tokens = S};
    if (!rc) rc = reference_embed(m, hidden, gc->prompt, S);
    if (!rc) rc = reference_forward(m, kv, hidden, &item, 1);
    if (!rc) rc = both_heads(j, m, logits, row_ids, hidden, S); /* every prompt row */
    if (!rc) j->ids[0] = row_ids[S - 1];
    for (int step = 1; step < gc->n_steps && !rc; ++step) {
        item = (struct forward_item){.slot = 0, .pos = S + step - 1, .n_tokens = 1};
        if (!(rc = reference_embed(m, hidden, &j->ids[step - 1], 1)) &&
            !(rc = reference_forward(m, kv, hidden, &item, 1)))
            rc = both_heads(j, m, logits, &j->ids[step], hidden, 1);
    }
    free(hidden);
    free(logits);
    free(row_ids);
    return rc;
}

static void *rank_main(void *arg) {
    struct job *j = arg;
    const struct golden_case *gc = j->gc;
    struct reference_model *m = NULL;
    struct kv_cache kv;
    struct tp_shard shard;
    int slot, rc = tp_shard_init(&shard, &gc->cfg, j->tp, j->rank, TP_MOE_EXPERT_PARALLEL);
    memset(&kv, 0, sizeof kv);
    struct reference_load_options o = {
        .layer_start = 0,
        .layer_end = gc->cfg.num_layers,
        .with_embed = 1,
        .with_head = 1,
        .num_threads = 1,
        .tp = j->tp > 1 ? &shard : NULL,
        .coll = {.ctx = &j->coll, .allreduce_sum = test_group_sum, .allgather = test_group_gather}};
    if (!rc) rc = reference_model_load(&m, &gc->cfg, gc->st, &o);
    if (!rc)
        rc = kv_cache_init(&kv, 0, gc->cfg.num_layers, reference_model_kv_heads(m),
                           gc->cfg.head_dim, gc->n_prompt + gc->n_steps, 1, 0, OPS_F32);
    if (!rc) rc = kv_cache_acquire(&kv, &slot);
    if (!rc) rc = decode(j, m, &kv);
    if (rc) snprintf(j->error, sizeof j->error, "rank %d: %s", j->rank, strata_last_error());
    reference_model_free(m);
    kv_cache_free(&kv);
    free(j->coll.tmp);
    return NULL;
}

static void check_case(const char *name, int tp, int *ran) {
    struct golden_case gc;
    if (golden_case_open(&gc, name)) fail_msg("%s: %s", name, strata_last_error());
    if (tp > 1 && tp_check(&gc.cfg, tp, TP_MOE_EXPERT_PARALLEL)) {
        printf("%-18s TP %d: not allowed by the shapes (%s)\n", name, tp, strata_last_error());
        golden_case_close(&gc);
        return;
    }
    struct test_group g = {.size = tp};
    struct job jobs[MAX_TP];
    pthread_t th[MAX_TP];
    pthread_barrier_init(&g.barrier, NULL, (unsigned)tp);
    for (int r = 0; r < tp; ++r) {
        jobs[r] = (struct job){.gc = &gc, .tp = tp, .rank = r, .coll = {.g = &g, .rank = r}};
        jobs[r].ids = calloc((size_t)gc.n_steps, sizeof(int32_t));
        assert_non_null(jobs[r].ids);
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < tp; ++r)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.barrier);
    int golden_diff = 0;
    for (int s = 0; s < gc.n_steps; ++s)
        golden_diff += jobs[0].ids[s] != gc.generated[s];
    printf("%-18s TP %d: %d steps + %d prompt rows, shortcut vs full argmax: %s; ids vs golden: "
           "%s\n",
           name, tp, gc.n_steps, gc.n_prompt, jobs[0].mismatch ? "DIFFER" : "identical",
           golden_diff ? "DIFFER" : "equal");
    for (int r = 0; r < tp; ++r) {
        if (jobs[r].error[0]) fail_msg("%s TP %d: %s", name, tp, jobs[r].error);
        assert_int_equal(jobs[r].mismatch, 0);
        assert_memory_equal(jobs[r].ids, jobs[0].ids, (size_t)gc.n_steps * sizeof(int32_t));
    }
    assert_int_equal(golden_diff, 0);
    for (int r = 0; r < tp; ++r)
        free(jobs[r].ids);
    golden_case_close(&gc);
    (*ran)++;
}

static void test_text_cases(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; golden_case_names[i]; ++i) {
        if (strstr(golden_case_names[i], "_vl")) continue;
        for (int tp = 1; tp <= MAX_TP; tp *= 2)
            check_case(golden_case_names[i], tp, &ran);
    }
    assert_true(ran >= 12);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_text_cases)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
