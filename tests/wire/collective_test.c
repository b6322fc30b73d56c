/* cmocka tests for wire/collective: all-reduce, all-gather and broadcast among 2, 3 and 4
 * ranks, as threads and as processes, over TCP and shared memory, for 1 to 1M floats. Every
 * all-reduce result must equal, bit for bit, the sequential sum in rank order
 * (((x0 + x1) + x2) + x3) computed here; the inputs mix magnitudes so that any other order
 * would change bits. A killed rank and a stuck rank give an error within the timeout, and a
 * rank of another group is refused at Hello. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/collective.h"
#include "wire/tls.h"
#include "wire/transport.h"

#define MAX_N 4
static const size_t SIZES[] = {1, 7, 1000, COLL_TCP_CHUNK + 3, 1u << 20};
#define NUM_SIZES (sizeof SIZES / sizeof SIZES[0])

struct group {
    enum coll_transport transport;
    int n;
    char name[32];
    char shm_name[64];
    int ports[MAX_N];
    struct wire_listener listeners[MAX_N];
    int timeout_ms;
    int die_rank;   /* this rank raises SIGKILL after opening (process tests), -1 none */
    int stuck_rank; /* this rank opens and then never calls (thread tests), -1 none */
    struct wire_tls *tls[MAX_N]; /* per rank, NULL = plaintext */
    int sizes;                   /* how many of SIZES to run (0 = all) */
    int use_open;                /* coll_open (TCP ring, shm data plane on one host) */
    int tcp_only;                /* with use_open */
};

struct rank_arg {
    struct group *g;
    int rank;
    int status; /* 0 ok */
    char error[600];
};

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Rank r's value i: magnitudes from 2^-20 to 2^20, so the sum's bits depend on the order. */
static float input(int r, size_t i, size_t n) {
    uint64_t h = mix((uint64_t)r * 0x9e3779b97f4a7c15ull + i * 31 + n);
    float mant = (float)(h & 0xffffff) / (float)0x1000000 - 0.5f;
    int e = (int)((h >> 24) % 41) - 20;
    return mant * (float)ldexp(1.0, e);
}

static int rank_fail(struct rank_arg *a, const char *what) {
    snprintf(a->error, sizeof a->error, "rank %d: %s: %s", a->rank, what, strata_last_error());
    a->status = 1;
    return 1;
}

static int open_rank(struct coll **c, struct rank_arg *a) {
    struct group *g = a->g;
    struct coll_options o = {0};
    o.rank = a->rank;
    o.size = g->n;
    o.group = g->name;
    o.timeout_ms = g->timeout_ms;
    o.ports = g->ports;
    o.listener = &g->listeners[a->rank];
    o.shm_name = g->shm_name;
    o.tls = g->tls[a->rank];
    o.shm_slot_floats = 4096; /* several rounds for the larger sizes */
    o.tcp_only = g->tcp_only;
    int rc = g->use_open                ? coll_open(c, &o)
             : g->transport == COLL_TCP ? coll_open_tcp(c, &o)
                                        : coll_open_shm(c, &o);
    if (rc) return rank_fail(a, "open");
    if (coll_transport_of(*c) != g->transport) {
        snprintf(a->error, sizeof a->error, "rank %d: transport %d, want %d", a->rank,
                 (int)coll_transport_of(*c), (int)g->transport);
        coll_close(*c);
        return a->status = 1;
    }
    return 0;
}

/* Every operation at every size, checked bitwise. */
static int run_ops(struct coll *c, struct rank_arg *a) {
    const int N = a->g->n, r = a->rank;
    float *buf = malloc((size_t)N * SIZES[NUM_SIZES - 1] * sizeof(float));
    if (!buf) return rank_fail(a, "malloc");
    int bad = 0;
    const size_t num_sizes = a->g->sizes ? (size_t)a->g->sizes : NUM_SIZES;
    for (size_t s = 0; s < num_sizes && !bad; ++s) {
        const size_t n = SIZES[s];
        for (size_t i = 0; i < n; ++i)
            buf[i] = input(r, i, n);
        if (coll_allreduce_sum(c, buf, n)) bad = rank_fail(a, "all-reduce");
        for (size_t i = 0; i < n && !bad; ++i) {
            float want = input(0, i, n);
            for (int q = 1; q < N; ++q)
                want += input(q, i, n);
            if (memcmp(&want, &buf[i], sizeof want) != 0) {
                snprintf(a->error, sizeof a->error, "rank %d n=%zu: sum[%zu] = %a, want %a", r, n,
                         i, buf[i], want);
                bad = a->status = 1;
            }
        }
        /* all-gather with the input already in place (the aliasing case) */
        for (size_t i = 0; i < n && !bad; ++i)
            buf[(size_t)r * n + i] = input(r, i, n + 1);
        if (!bad && coll_allgather(c, buf, buf + (size_t)r * n, n))
            bad = rank_fail(a, "all-gather");
        for (size_t i = 0; i < (size_t)N * n && !bad; ++i)
            if (buf[i] != input((int)(i / n), i % n, n + 1)) {
                snprintf(a->error, sizeof a->error, "rank %d n=%zu: gathered[%zu] wrong", r, n, i);
                bad = a->status = 1;
            }
        const int root = (int)(s % (size_t)N);
        for (size_t i = 0; i < n && !bad; ++i)
            buf[i] = r == root ? input(root, i, n + 2) : -1.0f;
        if (!bad && coll_broadcast(c, buf, n, root)) bad = rank_fail(a, "broadcast");
        for (size_t i = 0; i < n && !bad; ++i)
            if (buf[i] != input(root, i, n + 2)) {
                snprintf(a->error, sizeof a->error, "rank %d n=%zu: broadcast[%zu] wrong", r, n, i);
                bad = a->status = 1;
            }
    }
    /* The counters (coll_stats_get): one call of each kind per size, its floats summed. */
    struct coll_stats st;
    size_t floats = 0;
    coll_stats_get(c, &st);
    for (size_t s = 0; s < num_sizes; ++s)
        floats += SIZES[s];
    if (!bad &&
        (st.allreduce.calls != num_sizes || st.allgather.calls != num_sizes ||
         st.broadcast.calls != num_sizes || st.allreduce.floats != floats ||
         st.allgather.floats != floats || st.broadcast.floats != floats || st.allreduce.ns == 0)) {
        snprintf(a->error, sizeof a->error,
                 "rank %d: stats %llu/%llu/%llu calls, %llu all-reduce floats (want %zu, %zu)", r,
                 (unsigned long long)st.allreduce.calls, (unsigned long long)st.allgather.calls,
                 (unsigned long long)st.broadcast.calls, (unsigned long long)st.allreduce.floats,
                 num_sizes, floats);
        bad = a->status = 1;
    }
    free(buf);
    return bad;
}

/* A rank whose group loses a member: the all-reduce must fail within the timeout. */
static int run_expect_failure(struct coll *c, struct rank_arg *a) {
    float v[1000];
    for (int i = 0; i < 1000; ++i)
        v[i] = (float)i;
    int64_t t0 = cli_now_ms();
    int rc = coll_allreduce_sum(c, v, 1000);
    int64_t took = cli_now_ms() - t0;
    if (rc == 0) {
        snprintf(a->error, sizeof a->error, "rank %d: all-reduce succeeded without a peer",
                 a->rank);
        return a->status = 1;
    }
    if (took > a->g->timeout_ms + 1500) {
        snprintf(a->error, sizeof a->error, "rank %d: failed after %lld ms (timeout %d): %s",
                 a->rank, (long long)took, a->g->timeout_ms, strata_last_error());
        return a->status = 1;
    }
    /* a dead peer is noticed (closed link, exited pid, a neighbour giving up), a stuck one
     * times out */
    if ((a->g->stuck_rank >= 0) != (rc == STRATA_ETIMEOUT)) {
        snprintf(a->error, sizeof a->error, "rank %d: unexpected status %s: %s", a->rank,
                 strata_status_name(rc), strata_last_error());
        return a->status = 1;
    }
    printf("rank %d: all-reduce failed after %lld ms (timeout %d ms): %s\n", a->rank,
           (long long)took, a->g->timeout_ms, strata_last_error());
    fflush(stdout);
    /* a later call reports the earlier failure at once */
    if (coll_allreduce_sum(c, v, 1) == 0 || !strstr(strata_last_error(), "failed earlier")) {
        snprintf(a->error, sizeof a->error, "rank %d: broken group not reported", a->rank);
        return a->status = 1;
    }
    return 0;
}

static void *rank_main(void *arg) {
    struct rank_arg *a = arg;
    struct coll *c = NULL;
    if (open_rank(&c, a)) return NULL;
    if (a->rank == a->g->die_rank) {
        struct timespec t = {0, 200 * 1000000L}; /* let the others finish opening */
        nanosleep(&t, NULL);
        raise(SIGKILL);
    }
    if (a->rank == a->g->stuck_rank) {
        const long ms = a->g->timeout_ms + 300;
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&t, NULL); /* never calls: the others time out */
    } else if (a->g->die_rank >= 0 || a->g->stuck_rank >= 0) {
        run_expect_failure(c, a);
    } else {
        run_ops(c, a);
    }
    coll_close(c);
    return NULL;
}

static void group_init(struct group *g, enum coll_transport t, int n) {
    static int counter;
    memset(g, 0, sizeof *g);
    g->transport = t;
    g->n = n;
    g->timeout_ms = 20000;
    g->die_rank = g->stuck_rank = -1;
    snprintf(g->name, sizeof g->name, "test.%d", counter);
    snprintf(g->shm_name, sizeof g->shm_name, "/strata-coll-test-%d-%d", (int)getpid(), counter++);
    for (int r = 0; r < n; ++r) {
        assert_int_equal(wire_listen(&g->listeners[r], NULL, 0), 0);
        g->ports[r] = g->listeners[r].port;
    }
}

static void group_free(struct group *g) {
    for (int r = 0; r < g->n; ++r)
        wire_listener_close(&g->listeners[r]);
}

static void run_threads(struct group *g) {
    pthread_t th[MAX_N];
    struct rank_arg a[MAX_N];
    for (int r = 0; r < g->n; ++r) {
        a[r] = (struct rank_arg){.g = g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < g->n; ++r)
        pthread_join(th[r], NULL);
    for (int r = 0; r < g->n; ++r)
        if (a[r].status) fail_msg("%s", a[r].error);
    group_free(g);
}

/* Forks one process per rank; each exits 0 when its checks pass (the dying rank excepted). */
static void run_processes(struct group *g) {
    pid_t pid[MAX_N];
    for (int r = 0; r < g->n; ++r) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            struct rank_arg a = {.g = g, .rank = r};
            rank_main(&a);
            if (a.status) fprintf(stderr, "%s\n", a.error);
            fflush(stderr);
            _exit(a.status);
        }
    }
    group_free(g);
    int failed = 0;
    for (int left = g->n; left > 0; --left) { /* reap in exit order: a dead rank goes first */
        int st;
        pid_t p = wait(&st);
        assert_true(p > 0);
        int r = 0;
        while (r < g->n && pid[r] != p)
            ++r;
        if (r == g->die_rank) {
            assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("rank %d (pid %d) failed (status %d)\n", r, (int)p, st);
            failed = 1;
        }
    }
    assert_int_equal(failed, 0);
}

static void test_threads(void **state) {
    (void)state;
    for (int t = 0; t < 2; ++t)
        for (int n = 2; n <= MAX_N; ++n) {
            struct group g;
            group_init(&g, (enum coll_transport)t, n);
            printf("threads %s n=%d\n", t ? "shm" : "tcp", n);
            run_threads(&g);
        }
}

static void test_processes(void **state) {
    (void)state;
    for (int t = 0; t < 2; ++t)
        for (int n = 2; n <= MAX_N; ++n) {
            struct group g;
            group_init(&g, (enum coll_transport)t, n);
            printf("processes %s n=%d\n", t ? "shm" : "tcp", n);
            run_processes(&g);
        }
}

static void test_killed_rank(void **state) {
    (void)state;
    for (int t = 0; t < 2; ++t) {
        struct group g;
        group_init(&g, (enum coll_transport)t, 3);
        g.timeout_ms = 2000;
        g.die_rank = 2;
        printf("killed rank, %s\n", t ? "shm" : "tcp");
        run_processes(&g);
    }
}

static void test_stuck_rank(void **state) {
    (void)state;
    for (int t = 0; t < 2; ++t) {
        struct group g;
        group_init(&g, (enum coll_transport)t, 2);
        g.timeout_ms = 1000;
        g.stuck_rank = 1;
        printf("stuck rank, %s\n", t ? "shm" : "tcp");
        run_threads(&g);
    }
}

/* Rank 1 believes it is in another group: both sides are refused at Hello. */
static void *wrong_group_rank(void *arg) {
    struct rank_arg *a = arg;
    struct group g = *a->g;
    if (a->rank == 1) snprintf(g.name, sizeof g.name, "other");
    a->g = &g;
    struct coll *c = NULL;
    if (open_rank(&c, a) == 0) {
        snprintf(a->error, sizeof a->error, "rank %d: opened a mixed group", a->rank);
        coll_close(c);
    }
    return NULL;
}

static void test_wrong_group(void **state) {
    (void)state;
    struct group g;
    group_init(&g, COLL_TCP, 2);
    g.timeout_ms = 3000;
    pthread_t th[2];
    struct rank_arg a[2];
    for (int r = 0; r < 2; ++r) {
        a[r] = (struct rank_arg){.g = &g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, wrong_group_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; ++r)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; ++r) {
        assert_int_equal(a[r].status, 1);
        printf("%s\n", a[r].error);
    }
    assert_true(strstr(a[0].error, "not a rank of group") ||
                strstr(a[1].error, "not a rank of group"));
    group_free(&g);
}

/* Rank 1 all-reduces 11 floats while rank 0 all-reduces 10: both fail, one names the desync
 * (on TCP the other sees its neighbour close the link). */
static void *desync_rank(void *arg) {
    struct rank_arg *a = arg;
    struct coll *c = NULL;
    if (open_rank(&c, a)) return NULL;
    float v[11] = {0};
    if (coll_allreduce_sum(c, v, a->rank == 1 ? 11 : 10) == 0)
        snprintf(a->error, sizeof a->error, "rank %d: mismatched all-reduce succeeded", a->rank);
    else
        snprintf(a->error, sizeof a->error, "%s", strata_last_error());
    coll_close(c);
    return NULL;
}

static void test_desync(void **state) {
    (void)state;
    for (int t = 0; t < 2; ++t) {
        struct group g;
        group_init(&g, (enum coll_transport)t, 2);
        g.timeout_ms = 3000;
        pthread_t th[2];
        struct rank_arg a[2];
        for (int r = 0; r < 2; ++r) {
            a[r] = (struct rank_arg){.g = &g, .rank = r};
            assert_int_equal(pthread_create(&th[r], NULL, desync_rank, &a[r]), 0);
        }
        for (int r = 0; r < 2; ++r)
            pthread_join(th[r], NULL);
        for (int r = 0; r < 2; ++r) {
            printf("%s\n", a[r].error);
            assert_null(strstr(a[r].error, "succeeded"));
        }
        assert_true(strstr(a[0].error, "desync") || strstr(a[1].error, "desync"));
        group_free(&g);
    }
}

/* coll_open: ranks on one host move to shared memory (unless told tcp_only), as threads and
 * as processes, with the same bitwise results. */
static void test_open_chooses(void **state) {
    (void)state;
    struct group g;
    group_init(&g, COLL_SHM, 3);
    g.use_open = 1;
    g.shm_name[0] = '\0'; /* coll_open draws its own */
    run_threads(&g);
    group_init(&g, COLL_SHM, 2);
    g.use_open = 1;
    run_processes(&g);
    group_init(&g, COLL_TCP, 2);
    g.use_open = 1;
    g.tcp_only = 1;
    g.sizes = 3;
    run_threads(&g);
}

static struct wire_tls *psk_tls(const char *text) {
    struct wire_auth_key key = {0};
    struct wire_tls_options o = {0};
    struct wire_tls *tls = NULL;
    key.len = strlen(text);
    memcpy(key.bytes, text, key.len);
    o.psk = &key;
    assert_int_equal(wire_tls_new(&tls, &o), 0);
    return tls;
}

/* The ring over TLS 1.3 (PSK): the same bitwise results; a rank with another key cannot
 * join. */
static void test_tls(void **state) {
    (void)state;
    struct wire_tls *good = psk_tls("a-pre-shared-key-of-enough-bytes");
    struct wire_tls *bad = psk_tls("another-key-that-does-not-match!");
    struct group g;
    group_init(&g, COLL_TCP, 3);
    g.sizes = 4; /* up to 64K + 3 floats: several frames per chunk loop */
    for (int r = 0; r < 3; ++r)
        g.tls[r] = good;
    run_threads(&g);

    group_init(&g, COLL_TCP, 2);
    g.timeout_ms = 3000;
    g.tls[0] = good;
    g.tls[1] = bad;
    pthread_t th[2];
    struct rank_arg a[2];
    for (int r = 0; r < 2; ++r) {
        a[r] = (struct rank_arg){.g = &g, .rank = r};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < 2; ++r)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; ++r) {
        printf("%s\n", a[r].error);
        assert_int_equal(a[r].status, 1);
        assert_non_null(strstr(a[r].error, "open"));
    }
    group_free(&g);
    wire_tls_free(good);
    wire_tls_free(bad);
}

static void test_bad_arguments(void **state) {
    (void)state;
    struct coll *c = NULL;
    struct coll_options o = {.rank = 2, .size = 2, .group = "g"};
    assert_int_equal(coll_open_tcp(&c, &o), STRATA_EINVAL);
    o.rank = 0;
    o.size = 1;
    assert_int_equal(coll_open_shm(&c, &o), 0); /* a group of one needs nothing */
    float v[3] = {1, 2, 3}, out[3];
    assert_int_equal(coll_allreduce_sum(c, v, 3), 0);
    assert_true(v[0] == 1 && v[2] == 3);
    assert_int_equal(coll_allgather(c, out, v, 3), 0);
    assert_true(out[1] == 2);
    assert_int_equal(coll_broadcast(c, v, 3, 1), STRATA_EINVAL);
    coll_close(c);
    o.size = 2;
    o.shm_name = "no-slash";
    assert_int_equal(coll_open_shm(&c, &o), STRATA_EINVAL);
    assert_null(c);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_processes),     cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_stuck_rank),    cmocka_unit_test(test_wrong_group),
        cmocka_unit_test(test_tls),           cmocka_unit_test(test_desync),
        cmocka_unit_test(test_open_chooses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
