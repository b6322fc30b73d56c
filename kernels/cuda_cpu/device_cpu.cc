/* kernels/cuda_device.h on the host, for the kernels' own sources run by the cuda_cpu
 * fiber scheduler (cuda_runtime.h): "device" memory is host memory, every launch and copy
 * completes before its call returns (one in-order stream), so the synchronising calls only
 * report what a launch left in cudaGetLastError. Graphs are recordings: between
 * capture_begin and capture_end this thread's launches and asynchronous copies on the
 * capturing stream are kept (with their arguments) instead of run, a synchronous call fails
 * and spoils the capture, an update keeps the executable when the sequence of launch sites
 * is the same (cudaGraphExecUpdate), and a launch replays the recording.
 *
 * It also enforces two rules a device would not check but the CUDA backend relies on (a
 * device would only run slower or race): an asynchronous copy's host side is pinned
 * (cuda_host_alloc), and once a stream exists nothing is queued on the legacy default stream
 * (NULL). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "cuda_runtime.h"

extern "C" {
#include "kernels/cuda_device.h"
#include "runtime/base/status.h"
}

/* A recorded graph: its nodes in order, and their sites (the topology). */
struct Graph {
    std::vector<std::function<void()>> ops;
    std::vector<std::string> sites;
};

/* This thread's capture (CUDA's capture mode is per thread here: the backend's TP ranks are
 * threads). */
struct Capture {
    bool active = false, spoiled = false;
    void *stream = nullptr;
    std::string why;
    Graph graph;
};
static thread_local Capture g_capture;

int cucpu_capture_record(cudaStream_t stream, const char *site, const std::function<void()> &op) {
    if (!g_capture.active) return 0;
    if (stream != g_capture.stream) {
        g_capture.spoiled = true;
        g_capture.why = "work queued on another stream";
        return -1;
    }
    g_capture.graph.ops.push_back(op);
    g_capture.graph.sites.push_back(site);
    return 1;
}

/* A synchronous call while capturing fails and invalidates the capture (cuda_device.h). */
static int spoil(const char *what) {
    g_capture.spoiled = true;
    g_capture.why = std::string(what) + " while capturing";
    return strata_set_error(STRATA_EDEVICE, "%s: operation not permitted when stream is capturing",
                            what);
}

/* A launch's failure (bad geometry, a deadlocked barrier) surfaces at the next call, as a
 * kernel fault does on a device. */
static int check_launches(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return strata_set_error(STRATA_EDEVICE, "%s: %s", what, cudaGetErrorString(e));
    return STRATA_OK;
}

/* Pinned host ranges and live streams (TP / KVP ranks are threads of one process). */
static std::mutex g_pinned_lock;
static std::vector<std::pair<const char *, size_t>> g_pinned;
static int g_live_streams;

int cucpu_default_stream_misused(cudaStream_t stream) {
    std::lock_guard<std::mutex> hold(g_pinned_lock);
    return !stream && g_live_streams > 0;
}

static int is_pinned(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> hold(g_pinned_lock);
    for (const auto &r : g_pinned)
        if ((const char *)p >= r.first && (const char *)p + bytes <= r.first + r.second) return 1;
    return 0;
}

extern "C" {

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "cuda_cpu (the kernels' CUDA source run on the host)");
    return 1;
}

int cuda_malloc(void **ptr, size_t bytes) {
    if (g_capture.active) return spoil("cuda_malloc");
    if (!ptr) return strata_set_error(STRATA_EINVAL, "cuda_malloc: NULL ptr");
    *ptr = calloc(1, bytes ? bytes : 1);
    return *ptr ? STRATA_OK : strata_set_error(STRATA_ENOMEM, "cuda_malloc: %zu bytes", bytes);
}

void cuda_free(void *ptr) {
    free(ptr);
}

static int copy(void *dst, const void *src, size_t bytes, const char *what) {
    if (g_capture.active) return spoil(what);
    if (bytes && (!dst || !src)) return strata_set_error(STRATA_EINVAL, "%s: NULL pointer", what);
    if (bytes) memmove(dst, src, bytes);
    return check_launches(what);
}

int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    return copy(dst, src, bytes, "cuda_memcpy_to_device");
}

int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    return copy(dst, src, bytes, "cuda_memcpy_to_host");
}

int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes) {
    return copy(dst, src, bytes, "cuda_memcpy_on_device");
}

int cuda_synchronize(void) {
    if (g_capture.active) return spoil("cuda_synchronize");
    return check_launches("cuda_synchronize");
}

/* Eight "devices", all host memory: a TP / KVP grid puts rank r on cuda:r. */
enum { kDevices = 8 };

int cuda_set_device(int index) {
    return index >= 0 && index < kDevices
               ? STRATA_OK
               : strata_set_error(STRATA_EDEVICE, "no CUDA device %d (cuda_cpu has %d)", index,
                                  (int)kDevices);
}

int cuda_device_describe(int index, char *buf, size_t cap) {
    int rc = cuda_set_device(index);
    if (!rc) snprintf(buf, cap, "cuda_cpu device %d (kernels run on host fibers)", index);
    return rc;
}

/* "Device" memory is the host's: what the kernel says is available to allocate. */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES),
               total = sysconf(_SC_PHYS_PAGES);
    if (free_bytes) *free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    if (total_bytes) *total_bytes = page > 0 && total > 0 ? (size_t)page * (size_t)total : 0;
    return STRATA_OK;
}

int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind) {
    (void)kind;
    if (g_capture.active) return spoil("cuda_memcpy_2d");
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "cuda_memcpy_2d: width %zu > pitch", width);
    for (size_t r = 0; r < height; ++r)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return check_launches("cuda_memcpy_2d");
}

int cuda_memset(void *dst, int value, size_t bytes) {
    if (g_capture.active) return spoil("cuda_memset");
    if (bytes && !dst) return strata_set_error(STRATA_EINVAL, "cuda_memset: NULL pointer");
    if (bytes) memset(dst, value, bytes);
    return check_launches("cuda_memset");
}

int cuda_stream_create(void **stream) {
    *stream = malloc(1); /* a distinct non-NULL handle */
    if (!*stream) return strata_set_error(STRATA_ENOMEM, "cuda_stream_create");
    std::lock_guard<std::mutex> hold(g_pinned_lock);
    g_live_streams++;
    return STRATA_OK;
}

void cuda_stream_destroy(void *stream) {
    if (!stream) return;
    free(stream);
    std::lock_guard<std::mutex> hold(g_pinned_lock);
    g_live_streams--;
}

int cuda_stream_synchronize(void *stream) {
    (void)stream;
    if (g_capture.active) return spoil("cuda_stream_synchronize");
    return check_launches("cuda_stream_synchronize");
}

int cuda_event_create(void **event) {
    *event = malloc(1); /* a distinct non-NULL handle */
    return *event ? STRATA_OK : strata_set_error(STRATA_ENOMEM, "cuda_event_create");
}

void cuda_event_destroy(void *event) {
    free(event);
}

int cuda_event_record(void *event, void *stream) {
    (void)event, (void)stream;
    return STRATA_OK;
}

int cuda_stream_wait_event(void *stream, void *event) {
    (void)event, (void)stream;
    return STRATA_OK;
}

int cuda_host_alloc(void **ptr, size_t bytes) {
    int rc = cuda_malloc(ptr, bytes);
    if (rc == STRATA_OK) {
        std::lock_guard<std::mutex> hold(g_pinned_lock);
        g_pinned.emplace_back((const char *)*ptr, bytes);
    }
    return rc;
}

void cuda_host_free(void *ptr) {
    if (!ptr) return;
    {
        std::lock_guard<std::mutex> hold(g_pinned_lock);
        for (size_t i = 0; i < g_pinned.size(); ++i)
            if (g_pinned[i].first == ptr) {
                g_pinned.erase(g_pinned.begin() + (long)i);
                break;
            }
    }
    free(ptr);
}

/* The host side of an asynchronous copy of `span` bytes must be pinned. */
static int host_side_pinned(const char *fn, const void *host, size_t span) {
    if (!host || !span || is_pinned(host, span)) return STRATA_OK;
    if (g_capture.active) spoil(fn);
    return strata_set_error(
        STRATA_EDEVICE, "%s: host memory %p (%zu bytes) is not pinned (cuda_cpu)", fn, host, span);
}

/* Asynchronous work: recorded while this thread captures on `stream`, else done now. */
static int queue(void *stream, const char *site, const std::function<void()> &op) {
    if (cucpu_default_stream_misused(stream))
        return strata_set_error(STRATA_EDEVICE,
                                "%s: queued on the legacy default stream while a backend stream "
                                "exists (cuda_cpu)",
                                site);
    const int recorded = cucpu_capture_record(stream, site, op);
    if (recorded < 0)
        return strata_set_error(STRATA_EDEVICE, "%s: the stream is not the capturing one", site);
    if (!recorded) op();
    return check_launches(site);
}

int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                      void *stream) {
    if (bytes && (!dst || !src))
        return strata_set_error(STRATA_EINVAL, "cuda_memcpy_async: NULL pointer");
    const void *host = kind == CUDA_COPY_TO_DEVICE ? src : kind == CUDA_COPY_TO_HOST ? dst : NULL;
    int rc = host_side_pinned("cuda_memcpy_async", host, bytes);
    if (rc) return rc;
    return queue(stream, "memcpy", [=]() {
        if (bytes) memmove(dst, src, bytes);
    });
}

int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cuda_copy_kind kind, void *stream) {
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "cuda_memcpy_2d_async: width %zu > pitch", width);
    if (width && height) {
        const int to_host = kind == CUDA_COPY_TO_HOST;
        const void *host = to_host ? dst : kind == CUDA_COPY_TO_DEVICE ? src : NULL;
        int rc = host_side_pinned("cuda_memcpy_2d_async", host,
                                  (height - 1) * (to_host ? dpitch : spitch) + width);
        if (rc) return rc;
    }
    return queue(stream, "memcpy2d", [=]() {
        for (size_t r = 0; r < height; ++r)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
}

int cuda_memset_async(void *dst, int value, size_t bytes, void *stream) {
    if (bytes && !dst) return strata_set_error(STRATA_EINVAL, "cuda_memset_async: NULL pointer");
    return queue(stream, "memset", [=]() {
        if (bytes) memset(dst, value, bytes);
    });
}

int cuda_graph_capture_begin(void *stream) {
    if (g_capture.active)
        return strata_set_error(STRATA_EDEVICE, "cuda_graph_capture_begin: already capturing");
    g_capture = Capture{};
    g_capture.active = true;
    g_capture.stream = stream;
    return STRATA_OK;
}

int cuda_graph_capture_end(void *stream, void **exec, int *instantiated) {
    if (!g_capture.active || g_capture.stream != stream)
        return strata_set_error(STRATA_EDEVICE,
                                "cuda_graph_capture_end: the stream is not capturing");
    Capture done = std::move(g_capture);
    g_capture = Capture{};
    if (done.spoiled)
        return strata_set_error(STRATA_EDEVICE, "cuda_graph_capture_end: capture invalidated (%s)",
                                done.why.c_str());
    Graph *old = (Graph *)*exec;
    if (old && old->sites == done.graph.sites) { /* cudaGraphExecUpdate: same topology */
        old->ops = std::move(done.graph.ops);
        if (instantiated) *instantiated = 0;
        return STRATA_OK;
    }
    delete old;
    *exec = new Graph(std::move(done.graph));
    if (instantiated) *instantiated = 1;
    return STRATA_OK;
}

void cuda_graph_capture_abort(void *stream) {
    if (g_capture.active && g_capture.stream == stream) g_capture = Capture{};
}

int cuda_graph_launch(void *exec, void *stream) {
    (void)stream;
    if (!exec) return strata_set_error(STRATA_EINVAL, "cuda_graph_launch: no graph");
    if (g_capture.active) return spoil("cuda_graph_launch");
    for (const auto &op : ((Graph *)exec)->ops)
        op();
    return check_launches("cuda_graph_launch");
}

void cuda_graph_exec_destroy(void *exec) {
    delete (Graph *)exec;
}

} // extern "C"
