/* Collectives over POSIX shared memory for ranks on one host (see collective.h).
 *
 * One segment per group: a header (futex barrier, abort flag, every rank's pid and how many
 * barriers it reached), then two sets of N slots plus a result area, slot_floats floats each.
 * Rounds alternate between the sets, so a rank may start writing round k+1 while slower ranks
 * still read round k. The barrier is a generation counter: the last rank to arrive resets the
 * count and bumps the generation (release), the others wait on it with FUTEX_WAIT in short
 * slices, checking the deadline, the abort flag and whether the missing ranks' processes
 * still exist. All ordering goes through C11 atomics (acquire/release), which is also what
 * ThreadSanitizer sees; the futex only saves spinning.
 *
 * Ranks that are threads of one process share one mapping (a small registry by name), so the
 * atomics they synchronise on have one address. Rank 0 creates the segment (removing a stale
 * one of the same name), the others open it once it is initialised and its creator is alive;
 * rank 0 unlinks the name as soon as every rank has attached, so nothing is left in /dev/shm
 * even if the group later dies. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "wire/collective_internal.h"

#define SHM_MAGIC 0x53434f4cu /* "SCOL" */
#define SHM_ALIGN 64

struct shm_header {
    _Atomic uint32_t magic; /* set last by the creator (release) */
    uint32_t size;
    uint64_t slot_floats;
    uint64_t total_bytes;
    char group[56];
    _Atomic int32_t creator_pid;
    _Atomic uint32_t attached;
    _Atomic uint32_t arrive;  /* ranks inside the current barrier */
    _Atomic uint32_t gen;     /* barrier generation: the futex word */
    _Atomic uint32_t aborted; /* 1 + the rank that gave up, 0 = fine */
    _Atomic int32_t pid[COLL_MAX_RANKS];
    _Atomic uint32_t seen[COLL_MAX_RANKS]; /* barriers each rank has reached */
    /* What each rank is doing, written before an operation's first barrier and compared
     * after it; two sets by operation parity, so a rank starting the next operation never
     * overwrites what a slower rank still reads. */
    struct shm_desc {
        uint64_t seq, n;
        uint32_t op;
        int32_t root;
    } desc[2][COLL_MAX_RANKS];
};

struct coll_shm {
    struct shm_header *hdr;
    float *data; /* [2][size + 1][slot_floats] */
    size_t map_bytes;
    char name[256];
    uint32_t barriers; /* barriers this rank has reached */
    uint64_t round;
};

/* ---- process-local registry: threads of one process share a mapping ---- */

struct shm_mapping {
    char name[256];
    void *addr;
    size_t bytes;
    int refs;
    struct shm_mapping *next;
};
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct shm_mapping *registry;

static struct shm_mapping *registry_find(const char *name) {
    for (struct shm_mapping *m = registry; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* Enters a new mapping of segment `name` (under registry_mu); *out = m. */
static int registry_add(struct shm_mapping **out, struct shm_mapping *m, const char *name,
                        void *addr, size_t bytes) {
    snprintf(m->name, sizeof m->name, "%s", name);
    m->addr = addr;
    m->bytes = bytes;
    m->next = registry;
    registry = m;
    *out = m;
    return STRATA_OK;
}

static void registry_release(void *addr) {
    pthread_mutex_lock(&registry_mu);
    for (struct shm_mapping **p = &registry; *p; p = &(*p)->next) {
        if ((*p)->addr != addr) continue;
        struct shm_mapping *m = *p;
        if (--m->refs == 0) {
            munmap(m->addr, m->bytes);
            *p = m->next;
            free(m);
        }
        break;
    }
    pthread_mutex_unlock(&registry_mu);
}

/* The header's bytes, rounded up so the float slots after it start SHM_ALIGN-aligned. */
static size_t segment_head_bytes(void) {
    return (sizeof(struct shm_header) + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
}

static size_t segment_bytes(int size, size_t slot) {
    return segment_head_bytes() + 2 * ((size_t)size + 1) * slot * sizeof(float);
}

static float *segment_data(struct shm_header *h) {
    return (float *)((char *)h + segment_head_bytes());
}

/* Rank 0: a fresh segment, initialised and registered (under registry_mu). */
static int create_segment(struct shm_mapping **out, const struct coll_options *o, size_t slot) {
    const size_t bytes = segment_bytes(o->size, slot);
    shm_unlink(o->shm_name); /* a stale segment of a crashed run */
    int fd = shm_open(o->shm_name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return strata_set_error(STRATA_EIO, "shm_open(%s): %s", o->shm_name, strerror(errno));
    void *addr = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    struct shm_mapping *m = addr == MAP_FAILED ? NULL : calloc(1, sizeof *m);
    if (!m) {
        if (addr != MAP_FAILED) munmap(addr, bytes);
        shm_unlink(o->shm_name);
        return strata_set_error(STRATA_EIO, "sizing shared memory %s to %zu bytes: %s", o->shm_name,
                                bytes, strerror(err));
    }
    struct shm_header *h = addr;
    h->size = (uint32_t)o->size;
    h->slot_floats = slot;
    h->total_bytes = bytes;
    snprintf(h->group, sizeof h->group, "%s", o->group);
    atomic_store(&h->creator_pid, (int32_t)getpid());
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    return registry_add(out, m, o->shm_name, addr, bytes);
}

/* Other ranks: the creator's segment once it is ready; 1 = not there yet (retry). */
static int open_segment(struct shm_mapping **out, const struct coll_options *o) {
    int fd = shm_open(o->shm_name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ENOENT) return 1;
        return strata_set_error(STRATA_EIO, "shm_open(%s): %s", o->shm_name, strerror(errno));
    }
    struct stat sb;
    void *addr = MAP_FAILED;
    size_t bytes = 0;
    if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(struct shm_header)) {
        bytes = (size_t)sb.st_size;
        addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (addr == MAP_FAILED) return 1; /* being sized */
    struct shm_header *h = addr;
    pid_t creator = atomic_load(&h->creator_pid);
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC ||
        h->total_bytes != bytes || (kill(creator, 0) != 0 && errno == ESRCH)) {
        munmap(addr, bytes); /* not initialised yet, or stale */
        return 1;
    }
    if (h->size != (uint32_t)o->size || strcmp(h->group, o->group) != 0) {
        int size = (int)h->size;
        char group[56];
        snprintf(group, sizeof group, "%s", h->group);
        munmap(addr, bytes);
        return strata_set_error(STRATA_EINVAL,
                                "shared memory %s belongs to group \"%s\" of %d ranks, not "
                                "\"%s\" of %d",
                                o->shm_name, group, size, o->group, o->size);
    }
    struct shm_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        munmap(addr, bytes);
        return strata_set_error(STRATA_ENOMEM, "collective: out of memory");
    }
    return registry_add(out, m, o->shm_name, addr, bytes);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* Raises the group's abort flag so the other ranks stop waiting. */
static void shm_abort(struct coll *c) {
    struct shm_header *h = c->shm->hdr;
    uint32_t none = 0;
    atomic_compare_exchange_strong(&h->aborted, &none, (uint32_t)c->rank + 1);
    futex_wake_all(&h->gen); /* waiters wake, see the flag (gen itself never moves on abort) */
}

/* Why the ranks we wait for are late: a process that exited, else a timeout naming them. */
static int barrier_failure(struct coll *c, int timed_out) {
    struct shm_header *h = c->shm->hdr;
    char late[256] = "";
    size_t used = 0;
    for (int q = 0; q < c->size; ++q) {
        if (atomic_load(&h->seen[q]) >= c->shm->barriers) continue;
        pid_t pid = atomic_load(&h->pid[q]);
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
            return strata_set_error(STRATA_ECLOSED, "rank %d (pid %d) has exited", q, (int)pid);
        if (used < sizeof late - 8)
            used += (size_t)snprintf(late + used, sizeof late - used, "%s%d", used ? ", " : "", q);
    }
    if (!timed_out) return STRATA_OK;
    return strata_set_error(STRATA_ETIMEOUT,
                            "rank(s) %s did not reach barrier %u within %d ms (dead or stuck?)",
                            late, c->shm->barriers, c->timeout_ms);
}

static int shm_barrier(struct coll *c, int64_t deadline) {
    struct shm_header *h = c->shm->hdr;
    const uint32_t g = atomic_load_explicit(&h->gen, memory_order_acquire);
    atomic_store(&h->seen[c->rank], ++c->shm->barriers);
    if (atomic_fetch_add_explicit(&h->arrive, 1, memory_order_acq_rel) == (uint32_t)c->size - 1) {
        atomic_store_explicit(&h->arrive, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->gen, 1, memory_order_release);
        futex_wake_all(&h->gen);
        return STRATA_OK;
    }
    int64_t next_check = coll_now_ms() + 100;
    for (;;) {
        uint32_t who = atomic_load(&h->aborted);
        if (who) { /* name the cause when it is a rank that has exited, not who noticed it */
            int rc = barrier_failure(c, 0);
            return rc ? rc
                      : strata_set_error(STRATA_EPEER, "rank %u gave up on the group", who - 1);
        }
        if (atomic_load_explicit(&h->gen, memory_order_acquire) != g) return STRATA_OK;
        int64_t now = coll_now_ms();
        if (now >= deadline) return barrier_failure(c, 1);
        if (now >= next_check) {
            int rc = barrier_failure(c, 0);
            if (rc) return rc;
            next_check = now + 100;
        }
        int64_t wait = deadline - now < 20 ? deadline - now : 20;
        futex_wait(&h->gen, g, wait);
    }
}

/* Publishes this rank's operation (before the first barrier). */
static void shm_announce(struct coll *c, enum coll_op op, size_t n, int root) {
    struct shm_desc *d = &c->shm->hdr->desc[c->seq & 1][c->rank];
    d->seq = c->seq;
    d->n = n;
    d->op = (uint32_t)op;
    d->root = root;
}

/* After the first barrier: every rank must be doing the same operation. */
static int shm_check_announced(struct coll *c) {
    static const char *const names[] = {"?", "all-reduce", "?", "all-gather", "broadcast"};
    const struct shm_desc *mine = &c->shm->hdr->desc[c->seq & 1][c->rank];
    for (int q = 0; q < c->size; ++q) {
        const struct shm_desc *d = &c->shm->hdr->desc[c->seq & 1][q];
        if (d->seq == mine->seq && d->n == mine->n && d->op == mine->op && d->root == mine->root)
            continue;
        return strata_set_error(STRATA_EFORMAT,
                                "desync: rank %d is in operation #%llu %s of %llu floats (root "
                                "%d), this rank in #%llu %s of %llu floats (root %d) (do all "
                                "ranks call the same collectives in the same order with the "
                                "same sizes?)",
                                q, (unsigned long long)d->seq, names[d->op < 5 ? d->op : 0],
                                (unsigned long long)d->n, d->root, (unsigned long long)mine->seq,
                                names[mine->op < 5 ? mine->op : 0], (unsigned long long)mine->n,
                                mine->root);
    }
    return STRATA_OK;
}

int coll_shm_open(struct coll *c, const struct coll_options *o) {
    if (!o->shm_name || o->shm_name[0] != '/' || strlen(o->shm_name) >= 200 ||
        strchr(o->shm_name + 1, '/'))
        return strata_set_error(STRATA_EINVAL,
                                "shared memory name must be \"/name\" (one slash, < 200 chars)");
    size_t slot = o->shm_slot_floats ? o->shm_slot_floats : COLL_SHM_SLOT;
    c->shm = calloc(1, sizeof *c->shm);
    if (!c->shm) return strata_set_error(STRATA_ENOMEM, "collective: out of memory");
    snprintf(c->shm->name, sizeof c->shm->name, "%s", o->shm_name);
    const int64_t deadline = coll_now_ms() + c->timeout_ms;
    struct shm_mapping *m = NULL;
    int rc;
    for (;;) {
        pthread_mutex_lock(&registry_mu);
        m = registry_find(o->shm_name);
        if (m) {
            ++m->refs;
            rc = STRATA_OK;
        } else {
            rc = o->rank == 0 ? create_segment(&m, o, slot) : open_segment(&m, o);
            if (rc == 0) m->refs = 1;
        }
        pthread_mutex_unlock(&registry_mu);
        if (rc <= 0) break;
        if (coll_now_ms() >= deadline)
            return strata_set_error(STRATA_ETIMEOUT,
                                    "rank 0 did not create shared memory %s within %d ms",
                                    o->shm_name, c->timeout_ms);
        struct timespec pause = {0, 5 * 1000000};
        nanosleep(&pause, NULL);
    }
    if (rc) return rc;
    c->shm->hdr = m->addr;
    c->shm->map_bytes = m->bytes;
    c->shm->data = segment_data(c->shm->hdr);
    if (c->shm->hdr->size != (uint32_t)o->size || strcmp(c->shm->hdr->group, o->group) != 0)
        return strata_set_error(STRATA_EINVAL, "shared memory %s is another group's", o->shm_name);
    atomic_store(&c->shm->hdr->pid[c->rank], (int32_t)getpid());
    atomic_fetch_add(&c->shm->hdr->attached, 1);
    rc = shm_barrier(c, deadline); /* everyone attached */
    if (o->rank == 0) shm_unlink(o->shm_name);
    if (rc) shm_abort(c);
    return rc;
}

void coll_shm_close(struct coll *c) {
    if (!c->shm) return;
    if (c->shm->hdr) registry_release(c->shm->hdr);
    free(c->shm);
    c->shm = NULL;
}

/* Slot q of the current round's set (q == size: the result area). */
static float *slot(struct coll *c, int q) {
    const size_t S = c->shm->hdr->slot_floats;
    const size_t set = (size_t)(c->shm->round & 1);
    return c->shm->data + (set * ((size_t)c->size + 1) + (size_t)q) * S;
}

int coll_shm_allreduce(struct coll *c, float *data, size_t n) {
    const int64_t deadline = coll_now_ms() + c->timeout_ms;
    const size_t S = c->shm->hdr->slot_floats, N = (size_t)c->size;
    int rc = STRATA_OK;
    shm_announce(c, COLL_OP_PARTIAL, n, 0);
    for (size_t off = 0; off < n && !rc; off += S, ++c->shm->round) {
        const size_t len = n - off < S ? n - off : S;
        memcpy(slot(c, c->rank), data + off, len * sizeof(float));
        if ((rc = shm_barrier(c, deadline))) break;
        if (off == 0 && (rc = shm_check_announced(c))) break;
        /* this rank sums its share of the elements, over the ranks in order */
        const size_t per = (len + N - 1) / N, lo = per * (size_t)c->rank;
        const size_t hi = lo + per < len ? lo + per : len;
        float *res = slot(c, c->size);
        for (size_t i = lo; i < hi; ++i) {
            float acc = slot(c, 0)[i];
            for (int q = 1; q < c->size; ++q)
                acc += slot(c, q)[i];
            res[i] = acc;
        }
        if ((rc = shm_barrier(c, deadline))) break;
        memcpy(data + off, res, len * sizeof(float));
    }
    if (rc) shm_abort(c);
    return rc;
}

int coll_shm_allgather(struct coll *c, float *out, const float *in, size_t n) {
    const int64_t deadline = coll_now_ms() + c->timeout_ms;
    const size_t S = c->shm->hdr->slot_floats;
    int rc = STRATA_OK;
    shm_announce(c, COLL_OP_GATHER, n, 0);
    for (size_t off = 0; off < n && !rc; off += S, ++c->shm->round) {
        const size_t len = n - off < S ? n - off : S;
        memcpy(slot(c, c->rank), in + off, len * sizeof(float));
        if ((rc = shm_barrier(c, deadline))) break;
        if (off == 0 && (rc = shm_check_announced(c))) break;
        for (int q = 0; q < c->size; ++q)
            memmove(out + (size_t)q * n + off, slot(c, q), len * sizeof(float));
    }
    if (rc) shm_abort(c);
    return rc;
}

int coll_shm_broadcast(struct coll *c, float *data, size_t n, int root) {
    const int64_t deadline = coll_now_ms() + c->timeout_ms;
    const size_t S = c->shm->hdr->slot_floats;
    int rc = STRATA_OK;
    shm_announce(c, COLL_OP_BCAST, n, root);
    for (size_t off = 0; off < n && !rc; off += S, ++c->shm->round) {
        const size_t len = n - off < S ? n - off : S;
        if (c->rank == root) memcpy(slot(c, 0), data + off, len * sizeof(float));
        if ((rc = shm_barrier(c, deadline))) break;
        if (off == 0 && (rc = shm_check_announced(c))) break;
        if (c->rank != root) memcpy(data + off, slot(c, 0), len * sizeof(float));
    }
    if (rc) shm_abort(c);
    return rc;
}
