/* kernels/nccl.h emulated on the host, for tests without a GPU (beside kernels/cuda_cpu, which
 * runs the kernels' own source on the host): "device" buffers are host buffers and the ranks of a
 * communicator are threads of this process that meet, like NCCL's own bootstrap, by their unique
 * id. An operation runs when it is queued (the stream is not used), between two barriers: every
 * rank publishes its buffer, every rank copies what it needs, nobody moves on before all have
 * copied. The failure rules are NCCL's as nccl.h states them: a rank that does not arrive within
 * the communicator's timeout fails the waiting ranks with STRATA_ETIMEOUT naming them, an abort
 * ends every pending and later operation of the communicator, and allreduce_sum2 refuses more than
 * two ranks. cuda_ops_tree_sum is the reference's ops_tree_sum itself: the device kernel's order is
 * checked on a GPU (tests/kernels).
 *
 * Stream capture (a decode step of a TP / KVP group captured into a CUDA graph; NCCL >= 2.9
 * captures collectives): this thread's capture state is emulated_capture.h's. A collective or tree
 * sum queued while the thread captures must go to the captured stream and is one node of the graph;
 * it runs at once, like a captured kernel here, and the ranks, capturing the same step together,
 * meet in it as their graphs' launches would. A host wait (cuda_nccl_stream_wait) or a
 * communicator's set-up inside a capture fails and spoils it, as a device would refuse them. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/nccl.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "tests/backend_ops/emulated_capture.h"

#define EMU_MAX_RANKS 64

struct world {
    uint8_t id[CUDA_NCCL_ID_BYTES];
    int size, joined, refs, aborted;
    unsigned long generation; /* barrier rounds completed */
    int waiting;              /* ranks inside the current barrier */
    const float *in[EMU_MAX_RANKS];
    size_t n[EMU_MAX_RANKS];
    struct world *next;
};

struct cuda_nccl_comm {
    struct world *w;
    int rank, size, timeout_ms, failed;
    char label[64];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static struct world *worlds;
static unsigned long id_counter;

static void deadline_after(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static void unref(struct world *w) { /* under lock */
    if (--w->refs > 0) return;
    for (struct world **p = &worlds; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    free(w);
}

int cuda_nccl_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "NCCL emulated on the host");
    return 1;
}

int cuda_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES]) {
    pthread_mutex_lock(&lock);
    const unsigned long k = ++id_counter;
    pthread_mutex_unlock(&lock);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    memset(id, 0, CUDA_NCCL_ID_BYTES);
    memcpy(id, &k, sizeof k);
    memcpy(id + sizeof k, &ts, sizeof ts);
    return STRATA_OK;
}

int cuda_nccl_comm_init(struct cuda_nccl_comm **out, const uint8_t id[CUDA_NCCL_ID_BYTES], int size,
                        int rank, int timeout_ms, const char *label) {
    *out = NULL;
    int sync = emulated_capture_sync(__func__);
    if (sync) return sync;
    if (size < 1 || size > EMU_MAX_RANKS || rank < 0 || rank >= size || timeout_ms < 1)
        return strata_set_error(STRATA_EINVAL, "cuda_nccl_comm_init: rank %d of %d, timeout %d",
                                rank, size, timeout_ms);
    struct cuda_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return strata_set_error(STRATA_ENOMEM, "cuda_nccl_comm_init: out of memory");
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    snprintf(c->label, sizeof c->label, "%s", label ? label : "");
    pthread_mutex_lock(&lock);
    struct world *w = worlds;
    while (w && memcmp(w->id, id, CUDA_NCCL_ID_BYTES))
        w = w->next;
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) {
            pthread_mutex_unlock(&lock);
            free(c);
            return strata_set_error(STRATA_ENOMEM, "cuda_nccl_comm_init: out of memory");
        }
        memcpy(w->id, id, CUDA_NCCL_ID_BYTES);
        w->size = size;
        w->next = worlds;
        worlds = w;
    }
    int rc = STRATA_OK;
    if (w->size != size) {
        rc = strata_set_error(STRATA_EINVAL, "NCCL group '%s' rank %d: %d ranks, others said %d",
                              c->label, rank, size, w->size);
        if (w->refs == 0) {
            w->refs = 1;
            unref(w);
        }
        pthread_mutex_unlock(&lock);
        free(c);
        return rc;
    }
    w->refs++;
    w->joined++;
    pthread_cond_broadcast(&changed);
    struct timespec until;
    deadline_after(&until, timeout_ms);
    while (w->joined < size && !rc)
        if (pthread_cond_timedwait(&changed, &lock, &until) == ETIMEDOUT && w->joined < size)
            rc = strata_set_error(STRATA_ETIMEOUT,
                                  "NCCL group '%s' rank %d of %d: joining the communicator "
                                  "timed out (a peer did not take part)",
                                  c->label, rank, size);
    if (rc) {
        w->joined--;
        unref(w);
        pthread_mutex_unlock(&lock);
        free(c);
        return rc;
    }
    c->w = w;
    pthread_mutex_unlock(&lock);
    *out = c;
    return STRATA_OK;
}

/* Under lock: marks the communicator failed for every rank and wakes them. */
static void abort_world(struct cuda_nccl_comm *c) {
    if (c->w) {
        c->w->aborted = 1;
        pthread_cond_broadcast(&changed);
    }
    c->failed = 1;
}

void cuda_nccl_comm_abort(struct cuda_nccl_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&lock);
    abort_world(c);
    if (c->w) unref(c->w);
    pthread_mutex_unlock(&lock);
    free(c);
}

void cuda_nccl_comm_destroy(struct cuda_nccl_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&lock);
    if (c->w) unref(c->w);
    pthread_mutex_unlock(&lock);
    free(c);
}

int cuda_nccl_rank(const struct cuda_nccl_comm *c) {
    return c ? c->rank : -1;
}

int cuda_nccl_size(const struct cuda_nccl_comm *c) {
    return c ? c->size : 0;
}

/* Under lock: every rank arrives, or the timeout / an abort fails this one (and aborts the
 * communicator, as kernels/nccl.cu does, so the others fail promptly too). */
static int barrier(struct cuda_nccl_comm *c, const char *what) {
    struct world *w = c->w;
    if (c->failed || w->aborted) {
        c->failed = 1;
        return strata_set_error(STRATA_ECLOSED,
                                "NCCL group '%s' rank %d of %d: %s after the "
                                "group failed",
                                c->label, c->rank, c->size, what);
    }
    const unsigned long gen = w->generation;
    if (++w->waiting == w->size) {
        w->waiting = 0;
        w->generation++;
        pthread_cond_broadcast(&changed);
        return STRATA_OK;
    }
    struct timespec until;
    deadline_after(&until, c->timeout_ms);
    while (w->generation == gen && !w->aborted)
        if (pthread_cond_timedwait(&changed, &lock, &until) == ETIMEDOUT && w->generation == gen) {
            abort_world(c);
            return strata_set_error(STRATA_ETIMEOUT,
                                    "NCCL group '%s' rank %d of %d: no answer within %d ms (a "
                                    "peer died or stalled); communicator aborted",
                                    c->label, c->rank, c->size, c->timeout_ms);
        }
    if (w->generation == gen) {
        c->failed = 1;
        return strata_set_error(STRATA_ECLOSED, "NCCL group '%s' rank %d of %d: %s: aborted",
                                c->label, c->rank, c->size, what);
    }
    return STRATA_OK;
}

static int usable(const struct cuda_nccl_comm *c, const char *fn) {
    if (!c) return strata_set_error(STRATA_EINVAL, "%s: no communicator", fn);
    if (c->failed)
        return strata_set_error(STRATA_ECLOSED,
                                "NCCL group '%s' rank %d of %d: %s after the group failed",
                                c->label, c->rank, c->size, fn);
    return STRATA_OK;
}

/* Publishes `in`, waits for all, runs copy(c, arg), waits until everyone has copied. */
static int exchange(struct cuda_nccl_comm *c, const float *in, size_t n, const char *what,
                    void (*copy)(struct cuda_nccl_comm *, void *, size_t), void *arg) {
    pthread_mutex_lock(&lock);
    c->w->in[c->rank] = in;
    c->w->n[c->rank] = n;
    int rc = barrier(c, what);
    for (int r = 0; !rc && r < c->size; ++r)
        if (c->w->n[r] != n)
            rc = strata_set_error(STRATA_EINVAL,
                                  "NCCL group '%s' rank %d of %d: %s of %zu "
                                  "floats, rank %d passed %zu",
                                  c->label, c->rank, c->size, what, n, r, c->w->n[r]);
    pthread_mutex_unlock(&lock);
    if (!rc) copy(c, arg, n); /* the others' buffers stay put until the second barrier */
    pthread_mutex_lock(&lock);
    int rc2 = barrier(c, what);
    pthread_mutex_unlock(&lock);
    return rc ? rc : rc2;
}

static void copy_gather(struct cuda_nccl_comm *c, void *arg, size_t n) {
    float *out = arg;
    for (int r = 0; r < c->size; ++r)
        if (out + (size_t)r * n != c->w->in[r])
            memcpy(out + (size_t)r * n, c->w->in[r], n * sizeof(float));
}

int cuda_nccl_allgather(struct cuda_nccl_comm *c, float *out, const float *in, size_t n,
                        void *stream) {
    int rc = emulated_capture_enqueue(__func__, stream);
    if (!rc) rc = usable(c, __func__);
    if (rc || n == 0) return rc;
    if (!out || !in) return strata_set_error(STRATA_EINVAL, "cuda_nccl_allgather: NULL buffer");
    return exchange(c, in, n, "ncclAllGather", copy_gather, out);
}

struct sum2 {
    float *tmp;
};

static void copy_sum2(struct cuda_nccl_comm *c, void *arg, size_t n) {
    struct sum2 *s = arg;
    for (size_t i = 0; i < n; ++i)
        s->tmp[i] = c->w->in[0][i] + c->w->in[1][i];
}

int cuda_nccl_allreduce_sum2(struct cuda_nccl_comm *c, float *data, size_t n, void *stream) {
    int rc = emulated_capture_enqueue(__func__, stream);
    if (!rc) rc = usable(c, __func__);
    if (rc) return rc;
    if (c->size != 2)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_nccl_allreduce_sum2: %d ranks (only two ranks' sum has "
                                "one order)",
                                c->size);
    if (n == 0) return STRATA_OK;
    struct sum2 s = {malloc(n * sizeof(float))};
    if (!s.tmp) return strata_set_error(STRATA_ENOMEM, "cuda_nccl_allreduce_sum2: no memory");
    rc = exchange(c, data, n, "ncclAllReduce", copy_sum2, &s);
    if (!rc) memcpy(data, s.tmp, n * sizeof(float));
    free(s.tmp);
    return rc;
}

int cuda_nccl_stream_wait(struct cuda_nccl_comm *c, void *stream, int timeout_ms) {
    (void)stream, (void)timeout_ms;
    int rc = emulated_capture_sync(__func__); /* a host wait: never inside a capture */
    return rc ? rc : usable(c, __func__);     /* operations ran when queued */
}

int cuda_ops_tree_sum(float *out, const float *parts, int count, size_t n, void *stream) {
    int rc = emulated_capture_enqueue(__func__, stream);
    if (rc) return rc;
    if (count < 1 || count > OPS_SPLIT_LEAVES || (count & (count - 1)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_ops_tree_sum: count %d is not a power of two <= %d", count,
                                OPS_SPLIT_LEAVES);
    ops_tree_sum(out, parts, count, n);
    return STRATA_OK;
}
