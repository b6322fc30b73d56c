/* NCCL communicators with deadlines, and the device tree sum (nccl.h). The communicator is
 * non-blocking (ncclConfig_t.blocking = 0) so that no call can wait on a peer without a
 * limit: initialisation, a collective's enqueue and a stream wait all poll
 * ncclCommGetAsyncError against a deadline and abort the communicator when it passes. */
#include <dlfcn.h>
#include <stdint.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/nccl.h"
#include "runtime/base/op_contract.h"
}

static_assert(sizeof(ncclUniqueId) == CUDA_NCCL_ID_BYTES, "ncclUniqueId size");

/* NCCL is opened at run time (libnccl.so.2), not linked: it is only needed by a stage split
 * over several GPUs (TP / KVP), and it is large (over 200 MB), so a GPU box serving whole
 * stages, or a test bundle, need not carry it. Its functions, with nccl.h's own types, are
 * resolved once; where the library is missing every entry says so (STRATA_EDEVICE). */
#define NCCL_FUNCTIONS(X)                                                                          \
    X(ncclGetVersion)                                                                              \
    X(ncclGetUniqueId)                                                                             \
    X(ncclCommInitRankConfig)                                                                      \
    X(ncclCommFinalize)                                                                            \
    X(ncclCommDestroy)                                                                             \
    X(ncclCommAbort)                                                                               \
    X(ncclGetErrorString)                                                                          \
    X(ncclGetLastError)                                                                            \
    X(ncclCommGetAsyncError)                                                                       \
    X(ncclAllReduce)                                                                               \
    X(ncclAllGather)
static struct {
#define NCCL_POINTER(name) decltype(&::name) name;
    NCCL_FUNCTIONS(NCCL_POINTER)
#undef NCCL_POINTER
} nccl_api;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_missing[256]; /* why it cannot be used, "" once loaded */

static void nccl_open(void) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(nccl_missing, sizeof nccl_missing, "NCCL is not installed (%s)", dlerror());
        return;
    }
#define NCCL_RESOLVE(name)                                                                         \
    if (!(nccl_api.name = (decltype(nccl_api.name))dlsym(lib, #name)) && !nccl_missing[0])        \
        snprintf(nccl_missing, sizeof nccl_missing, "libnccl.so.2 lacks %s", #name);
    NCCL_FUNCTIONS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
}

/* 1 when NCCL's functions are there; else 0 with the reason in `why`. */
static int nccl_loaded(char *why, size_t cap) {
    pthread_once(&nccl_once, nccl_open);
    if (nccl_missing[0] && why && cap) snprintf(why, cap, "%s", nccl_missing);
    return !nccl_missing[0];
}

/* From here on the calls go through the resolved pointers. */
#define ncclGetVersion nccl_api.ncclGetVersion
#define ncclGetUniqueId nccl_api.ncclGetUniqueId
#define ncclCommInitRankConfig nccl_api.ncclCommInitRankConfig
#define ncclCommFinalize nccl_api.ncclCommFinalize
#define ncclCommDestroy nccl_api.ncclCommDestroy
#define ncclCommAbort nccl_api.ncclCommAbort
#define ncclGetErrorString nccl_api.ncclGetErrorString
#define ncclGetLastError nccl_api.ncclGetLastError
#define ncclCommGetAsyncError nccl_api.ncclCommGetAsyncError
#define ncclAllReduce nccl_api.ncclAllReduce
#define ncclAllGather nccl_api.ncclAllGather

struct cuda_nccl_comm {
    ncclComm_t comm; /* NULL once aborted */
    int rank, size;
    int failed;     /* 1 after an abort: every later call fails at once */
    int timeout_ms; /* init's: also bounds an enqueue and finalize */
    char label[64];
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void nap(void) {
    struct timespec ts = {0, 100 * 1000}; /* 100 us: far below any collective's cost */
    nanosleep(&ts, NULL);
}

static int nccl_fail(const struct cuda_nccl_comm *c, int status, const char *what, ncclResult_t r) {
    const char *last = c->comm ? ncclGetLastError(c->comm) : "";
    return strata_set_error(status, "NCCL group '%s' rank %d of %d: %s: %s%s%s", c->label, c->rank,
                            c->size, what, ncclGetErrorString(r), last && *last ? ": " : "",
                            last ? last : "");
}

static void abort_comm(struct cuda_nccl_comm *c) {
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    c->failed = 1;
}

/* Polls the communicator until it is no longer in progress or the deadline passes. */
static int poll_ready(struct cuda_nccl_comm *c, double deadline, const char *what) {
    ncclResult_t state = ncclInProgress;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state != ncclInProgress) break;
        if (now_ms() > deadline) {
            abort_comm(c);
            return strata_set_error(STRATA_ETIMEOUT,
                                    "NCCL group '%s' rank %d of %d: %s timed out (a peer did "
                                    "not take part)",
                                    c->label, c->rank, c->size, what);
        }
        nap();
    }
    if (state != ncclSuccess) {
        int rc = nccl_fail(c, STRATA_EDEVICE, what, state);
        abort_comm(c);
        return rc;
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

extern "C" int cuda_nccl_available(char *reason, size_t cap) {
    int version = 0;
    if (!nccl_loaded(reason, cap)) return 0;
    ncclResult_t r = ncclGetVersion(&version);
    if (r != ncclSuccess) {
        if (reason && cap) snprintf(reason, cap, "NCCL unusable: %s", ncclGetErrorString(r));
        return 0;
    }
    if (reason && cap)
        snprintf(reason, cap, "NCCL %d.%d.%d", version / 10000, version / 100 % 100, version % 100);
    return 1;
}

extern "C" int cuda_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    if (!nccl_loaded(NULL, 0)) return strata_set_error(STRATA_EDEVICE, "%s", nccl_missing);
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return strata_set_error(STRATA_EDEVICE, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return STRATA_OK;
}

extern "C" int cuda_nccl_comm_init(struct cuda_nccl_comm **out,
                                   const uint8_t id[CUDA_NCCL_ID_BYTES], int size, int rank,
                                   int timeout_ms, const char *label) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || timeout_ms < 1)
        return strata_set_error(STRATA_EINVAL, "cuda_nccl_comm_init: rank %d of %d, timeout %d",
                                rank, size, timeout_ms);
    if (!nccl_loaded(NULL, 0)) return strata_set_error(STRATA_EDEVICE, "%s", nccl_missing);
    struct cuda_nccl_comm *c = (struct cuda_nccl_comm *)calloc(1, sizeof *c);
    if (!c) return strata_set_error(STRATA_ENOMEM, "cuda_nccl_comm_init: out of memory");
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    snprintf(c->label, sizeof c->label, "%s", label ? label : "");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const double deadline = now_ms() + timeout_ms;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, u, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = nccl_fail(c, STRATA_EDEVICE, "ncclCommInitRankConfig", r);
        abort_comm(c);
        free(c);
        return rc;
    }
    int rc = poll_ready(c, deadline, "joining the communicator");
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return STRATA_OK;
}

extern "C" void cuda_nccl_comm_abort(struct cuda_nccl_comm *c) {
    if (!c) return;
    abort_comm(c);
    free(c);
}

extern "C" void cuda_nccl_comm_destroy(struct cuda_nccl_comm *c) {
    if (!c) return;
    if (c->comm) {
        /* Finalize flushes pending operations; a peer that is gone leaves it in progress,
         * so it is bounded like everything else and then aborted. */
        ncclResult_t r = ncclCommFinalize(c->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            poll_ready(c, now_ms() + c->timeout_ms, "finalize") == STRATA_OK) {
            ncclCommDestroy(c->comm);
            c->comm = NULL;
        }
        abort_comm(c);
    }
    free(c);
}

extern "C" int cuda_nccl_rank(const struct cuda_nccl_comm *c) {
    return c ? c->rank : -1;
}

extern "C" int cuda_nccl_size(const struct cuda_nccl_comm *c) {
    return c ? c->size : 0;
}

/* A non-blocking communicator may answer an enqueue with ncclInProgress: the operation is
 * queued once the communicator is ready again. */
static int enqueued(struct cuda_nccl_comm *c, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return STRATA_OK;
    if (r == ncclInProgress) return poll_ready(c, now_ms() + c->timeout_ms, what);
    int rc = nccl_fail(c, STRATA_EDEVICE, what, r);
    abort_comm(c);
    return rc;
}

extern "C" int cuda_nccl_allgather(struct cuda_nccl_comm *c, float *out, const float *in, size_t n,
                                   void *stream) {
    int rc = usable(c, __func__);
    if (rc) return rc;
    if (n == 0) return STRATA_OK;
    if (!out || !in) return strata_set_error(STRATA_EINVAL, "cuda_nccl_allgather: NULL buffer");
    return enqueued(c, ncclAllGather(in, out, n, ncclFloat32, c->comm, (cudaStream_t)stream),
                    "ncclAllGather");
}

extern "C" int cuda_nccl_allreduce_sum2(struct cuda_nccl_comm *c, float *data, size_t n,
                                        void *stream) {
    int rc = usable(c, __func__);
    if (rc) return rc;
    if (c->size != 2)
        return strata_set_error(STRATA_EINVAL,
                                "cuda_nccl_allreduce_sum2: %d ranks (only two ranks' sum has "
                                "one order)",
                                c->size);
    if (n == 0) return STRATA_OK;
    if (!data) return strata_set_error(STRATA_EINVAL, "cuda_nccl_allreduce_sum2: NULL buffer");
    return enqueued(
        c, ncclAllReduce(data, data, n, ncclFloat32, ncclSum, c->comm, (cudaStream_t)stream),
        "ncclAllReduce");
}

extern "C" int cuda_nccl_stream_wait(struct cuda_nccl_comm *c, void *stream, int timeout_ms) {
    int rc = usable(c, __func__);
    if (rc) return rc;
    const double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return STRATA_OK;
        /* "not ready" is also left as the thread's last error, which the next launch's
         * cudaGetLastError check would report as its own failure: clear it. */
        if (e == cudaErrorNotReady) (void)cudaGetLastError();
        if (e != cudaErrorNotReady) {
            abort_comm(c);
            return strata_set_error(STRATA_EDEVICE, "NCCL group '%s' rank %d of %d: stream: %s",
                                    c->label, c->rank, c->size, cudaGetErrorString(e));
        }
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(c->comm, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
            rc = nccl_fail(c, STRATA_EDEVICE, "asynchronous error", state);
            abort_comm(c);
            return rc;
        }
        if (now_ms() > deadline) {
            abort_comm(c);
            return strata_set_error(STRATA_ETIMEOUT,
                                    "NCCL group '%s' rank %d of %d: no answer within %d ms (a "
                                    "peer died or stalled); communicator aborted",
                                    c->label, c->rank, c->size, timeout_ms);
        }
        nap();
    }
}

/* One thread per element: ops_tree_sum's balanced tree, pairs (2i, 2i+1) level by level. */
__global__ static void tree_sum_kernel(float *out, const float *parts, int count, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v[OPS_SPLIT_LEAVES];
        for (int k = 0; k < count; ++k)
            v[k] = parts[(size_t)k * n + i];
        for (int m = count; m > 1; m /= 2)
            for (int j = 0; j < m / 2; ++j)
                v[j] = __fadd_rn(v[2 * j], v[2 * j + 1]);
        out[i] = v[0];
    }
}

extern "C" int cuda_ops_tree_sum(float *out, const float *parts, int count, size_t n,
                                 void *stream) {
    if (count < 1 || count > OPS_SPLIT_LEAVES || (count & (count - 1)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_ops_tree_sum: count %d is not a power of two <= %d", count,
                                OPS_SPLIT_LEAVES);
    if (n == 0) return STRATA_OK;
    if (!out || !parts) return strata_set_error(STRATA_EINVAL, "cuda_ops_tree_sum: NULL buffer");
    const int threads = 256;
    const size_t want = (n + threads - 1) / threads;
    const unsigned blocks = (unsigned)(want < 65535 ? want : 65535);
    tree_sum_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(out, parts, count, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
