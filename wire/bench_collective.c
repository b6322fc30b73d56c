/* strata-bench-collective: latency and bandwidth of the group collectives (wire/collective.h)
 * over TCP (loopback) and shared memory, one process per rank, at a few sizes.
 *
 * For each transport, rank count and size, every rank runs warm-up all-reduces and then
 * `iters` timed ones; rank 0 prints the mean time per operation and two bandwidths:
 * algbw = bytes / time and busbw = algbw × 2(N-1)/N (the convention of nccl-tests, which
 * makes ring-like algorithms comparable across N). Not a test: numbers depend on the box. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/collective.h"
#include "wire/transport.h"

#define MAX_RANKS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct config {
    enum coll_transport transport;
    int n;
    size_t floats;
    int iters;
    int ports[MAX_RANKS];
    struct wire_listener listeners[MAX_RANKS];
    char shm_name[64];
};

/* One rank's run; rank 0 prints the row. Returns the exit code. */
static int rank_main(struct config *cfg, int rank) {
    struct coll_options o = {0};
    o.rank = rank;
    o.size = cfg->n;
    o.group = "bench";
    o.timeout_ms = 30000;
    o.ports = cfg->ports;
    o.listener = &cfg->listeners[rank];
    o.shm_name = cfg->shm_name;
    struct coll *c = NULL;
    int rc = cfg->transport == COLL_TCP ? coll_open_tcp(&c, &o) : coll_open_shm(&c, &o);
    float *buf = calloc(cfg->floats, sizeof *buf);
    if (rc || !buf) {
        fprintf(stderr, "rank %d: %s\n", rank, rc ? strata_last_error() : "out of memory");
        free(buf);
        coll_close(c);
        return 1;
    }
    for (size_t i = 0; i < cfg->floats; ++i)
        buf[i] = (float)(i % 7) * 0.25f;
    for (int w = 0; w < 3 && !rc; ++w)
        rc = coll_allreduce_sum(c, buf, cfg->floats);
    double t0 = now_s();
    for (int it = 0; it < cfg->iters && !rc; ++it)
        rc = coll_allreduce_sum(c, buf, cfg->floats);
    double dt = (now_s() - t0) / cfg->iters;
    if (rc) fprintf(stderr, "rank %d: %s\n", rank, strata_last_error());
    if (!rc && rank == 0) {
        double bytes = (double)cfg->floats * 4.0;
        double alg = bytes / dt / 1e9, bus = alg * 2.0 * (cfg->n - 1) / cfg->n;
        printf("%-5s %5d %10zu %12.1f %10.3f %10.3f\n", cfg->transport == COLL_TCP ? "tcp" : "shm",
               cfg->n, cfg->floats, dt * 1e6, alg, bus);
        fflush(stdout);
    }
    free(buf);
    coll_close(c);
    return rc ? 1 : 0;
}

static int run_config(struct config *cfg) {
    static int counter;
    snprintf(cfg->shm_name, sizeof cfg->shm_name, "/strata-bench-%d-%d", (int)getpid(), counter++);
    for (int r = 0; r < cfg->n; ++r) {
        if (wire_listen(&cfg->listeners[r], NULL, 0)) {
            fprintf(stderr, "strata-bench-collective: %s\n", strata_last_error());
            return 1;
        }
        cfg->ports[r] = cfg->listeners[r].port;
    }
    pid_t pid[MAX_RANKS];
    fflush(stdout); /* or the children print the parent's buffered lines again */
    for (int r = 0; r < cfg->n; ++r) {
        pid[r] = fork();
        if (pid[r] == 0) _exit(rank_main(cfg, r));
    }
    for (int r = 0; r < cfg->n; ++r)
        wire_listener_close(&cfg->listeners[r]);
    int failed = 0;
    for (int r = 0; r < cfg->n; ++r) {
        int st = 0;
        if (pid[r] < 0 || waitpid(pid[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            failed = 1;
    }
    return failed;
}

static void usage(FILE *out) {
    fprintf(out, "usage: strata-bench-collective [--ranks 2,4] [--quick]\n"
                 "\n"
                 "All-reduce (sum, fp32) latency and bandwidth over TCP loopback and shared\n"
                 "memory, one process per rank, at 1, 1K, 64K and 1M floats.\n"
                 "  --ranks LIST   group sizes to run (default 2,4; each 2..8)\n"
                 "  --quick        fewer iterations\n"
                 "  --help         this text\n");
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {{"ranks", required_argument, 0, 'r'},
                                             {"quick", no_argument, 0, 'q'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int ranks[MAX_RANKS] = {2, 4}, num_ranks = 2, quick = 0, c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return STRATA_EXIT_OK;
        }
        if (c == 'q') {
            quick = 1;
            continue;
        }
        if (c != 'r') {
            usage(stderr);
            return STRATA_EXIT_USAGE;
        }
        num_ranks = 0;
        for (char *tok = strtok(optarg, ","); tok && num_ranks < MAX_RANKS; tok = strtok(NULL, ","))
            if (cli_parse_int(tok, 2, MAX_RANKS, &ranks[num_ranks++]) != 0) {
                fprintf(stderr, "strata-bench-collective: --ranks: %s\n", strata_last_error());
                return STRATA_EXIT_USAGE;
            }
    }
    signal(SIGPIPE, SIG_IGN);
    static const size_t sizes[] = {1, 1024, 65536, 1 << 20};
    printf("all-reduce sum fp32, one process per rank (busbw = algbw x 2(N-1)/N)\n");
    printf("%-5s %5s %10s %12s %10s %10s\n", "link", "ranks", "floats", "us/op", "algbw GB/s",
           "busbw GB/s");
    int failed = 0;
    for (int ri = 0; ri < num_ranks; ++ri)
        for (int t = 0; t < 2; ++t)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
                struct config cfg = {0};
                cfg.transport = (enum coll_transport)t;
                cfg.n = ranks[ri];
                cfg.floats = sizes[s];
                cfg.iters = sizes[s] >= 65536 ? (quick ? 5 : 30) : (quick ? 50 : 500);
                failed |= run_config(&cfg);
            }
    return failed ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}
