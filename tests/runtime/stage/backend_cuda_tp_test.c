/* runtime/stage/backend_cuda_tp.c's vocab-parallel greedy argmax (backend_cuda_tp_argmax)
 * against reference/sampler.h's argmax of the whole row, with the kernels' own source run on
 * the host (kernels/cuda_cpu) and NCCL emulated by threads (nccl_emulated.c): T = 2 and 4
 * ranks as threads, each holding its vocabulary shard of the same rows, each asked for the
 * ids. The rows are adversarial at the shards' boundaries: ties across a boundary (the lower
 * id wins), ties where a later shard's maximum comes first in its own shard, NaN at id 0
 * (the answer is 0, whatever follows), NaN at a later shard's first id, whole shards of NaN
 * (a shard with no candidate must not win with its placeholder), -0 before +0, infinities,
 * all -inf, and rows of few distinct values with NaN sprinkled in. Every rank must return
 * argmax() of the whole row. The device kernel's own contract (cuda_argmax_part_rows ==
 * argmax_part) is tests/kernels:argmax_test's, on a GPU. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/cuda_device.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend_cuda_internal.h"
#include "wire/collective.h"

enum { V = 32, FIXED_ROWS = 16, RANDOM_ROWS = 240, ROWS = FIXED_ROWS + RANDOM_ROWS };

static float rows[ROWS][V];

static unsigned next(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Row r's adversarial pattern for shards of w ids (the boundaries at multiples of w). */
static void fill_fixed(float *x, int r, int w) {
    for (int i = 0; i < V; ++i)
        x[i] = -1.0f - (float)(i % 5);
    switch (r) {
    case 0: x[w - 1] = x[w] = 3.0f; break;       /* a tie across a boundary */
    case 1: x[w + 1] = 3.0f, x[2] = 3.0f; break; /* the earlier shard's copy wins */
    case 2: x[0] = NAN, x[V - 1] = 9.0f; break;  /* NaN at id 0: the answer is 0 */
    case 3: x[w] = NAN, x[w + 1] = 4.0f; break;  /* NaN at a shard's first id */
    case 4:                                      /* a later shard all NaN ... */
        for (int i = w; i < 2 * w; ++i)          /* ... must not win with (0, -1) */
            x[i] = NAN;
        break;
    case 5:
        for (int i = 1; i < V; ++i) /* all NaN but id 0 */
            x[i] = NAN;
        break;
    case 6:
        for (int i = 0; i < V; ++i)
            x[i] = NAN;
        break;
    case 7: x[w - 1] = -0.0f, x[w] = 0.0f; break; /* -0 == +0: the first */
    case 8:
        for (int i = 0; i < V; ++i)
            x[i] = -INFINITY;
        break;
    case 9: x[V - 1] = INFINITY, x[w] = INFINITY; break;
    case 10: /* shard 0 NaN but id 0, the maximum later */
        for (int i = 1; i < w; ++i)
            x[i] = NAN;
        x[0] = -50.0f, x[V - 2] = 2.0f;
        break;
    case 11: x[0] = 1.0f, x[1] = NAN, x[w] = 1.0f; break;
    case 12: /* every shard's first id ties */
        for (int i = 0; i < V; i += w)
            x[i] = 7.0f;
        break;
    case 13: /* every shard's last id ties, the first shard's last wins */
        for (int i = w - 1; i < V; i += w)
            x[i] = 7.0f;
        break;
    case 14: /* all zero of mixed sign */
        for (int i = 0; i < V; ++i)
            x[i] = i % 3 ? 0.0f : -0.0f;
        break;
    default: x[V - 1] = -INFINITY, x[V - 2] = 100.0f; break;
    }
}

static void fill_rows(int w, unsigned seed) {
    for (int r = 0; r < FIXED_ROWS; ++r)
        fill_fixed(rows[r], r, w);
    for (int r = FIXED_ROWS; r < ROWS; ++r) /* few distinct values: ties everywhere; NaN */
        for (int i = 0; i < V; ++i) {
            unsigned k = next(&seed) % 8u;
            rows[r][i] = k == 7 ? NAN : k == 6 ? -0.0f : (float)(k % 3);
        }
}

struct rank {
    int tp, rank;
    const char *shm;
    struct model_config *cfg;
    int32_t ids[ROWS];
    int rc;
    char error[512];
};

static void *rank_main(void *arg) {
    struct rank *a = arg;
    struct coll *coll = NULL;
    struct coll_options o = {.rank = a->rank,
                             .size = a->tp,
                             .group = "tp.argmax",
                             .timeout_ms = 20000,
                             .shm_name = a->shm};
    struct stage_tp_config tp = {.tp = a->tp, .tp_rank = a->rank, .kvp = 1};
    struct cuda_context c;
    float *local = NULL, *host = NULL;
    memset(&c, 0, sizeof c);
    c.cfg = a->cfg;
    c.role = (struct stage_role){.layer_start = 0, .layer_end = 1, .with_head = 1};
    int rc = coll_open_shm(&coll, &o);
    tp.coll = coll;
    struct stage_backend_options opt = {.cfg = a->cfg, .max_seq = 16, .num_slots = 1, .tp = &tp};
    if (!rc) rc = cuda_stream_create(&c.stream);
    if (!rc) rc = backend_cuda_grid_open(&c, &opt);
    if (!rc) rc = backend_cuda_grid_logit_scratch(&c, ROWS);
    const size_t w = (size_t)c.vocab_n;
    if (!rc && !(host = malloc(sizeof(float) * ROWS * w))) rc = STRATA_ENOMEM;
    if (!rc) rc = cuda_malloc((void **)&local, sizeof(float) * ROWS * w);
    for (int r = 0; !rc && r < ROWS; ++r) /* this rank's columns [vocab_start, + w) */
        memcpy(host + (size_t)r * w, rows[r] + c.vocab_start, sizeof(float) * w);
    if (!rc) rc = cuda_memcpy_to_device(local, host, sizeof(float) * ROWS * w);
    if (!rc) rc = backend_cuda_tp_argmax(&c, a->ids, local, ROWS);
    if (rc) snprintf(a->error, sizeof a->error, "%s", strata_last_error());
    a->rc = rc;
    cuda_free(local);
    free(host);
    backend_cuda_grid_close(&c);
    cuda_stream_destroy(c.stream);
    coll_close(coll);
    return NULL;
}

static void run_tp(int T) {
    static int counter;
    struct model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = V;
    cfg.hidden_size = 8;
    cfg.intermediate_size = 8;
    cfg.num_layers = 1;
    cfg.num_heads = 4;
    cfg.num_kv_heads = 4;
    cfg.head_dim = 2;
    char shm[64];
    snprintf(shm, sizeof shm, "/strata-cuda-tp-argmax-%d-%d", (int)getpid(), counter++);
    fill_rows(V / T, 99u + (unsigned)T);
    struct rank a[4];
    pthread_t th[4];
    for (int r = 0; r < T; ++r) {
        a[r] = (struct rank){.tp = T, .rank = r, .shm = shm, .cfg = &cfg};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < T; ++r)
        pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < T; ++r) {
        if (a[r].rc) print_error("TP %d rank %d: %s\n", T, r, a[r].error);
        assert_int_equal(a[r].rc, 0);
        for (int i = 0; i < ROWS; ++i)
            if (a[r].ids[i] != argmax(rows[i], V)) {
                print_error("TP %d rank %d row %d: id %d, argmax %d\n", T, r, i, (int)a[r].ids[i],
                            argmax(rows[i], V));
                bad++;
            }
    }
    assert_int_equal(bad, 0);
}

static void test_tp2(void **state) {
    (void)state;
    run_tp(2);
}

static void test_tp4(void **state) {
    (void)state;
    run_tp(4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2),
        cmocka_unit_test(test_tp4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
