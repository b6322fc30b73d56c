/* runtime/stage/nccl_group.c: NCCL sub-groups of a stage's group set up through
 * wire/collective, with the CPU backend's reduction order. Built twice: against the host
 * emulation of kernels/nccl.h (tests/backend_ops/nccl_emulated.c: the group logic on any
 * machine) and, as nccl_group_cuda_test, against NCCL on GPUs (one device per rank; prints
 * "skipped: ..." with the reason where there are too few).
 *
 * Checked: the ids reach the right members (TP and KVP sub-groups of a TP 2 x KVP 2 grid
 * side by side), a TP 2 reduce is p0 + p1, a TP 4 / TP 8 reduce is ops_tree_sum's tree
 * bit for bit on every rank (and the inputs are such that the rank-order sum differs, so
 * the order is really tested), all-gathers are exact, a stalled rank fails its peer within
 * the timeout naming the group and rank (and later calls fail at once), an abort ends the
 * group, and a rank outside its declared sub-group is refused. Emulated build only: the
 * stream-capture rules (tests/backend_ops/emulated_capture.h) on the group's collectives, as
 * a CUDA backend's decode graph under TP / KVP captures them: queued on the captured stream
 * they are graph nodes and their results hold after the capture; a host wait inside the
 * capture, or a collective on another stream, fails and spoils it. */
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
#include "kernels/nccl.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/nccl_group.h"
#include "wire/collective.h"
#ifndef NCCL_GROUP_TEST_DEVICE
#include "tests/backend_ops/emulated_capture.h"
#endif

#define MAX_N 8
#define N_FLOATS 1000

struct grid {
    int size, tp, kvp;
    char shm_name[64];
    int stall_rank; /* opens, then never takes part (-1 none) */
    int timeout_ms;
};

struct rank_arg {
    const struct grid *g;
    int rank;
    int status;
    char error[800];
};

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Magnitudes 2^-20 .. 2^20: the sum's bits depend on the order. */
static float input(int r, size_t i) {
    uint64_t h = mix((uint64_t)r * 0x9e3779b97f4a7c15ull + i * 31);
    float mant = (float)(h & 0xffffff) / (float)0x1000000 - 0.5f;
    int e = (int)((h >> 24) % 41) - 20;
    float v = mant;
    for (; e > 0; --e)
        v *= 2.0f;
    for (; e < 0; ++e)
        v *= 0.5f;
    return v;
}

static int failed(struct rank_arg *a, const char *what) {
    snprintf(a->error, sizeof a->error, "rank %d: %s: %s", a->rank, what, strata_last_error());
    a->status = 1;
    return 1;
}

/* ---- buffers: host memory under the emulation, device memory on a GPU ---------------- */

static float *dev_from(const float *host, size_t n) {
    void *p = NULL;
#ifdef NCCL_GROUP_TEST_DEVICE
    if (cuda_malloc(&p, n * sizeof(float)) || cuda_memcpy_to_device(p, host, n * sizeof(float))) {
        cuda_free(p);
        return NULL;
    }
#else
    p = malloc(n * sizeof(float));
    if (p) memcpy(p, host, n * sizeof(float));
#endif
    return p;
}

static int dev_to(float *host, const float *dev, size_t n) {
#ifdef NCCL_GROUP_TEST_DEVICE
    return cuda_memcpy_to_host(host, dev, n * sizeof(float));
#else
    memcpy(host, dev, n * sizeof(float));
    return 0;
#endif
}

static void dev_free(float *p) {
#ifdef NCCL_GROUP_TEST_DEVICE
    cuda_free(p);
#else
    free(p);
#endif
}

/* ---- the grid's checks, per rank --------------------------------------------------------- */

/* Reduce over `sub` (whose members' group ranks are member_rank[k]) against ops_tree_sum. */
static int check_reduce(struct rank_arg *a, struct nccl_group *sub, const int *member_rank) {
    const int count = nccl_group_size(sub);
    float parts[MAX_N * N_FLOATS], want[N_FLOATS], got[N_FLOATS], ordered[N_FLOATS];
    for (int k = 0; k < count; ++k)
        for (size_t i = 0; i < N_FLOATS; ++i)
            parts[(size_t)k * N_FLOATS + i] = input(member_rank[k], i);
    ops_tree_sum(want, parts, count, N_FLOATS);
    float *data = dev_from(parts + (size_t)nccl_group_rank(sub) * N_FLOATS, N_FLOATS);
    float *scratch = dev_from(parts, (size_t)count * N_FLOATS);
    int rc = data && scratch ? nccl_group_reduce(sub, data, scratch, N_FLOATS) : -1;
    if (!rc) rc = nccl_group_wait(sub);
    if (!rc) rc = dev_to(got, data, N_FLOATS);
    dev_free(data);
    dev_free(scratch);
    if (rc) return failed(a, "reduce");
    if (memcmp(got, want, sizeof got)) {
        snprintf(a->error, sizeof a->error, "rank %d: reduce of %d differs from ops_tree_sum",
                 a->rank, count);
        return a->status = 1;
    }
    if (count > 2) { /* the inputs tell the tree from the rank-order sum */
        for (size_t i = 0; i < N_FLOATS; ++i) {
            float s = parts[i];
            for (int k = 1; k < count; ++k)
                s += parts[(size_t)k * N_FLOATS + i];
            ordered[i] = s;
        }
        if (!memcmp(ordered, want, sizeof ordered)) {
            snprintf(a->error, sizeof a->error, "rank %d: inputs do not test the order", a->rank);
            return a->status = 1;
        }
    }
    return 0;
}

static int check_gather(struct rank_arg *a, struct nccl_group *sub, const int *member_rank) {
    const int count = nccl_group_size(sub);
    if (count == 1) return 0; /* a group of one gathers in place only: nothing to check */
    float mine[N_FLOATS], got[MAX_N * N_FLOATS];
    for (size_t i = 0; i < N_FLOATS; ++i)
        mine[i] = input(a->rank, i);
    float *in = dev_from(mine, N_FLOATS), *out = dev_from(got, (size_t)count * N_FLOATS);
    int rc = in && out ? nccl_group_allgather(sub, out, in, N_FLOATS) : -1;
    if (!rc) rc = nccl_group_wait(sub);
    if (!rc) rc = dev_to(got, out, (size_t)count * N_FLOATS);
    dev_free(in);
    dev_free(out);
    if (rc) return failed(a, "allgather");
    for (int k = 0; k < count; ++k)
        for (size_t i = 0; i < N_FLOATS; ++i)
            if (memcmp(&got[(size_t)k * N_FLOATS + i], &(float){input(member_rank[k], i)}, 4)) {
                snprintf(a->error, sizeof a->error, "rank %d: gathered %d[%zu] wrong", a->rank, k,
                         i);
                return a->status = 1;
            }
    return 0;
}

static void *grid_rank(void *arg) {
    struct rank_arg *a = arg;
    const struct grid *g = a->g;
#ifdef NCCL_GROUP_TEST_DEVICE
    if (cuda_set_device(a->rank)) return failed(a, "device"), NULL;
#endif
    struct coll_options o = {.rank = a->rank,
                             .size = g->size,
                             .group = "nccl.test",
                             .timeout_ms = g->timeout_ms,
                             .shm_name = g->shm_name};
    struct coll *coll = NULL;
    if (coll_open_shm(&coll, &o)) return failed(a, "coll_open_shm"), NULL;
    const int tp_rank = a->rank % g->tp, kvp_rank = a->rank / g->tp;
    struct nccl_group *tp = NULL, *kvp = NULL;
    struct nccl_group_options to = {coll, kvp_rank * g->tp, 1, g->tp, "s0.tp", NULL, 0};
    struct nccl_group_options ko = {coll, tp_rank, g->tp, g->kvp, "s0.kvp", NULL, 0};
    int tp_members[MAX_N], kvp_members[MAX_N];
    for (int k = 0; k < g->tp; ++k)
        tp_members[k] = kvp_rank * g->tp + k;
    for (int k = 0; k < g->kvp; ++k)
        kvp_members[k] = tp_rank + k * g->tp;
    if (nccl_group_open(&tp, &to))
        failed(a, "open tp");
    else if (nccl_group_open(&kvp, &ko))
        failed(a, "open kvp");
    else if (a->rank == g->stall_rank)
        sleep((unsigned)(g->timeout_ms / 1000 + 2));
    else if (g->stall_rank >= 0) {
        /* the peer never comes: this rank's gather must fail within the timeout */
        float x[4] = {0}, y[8] = {0};
        int rc = nccl_group_allgather(tp, y, x, 4);
        if (!rc) rc = nccl_group_wait(tp);
        if (rc != STRATA_ETIMEOUT || !strstr(strata_last_error(), "rank 0 of 2") ||
            !strstr(strata_last_error(), "s0.tp"))
            failed(a, "stalled peer: want a timeout naming the group and rank");
        else if (nccl_group_wait(tp) != STRATA_ECLOSED)
            failed(a, "after the timeout: want STRATA_ECLOSED");
    } else if (!check_reduce(a, tp, tp_members) && !check_gather(a, kvp, kvp_members) &&
               !check_gather(a, tp, tp_members) && g->kvp > 1)
        check_reduce(a, kvp, kvp_members);
    nccl_group_close(tp);
    nccl_group_close(kvp);
    coll_close(coll);
    return NULL;
}

static int enough_devices(int n) {
#ifdef NCCL_GROUP_TEST_DEVICE
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason) ||
        !cuda_nccl_available(reason, sizeof reason)) {
        printf("skipped: %s\n", reason);
        return 0;
    }
    if (cuda_set_device(n - 1)) {
        printf("skipped: NCCL needs one CUDA device per rank, %d ranks: %s\n", n,
               strata_last_error());
        return 0;
    }
    cuda_set_device(0);
#else
    (void)n;
#endif
    return 1;
}

static void run_grid(int tp, int kvp, int stall_rank, int timeout_ms) {
    static int counter;
    struct grid g = {
        .size = tp * kvp, .tp = tp, .kvp = kvp, .stall_rank = stall_rank, .timeout_ms = timeout_ms};
    if (!enough_devices(g.size)) return;
    snprintf(g.shm_name, sizeof g.shm_name, "/strata-nccl-test-%d-%d", (int)getpid(), counter++);
    pthread_t th[MAX_N];
    struct rank_arg a[MAX_N];
    for (int r = 0; r < g.size; ++r) {
        a[r] = (struct rank_arg){.g = &g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, grid_rank, &a[r]), 0);
    }
    for (int r = 0; r < g.size; ++r)
        pthread_join(th[r], NULL);
    for (int r = 0; r < g.size; ++r)
        if (a[r].status) fail_msg("%s", a[r].error);
}

static void test_tp2_kvp2(void **state) {
    (void)state;
    run_grid(2, 2, -1, 20000);
}

static void test_tp4(void **state) {
    (void)state;
    run_grid(4, 1, -1, 20000);
}

static void test_tp8(void **state) {
    (void)state;
    run_grid(8, 1, -1, 20000);
}

static void test_stalled_peer_times_out(void **state) {
    (void)state;
    run_grid(2, 1, 1, 1500);
}

/* A rank that is not in the sub-group it names is refused before any communication. */
static void test_bad_options(void **state) {
    (void)state;
    struct nccl_group *g = NULL;
    assert_int_equal(nccl_group_open(&g, NULL), STRATA_EINVAL);
    assert_null(g);
    char shm[64];
    snprintf(shm, sizeof shm, "/strata-nccl-test-%d-bad", (int)getpid());
    struct coll_options o = {.rank = 0, .size = 1, .group = "nccl.bad", .shm_name = shm};
    struct coll *coll = NULL;
    assert_int_equal(coll_open_shm(&coll, &o), 0);
    struct nccl_group_options too_big = {coll, 0, 1, 2, "s0.tp", NULL, 0};
    assert_int_equal(nccl_group_open(&g, &too_big), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "do not fit a group of 1"));
    struct nccl_group_options outside = {coll, 0, 1, 1, "s0.tp", NULL, 0};
    outside.first = 1; /* members 1.., this rank is 0 */
    assert_int_equal(nccl_group_open(&g, &outside), STRATA_EINVAL);
    assert_null(g);
    struct nccl_group_options solo = {coll, 0, 1, 1, "s0.tp", NULL, 0};
    assert_int_equal(nccl_group_open(&g, &solo), 0); /* a group of one: no NCCL at all */
    assert_int_equal(nccl_group_size(g), 1);
    float x[3] = {1, 2, 3};
    assert_int_equal(nccl_group_reduce(g, x, NULL, 3), 0);
    assert_int_equal(nccl_group_allgather(g, x, x, 3), 0);
    assert_int_equal(nccl_group_wait(g), 0);
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    nccl_group_close(g);
    coll_close(coll);
}

/* The NCCL layer's own refusals and join timeout (no wire group needed). */
static void test_comm_refusals(void **state) {
    (void)state;
    char reason[256];
    if (!enough_devices(1)) return;
    assert_true(cuda_nccl_available(reason, sizeof reason));
    uint8_t id[CUDA_NCCL_ID_BYTES];
    assert_int_equal(cuda_nccl_unique_id(id), 0);
    struct cuda_nccl_comm *c = NULL;
    /* rank 0 of 2 alone: the peer never joins */
    assert_int_equal(cuda_nccl_comm_init(&c, id, 2, 0, 500, "lonely"), STRATA_ETIMEOUT);
    assert_null(c);
    assert_non_null(strstr(strata_last_error(), "rank 0 of 2"));
    assert_int_equal(cuda_nccl_unique_id(id), 0);
    assert_int_equal(cuda_nccl_comm_init(&c, id, 1, 0, 5000, "solo"), 0);
    float x[4] = {1, 2, 3, 4};
    float *d = dev_from(x, 4);
    assert_non_null(d);
    assert_int_equal(cuda_nccl_allreduce_sum2(c, d, 4, NULL), STRATA_EINVAL);
    assert_int_equal(cuda_ops_tree_sum(d, d, 3, 1, NULL), STRATA_EINVAL);
    dev_free(d);
    cuda_nccl_comm_abort(c);
}

#ifndef NCCL_GROUP_TEST_DEVICE
/* ---- stream capture (emulated): a decode graph's collectives ---------------------------- */

struct capture_arg {
    const char *shm;
    int rank, size, status;
    char error[800];
};

static int capture_fail(struct capture_arg *a, const char *what) {
    snprintf(a->error, sizeof a->error, "rank %d of %d: %s (%s)", a->rank, a->size, what,
             strata_last_error());
    return a->status = 1;
}

/* Rank `a->rank`'s side: a reduce and an all-gather captured, then a host wait and a
 * collective on the wrong stream inside captures (each on a group of its own: a failed call
 * ends its group). */
static int capture_checks(struct capture_arg *a, struct nccl_group *const g[3], void *stream,
                          void *other) {
    float parts[MAX_N * N_FLOATS], want[N_FLOATS], data[N_FLOATS], got[MAX_N * N_FLOATS];
    int nodes = -1;
    for (int k = 0; k < a->size; ++k)
        for (size_t i = 0; i < N_FLOATS; ++i)
            parts[(size_t)k * N_FLOATS + i] = input(k, i);
    ops_tree_sum(want, parts, a->size, N_FLOATS);
    memcpy(data, parts + (size_t)a->rank * N_FLOATS, sizeof data);
    if (emulated_capture_begin(stream) || nccl_group_reduce(g[0], data, got, N_FLOATS) ||
        nccl_group_allgather(g[0], got, parts + (size_t)a->rank * N_FLOATS, N_FLOATS) ||
        emulated_capture_end(stream, &nodes))
        return capture_fail(a, "a reduce and an all-gather captured");
    const int want_nodes = (a->size == 2 ? 1 : 2) + 1; /* reduce: allreduce or gather + tree */
    if (nodes != want_nodes || nccl_group_wait(g[0]) || memcmp(data, want, sizeof data) ||
        memcmp(got, parts, sizeof(float) * (size_t)a->size * N_FLOATS))
        return capture_fail(a, "captured collectives: nodes or results wrong");
    if (emulated_capture_begin(stream) || nccl_group_reduce(g[1], data, got, N_FLOATS) ||
        nccl_group_wait(g[1]) != STRATA_EDEVICE ||
        !strstr(strata_last_error(), "not permitted when stream is capturing") ||
        emulated_capture_end(stream, &nodes) != STRATA_EDEVICE)
        return capture_fail(a, "a host wait inside a capture must fail and spoil it");
    if (emulated_capture_begin(other) ||
        nccl_group_allgather(g[2], got, parts + (size_t)a->rank * N_FLOATS, N_FLOATS) !=
            STRATA_EDEVICE ||
        emulated_capture_end(other, &nodes) != STRATA_EDEVICE)
        return capture_fail(a, "a collective off the captured stream must fail and spoil it");
    return 0;
}

static void *capture_rank(void *arg) {
    struct capture_arg *a = arg;
    struct coll_options o = {.rank = a->rank,
                             .size = a->size,
                             .group = "nccl.capture",
                             .timeout_ms = 20000,
                             .shm_name = a->shm};
    struct coll *coll = NULL;
    struct nccl_group *g[3] = {NULL, NULL, NULL};
    int stream_token = 0, other_token = 0; /* two distinct "streams" */
    static const char *const labels[3] = {"c.ok", "c.wait", "c.stream"};
    if (coll_open_shm(&coll, &o)) return capture_fail(a, "coll_open_shm"), NULL;
    int rc = 0;
    for (int i = 0; i < 3 && !rc; ++i) {
        struct nccl_group_options go = {coll, 0, 1, a->size, labels[i], &stream_token, 0};
        rc = nccl_group_open(&g[i], &go);
    }
    if (rc)
        capture_fail(a, "open");
    else
        capture_checks(a, g, &stream_token, &other_token);
    emulated_capture_abort(&stream_token);
    emulated_capture_abort(&other_token);
    for (int i = 0; i < 3; ++i)
        nccl_group_close(g[i]);
    coll_close(coll);
    return NULL;
}

static void run_capture(int size) {
    static int counter;
    char shm[64];
    snprintf(shm, sizeof shm, "/strata-nccl-capture-%d-%d", (int)getpid(), counter++);
    pthread_t th[MAX_N];
    struct capture_arg a[MAX_N];
    for (int r = 0; r < size; ++r) {
        a[r] = (struct capture_arg){.shm = shm, .rank = r, .size = size};
        assert_int_equal(pthread_create(&th[r], NULL, capture_rank, &a[r]), 0);
    }
    for (int r = 0; r < size; ++r)
        pthread_join(th[r], NULL);
    for (int r = 0; r < size; ++r)
        if (a[r].status) fail_msg("%s", a[r].error);
}

static void test_capture(void **state) {
    (void)state;
    run_capture(2);
    run_capture(4);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifndef NCCL_GROUP_TEST_DEVICE
        cmocka_unit_test(test_capture),
#endif
        cmocka_unit_test(test_bad_options), cmocka_unit_test(test_comm_refusals),
        cmocka_unit_test(test_tp2_kvp2),    cmocka_unit_test(test_tp4),
        cmocka_unit_test(test_tp8),         cmocka_unit_test(test_stalled_peer_times_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
