/* tun_link: a packet-level link emulator for the multi-host tests ("tests across
 * hosts") on kernels without the netem qdisc. It stands in for `tc qdisc ... netem delay D J
 * loss P` without any qdisc: one TUN device per host network namespace, a userspace switch
 * between them.
 *
 *   tun_link --host NS=ADDR ... [--delay-us D] [--jitter-us J] [--loss-pct P] [--seed S]
 *
 * For each --host it enters the namespace NS (/run/netns/NS, as `ip netns` names it), opens
 * /dev/net/tun there and attaches to its device --ifname (default tun0, made persistent and
 * routed by the test script: every other host's ADDR/32 via tun0, see netns_lib.sh). Every
 * IPv4 packet a host writes to its tun is forwarded, unmodified (so no checksum changes), to
 * the tun of the namespace owning its destination address, after D +- J microseconds (uniform
 * jitter from a seeded PRNG, so packets may be reordered as netem's jitter does), or dropped
 * with probability P %. One packet crosses exactly one emulated link, so a hop is D +- J.
 *
 * Design: one thread, a ppoll loop over the tun fds with the timeout of the earliest pending
 * packet; pending packets sit in a binary min-heap ordered by due time (then arrival). Queue
 * memory is bounded by --max-queue packets of at most the tun MTU each; a packet arriving at
 * a full queue is dropped and counted as overflow, as a full qdisc would. SIGTERM / SIGINT end
 * the loop (they are blocked except inside ppoll, so none is lost); the counters are then
 * printed as `key value` lines on stdout for the test to judge: forwarded, dropped (loss),
 * overflow, not_ipv4 and unroutable (dropped: no --host owns the destination), and the delay really
 * applied (read to write, min/mean/max ms). IPv4 only. Exit 0 after a signal, 1 when a device
 * cannot be opened, 2 for a bad command. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns, ppoll */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

#define MAX_HOSTS 16
#define PKT_MAX 65536 /* a read buffer no tun packet exceeds (MTU <= 65535) */
#define READ_BURST 64 /* packets read from one tun per wake-up, so no host starves another */

struct host {
    char ns[256];
    uint32_t addr; /* network byte order */
    int fd;
};

struct pkt {
    int64_t due_ns, read_ns;
    uint64_t seq; /* arrival order: equal due times leave in arrival order */
    int to;       /* index into hosts[] */
    size_t len;
    unsigned char data[]; /* the IPv4 packet as read */
};

struct link {
    struct host hosts[MAX_HOSTS];
    int n_hosts;
    const char *ifname;
    int64_t delay_ns, jitter_ns;
    double loss;  /* probability in [0, 1] */
    uint64_t rng; /* splitmix64 state */
    struct pkt **heap;
    int heap_n, heap_cap;
    uint64_t seq;
    /* counters printed at exit */
    uint64_t forwarded, dropped, overflow, not_ipv4, unroutable, write_errors, bytes;
    int64_t delay_min_ns, delay_max_ns, delay_sum_ns;
};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* splitmix64: small, seedable, good enough for loss and jitter draws. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static double rng_unit(uint64_t *s) {
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static int pkt_before(const struct pkt *a, const struct pkt *b) {
    return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->seq < b->seq);
}

static void heap_push(struct link *l, struct pkt *p) {
    int i = l->heap_n++;
    while (i > 0 && pkt_before(p, l->heap[(i - 1) / 2])) {
        l->heap[i] = l->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    l->heap[i] = p;
}

static struct pkt *heap_pop(struct link *l) {
    struct pkt *top = l->heap[0], *last = l->heap[--l->heap_n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= l->heap_n) break;
        if (c + 1 < l->heap_n && pkt_before(l->heap[c + 1], l->heap[c])) c++;
        if (!pkt_before(l->heap[c], last)) break;
        l->heap[i] = l->heap[c];
        i = c;
    }
    if (l->heap_n > 0) l->heap[i] = last;
    return top;
}

/* Opens the tun device of host h inside its namespace. The tun's network namespace is the
 * one current when /dev/net/tun is opened, so the open happens between two setns() calls;
 * `self` is this process's own namespace to come back to. */
static int host_open(struct host *h, const char *ifname, int self) {
    char path[300];
    struct ifreq ifr = {0};
    int nsfd, fd = -1;
    if (strchr(h->ns, '/'))
        snprintf(path, sizeof path, "%s", h->ns);
    else
        snprintf(path, sizeof path, "/run/netns/%s", h->ns);
    nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) return strata_set_error(STRATA_ENOTFOUND, "open %s: %s", path, strerror(errno));
    if (setns(nsfd, CLONE_NEWNET) < 0) {
        strata_set_error(STRATA_EIO, "setns %s: %s", path, strerror(errno));
        close(nsfd);
        return STRATA_EIO;
    }
    close(nsfd);
    fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        strata_set_error(STRATA_EIO, "open /dev/net/tun in %s: %s", h->ns, strerror(errno));
        goto fail;
    }
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        strata_set_error(STRATA_EIO, "TUNSETIFF %s in %s: %s", ifname, h->ns, strerror(errno));
        goto fail;
    }
    if (setns(self, CLONE_NEWNET) < 0) {
        strata_set_error(STRATA_EIO, "setns back to our own namespace: %s", strerror(errno));
        goto fail;
    }
    h->fd = fd;
    return 0;
fail:
    if (fd >= 0) close(fd);
    setns(self, CLONE_NEWNET);
    return STRATA_EIO;
}

static int host_of(const struct link *l, uint32_t addr) {
    for (int i = 0; i < l->n_hosts; i++)
        if (l->hosts[i].addr == addr) return i;
    return -1;
}

/* One packet read from host `from`: dropped (loss, unroutable, full queue) or queued with
 * its due time. */
static void admit(struct link *l, int from, const unsigned char *buf, size_t len, int64_t now) {
    uint32_t dst;
    int to;
    if (len < 20 || (buf[0] >> 4) != 4) { /* e.g. the kernel's IPv6 router solicitations */
        l->not_ipv4++;
        return;
    }
    memcpy(&dst, buf + 16, 4);
    to = host_of(l, dst);
    if (to < 0 || to == from) {
        l->unroutable++;
        return;
    }
    if (l->loss > 0 && rng_unit(&l->rng) < l->loss) {
        l->dropped++;
        return;
    }
    if (l->heap_n == l->heap_cap) {
        l->overflow++;
        return;
    }
    struct pkt *p = malloc(sizeof *p + len);
    if (!p) {
        l->overflow++;
        return;
    }
    int64_t jitter = 0;
    if (l->jitter_ns > 0)
        jitter = (int64_t)((2.0 * rng_unit(&l->rng) - 1.0) * (double)l->jitter_ns);
    p->read_ns = now;
    p->due_ns = now + l->delay_ns + jitter;
    p->seq = l->seq++;
    p->to = to;
    p->len = len;
    memcpy(p->data, buf, len);
    heap_push(l, p);
}

/* Writes every packet whose time has come to its destination tun. */
static void release_due(struct link *l) {
    int64_t now = cli_now_ns();
    while (l->heap_n > 0 && l->heap[0]->due_ns <= now) {
        struct pkt *p = heap_pop(l);
        if (write(l->hosts[p->to].fd, p->data, p->len) == (ssize_t)p->len) {
            int64_t d = now - p->read_ns;
            if (l->forwarded == 0 || d < l->delay_min_ns) l->delay_min_ns = d;
            if (d > l->delay_max_ns) l->delay_max_ns = d;
            l->delay_sum_ns += d;
            l->forwarded++;
            l->bytes += p->len;
        } else {
            l->write_errors++;
        }
        free(p);
    }
}

static int run(struct link *l) {
    struct pollfd pfd[MAX_HOSTS];
    static unsigned char buf[PKT_MAX];
    sigset_t none;
    sigemptyset(&none);
    for (int i = 0; i < l->n_hosts; i++)
        pfd[i] = (struct pollfd){l->hosts[i].fd, POLLIN, 0};
    while (!g_stop) {
        struct timespec ts, *tsp = NULL;
        if (l->heap_n > 0) {
            int64_t wait = l->heap[0]->due_ns - cli_now_ns();
            if (wait < 0) wait = 0;
            ts.tv_sec = wait / 1000000000;
            ts.tv_nsec = wait % 1000000000;
            tsp = &ts;
        }
        int n = ppoll(pfd, (nfds_t)l->n_hosts, tsp, &none);
        if (n < 0 && errno != EINTR)
            return strata_set_error(STRATA_EIO, "ppoll: %s", strerror(errno));
        for (int i = 0; n > 0 && i < l->n_hosts; i++) {
            if (pfd[i].revents & (POLLERR | POLLHUP | POLLNVAL))
                return strata_set_error(STRATA_EIO, "tun of %s failed", l->hosts[i].ns);
            if (!(pfd[i].revents & POLLIN)) continue;
            for (int k = 0; k < READ_BURST; k++) {
                ssize_t r = read(pfd[i].fd, buf, sizeof buf);
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
                if (r < 0)
                    return strata_set_error(STRATA_EIO, "read tun of %s: %s", l->hosts[i].ns,
                                            strerror(errno));
                admit(l, i, buf, (size_t)r, cli_now_ns());
            }
        }
        release_due(l);
    }
    return 0;
}

static void print_stats(const struct link *l, uint64_t seed) {
    double n = l->forwarded ? (double)l->forwarded : 1.0;
    printf("seed %llu\n", (unsigned long long)seed);
    printf("forwarded %llu\n", (unsigned long long)l->forwarded);
    printf("forwarded_bytes %llu\n", (unsigned long long)l->bytes);
    printf("dropped %llu\n", (unsigned long long)l->dropped);
    printf("overflow %llu\n", (unsigned long long)l->overflow);
    printf("not_ipv4 %llu\n", (unsigned long long)l->not_ipv4);
    printf("unroutable %llu\n", (unsigned long long)l->unroutable);
    printf("write_errors %llu\n", (unsigned long long)l->write_errors);
    printf("pending_at_exit %d\n", l->heap_n);
    printf("delay_min_ms %.3f\n", (double)l->delay_min_ns / 1e6);
    printf("delay_mean_ms %.3f\n", (double)l->delay_sum_ns / n / 1e6);
    printf("delay_max_ms %.3f\n", (double)l->delay_max_ns / 1e6);
    fflush(stdout);
}

static int add_host(struct link *l, const char *arg) {
    const char *eq = strchr(arg, '=');
    struct host *h = &l->hosts[l->n_hosts];
    if (l->n_hosts == MAX_HOSTS)
        return strata_set_error(STRATA_EINVAL, "at most %d --host", MAX_HOSTS);
    if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof h->ns)
        return strata_set_error(STRATA_EINVAL, "--host needs NS=ADDR, got \"%s\"", arg);
    memcpy(h->ns, arg, (size_t)(eq - arg));
    h->ns[eq - arg] = 0;
    if (inet_pton(AF_INET, eq + 1, &h->addr) != 1)
        return strata_set_error(STRATA_EINVAL, "--host %s: \"%s\" is no IPv4 address", h->ns,
                                eq + 1);
    if (host_of(l, h->addr) >= 0)
        return strata_set_error(STRATA_EINVAL, "--host: address %s given twice", eq + 1);
    h->fd = -1;
    l->n_hosts++;
    return 0;
}

static const char usage[] =
    "usage: tun_link --host NS=ADDR --host NS=ADDR ... [--ifname tun0] [--delay-us D]\n"
    "                [--jitter-us J] [--loss-pct P] [--seed S] [--max-queue N] [--ready-file F]\n"
    "Forwards IPv4 packets between the TUN devices IFNAME of the network namespaces NS\n"
    "(/run/netns/NS, or a path) to the one owning the destination ADDR, each after D +- J\n"
    "microseconds (uniform) or dropped with probability P %: netem delay/jitter/loss without\n"
    "a qdisc. At most N packets pending (default 4096; more are dropped as overflow).\n"
    "F is written once every device is attached. Runs until SIGTERM/SIGINT, then prints\n"
    "`key value` counters (forwarded, dropped, overflow, delay_min/mean/max_ms ...).\n"
    "Exit: 0 after a signal, 1 when a device fails, 2 for a bad command line.\n";

/* Parses the command line into l; returns 0, 1 for --help, or a negative status. */
static int parse(struct link *l, uint64_t *seed, const char **ready, int argc, char **argv) {
    static const struct option longs[] = {{"host", 1, 0, 'h'},      {"ifname", 1, 0, 'i'},
                                          {"delay-us", 1, 0, 'd'},  {"jitter-us", 1, 0, 'j'},
                                          {"loss-pct", 1, 0, 'l'},  {"seed", 1, 0, 's'},
                                          {"max-queue", 1, 0, 'q'}, {"ready-file", 1, 0, 'r'},
                                          {"help", 0, 0, 'H'},      {0, 0, 0, 0}};
    int c, v, rc;
    char *end;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'h':
            if ((rc = add_host(l, optarg)) < 0) return rc;
            break;
        case 'i':
            if (strlen(optarg) >= IFNAMSIZ || !*optarg)
                return strata_set_error(STRATA_EINVAL, "--ifname \"%s\" is no interface name",
                                        optarg);
            l->ifname = optarg;
            break;
        case 'd':
        case 'j':
            if ((rc = cli_parse_int(optarg, 0, 10000000, &v)) < 0)
                return strata_wrap_error(rc, "--%s", c == 'd' ? "delay-us" : "jitter-us");
            *(c == 'd' ? &l->delay_ns : &l->jitter_ns) = (int64_t)v * 1000;
            break;
        case 'l':
            l->loss = strtod(optarg, &end) / 100.0;
            if (end == optarg || *end || !(l->loss >= 0 && l->loss <= 1))
                return strata_set_error(STRATA_EINVAL,
                                        "--loss-pct needs a number in [0, 100], "
                                        "got \"%s\"",
                                        optarg);
            break;
        case 's':
            errno = 0;
            *seed = strtoull(optarg, &end, 10);
            if (end == optarg || *end || errno)
                return strata_set_error(STRATA_EINVAL,
                                        "--seed needs an unsigned integer, "
                                        "got \"%s\"",
                                        optarg);
            break;
        case 'q':
            if ((rc = cli_parse_int(optarg, 1, 1 << 20, &l->heap_cap)) < 0)
                return strata_wrap_error(rc, "--max-queue");
            break;
        case 'r': *ready = optarg; break;
        case 'H': return 1;
        default: return STRATA_EINVAL;
        }
    }
    if (optind != argc)
        return strata_set_error(STRATA_EINVAL, "unexpected argument \"%s\"", argv[optind]);
    if (l->n_hosts < 2) return strata_set_error(STRATA_EINVAL, "needs at least two --host");
    if (l->jitter_ns > l->delay_ns)
        return strata_set_error(STRATA_EINVAL, "--jitter-us exceeds --delay-us");
    return 0;
}

int main(int argc, char **argv) {
    static struct link l = {.ifname = "tun0", .heap_cap = 4096};
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const char *ready = NULL;
    struct sigaction sa = {0};
    sigset_t block;
    int self, rc = 0, i;
    strata_set_error(STRATA_EINVAL, "bad command line (--help)");
    if ((rc = parse(&l, &seed, &ready, argc, argv)) != 0) {
        if (rc == 1) {
            fputs(usage, stdout);
            return 0;
        }
        fprintf(stderr, "tun_link: %s\n", strata_last_error());
        return 2;
    }
    l.rng = seed;
    printf("seed %llu: delay %.3f ms +- %.3f ms, loss %.3f %%, %d hosts\n",
           (unsigned long long)seed, (double)l.delay_ns / 1e6, (double)l.jitter_ns / 1e6,
           l.loss * 100, l.n_hosts);
    fflush(stdout);
    /* SIGTERM / SIGINT only inside ppoll: a signal between two checks of g_stop would
     * otherwise be noticed only at the next packet. */
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Timers fire within 1 us of the due time, not the default 50 us slack: the slack would
     * be added to every hop's delay. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    l.heap = calloc((size_t)l.heap_cap, sizeof *l.heap);
    self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (!l.heap || self < 0) {
        fprintf(stderr, "tun_link: %s\n", !l.heap ? "out of memory" : "open /proc/self/ns/net");
        return 1;
    }
    for (i = 0; i < l.n_hosts && rc == 0; i++)
        rc = host_open(&l.hosts[i], l.ifname, self);
    if (rc == 0 && ready && cli_write_file_atomic(ready, "ready\n", 6) < 0) rc = STRATA_EIO;
    if (rc == 0) {
        rc = run(&l);
        print_stats(&l, seed); /* also after a failed loop: what it forwarded until then */
    }
    if (rc < 0) fprintf(stderr, "tun_link: %s\n", strata_last_error());
    for (i = 0; i < l.n_hosts; i++)
        if (l.hosts[i].fd >= 0) close(l.hosts[i].fd);
    while (l.heap_n > 0)
        free(heap_pop(&l));
    free(l.heap);
    close(self);
    return rc < 0 ? 1 : 0;
}
