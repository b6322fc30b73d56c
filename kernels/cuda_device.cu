/* cuda_device.h for builds with the CUDA toolkit: thin wrappers over the CUDA runtime that
 * turn its errors into Strata statuses. */
#include <stdio.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/cuda_device.h"
}

/* The header's promise that a synchronous call inside a graph capture fails and spoils it,
 * kept here rather than left to the driver: CUDA 13 on an H200 ran a cudaMemcpy to the host
 * on the legacy stream while this thread captured a non-blocking stream (it refuses only
 * calls that touch the capturing stream), and the copy would have read bytes that the graph
 * had not yet written. Per thread, as the capture mode is (each backend captures on its own
 * thread). */
static thread_local bool capturing, capture_spoiled;

#define REFUSE_IN_CAPTURE(name)                                                                    \
    do {                                                                                           \
        if (capturing) {                                                                           \
            capture_spoiled = true;                                                                \
            return strata_set_error(STRATA_EDEVICE,                                                \
                                    "%s: a synchronous call inside a CUDA graph capture", name);   \
        }                                                                                          \
    } while (0)

extern "C" int cuda_device_available(char *reason, size_t cap) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (reason && cap)
            snprintf(reason, cap, "no CUDA device (%s)",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        return 0;
    }
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        if (reason && cap) snprintf(reason, cap, "no CUDA device (%s)", cudaGetErrorString(err));
        return 0;
    }
    if (reason && cap) snprintf(reason, cap, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
    return 1;
}

extern "C" int cuda_malloc(void **ptr, size_t bytes) {
    REFUSE_IN_CAPTURE("cuda_malloc");
    if (!ptr) return strata_set_error(STRATA_EINVAL, "cuda_malloc: ptr is NULL");
    *ptr = NULL;
    /* cudaMalloc(0) may hand back NULL; callers treat NULL as "allocation failed". */
    CUDA_CHECK_RETURN(cudaMalloc(ptr, bytes ? bytes : 1));
    return STRATA_OK;
}

extern "C" void cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

/* cudaMemcpy from pageable host memory to the device, and cudaMemset / device-to-device
 * copies, may return before the device has finished them: they run on the legacy default
 * stream, which the backends' own streams (cudaStreamNonBlocking) are not ordered after.
 * Waiting for the legacy stream makes them done when these functions return, as the header
 * promises, so a kernel on any stream that reads the bytes next sees them. */
static int legacy_done(void) {
    CUDA_CHECK_RETURN(cudaStreamSynchronize(cudaStreamLegacy));
    return STRATA_OK;
}

extern "C" int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    REFUSE_IN_CAPTURE("cuda_memcpy_to_device");
    if (!bytes) return STRATA_OK;
    CUDA_CHECK_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return legacy_done();
}

extern "C" int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    REFUSE_IN_CAPTURE("cuda_memcpy_to_host");
    if (bytes) CUDA_CHECK_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return STRATA_OK;
}

extern "C" int cuda_synchronize(void) {
    REFUSE_IN_CAPTURE("cuda_synchronize");
    CUDA_CHECK_RETURN(cudaDeviceSynchronize());
    return STRATA_OK;
}

extern "C" int cuda_set_device(int index) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return strata_set_error(STRATA_EDEVICE, "no CUDA device %d (%s)", index,
                                cudaGetErrorString(err));
    if (index < 0 || index >= count)
        return strata_set_error(STRATA_EDEVICE, "no CUDA device %d (this machine has %d)", index,
                                count);
    CUDA_CHECK_RETURN(cudaSetDevice(index));
    return STRATA_OK;
}

extern "C" int cuda_device_describe(int index, char *buf, size_t cap) {
    cudaDeviceProp prop;
    size_t free_bytes = 0, total_bytes = 0;
    int rc = cuda_set_device(index);
    if (rc) return rc;
    CUDA_CHECK_RETURN(cudaGetDeviceProperties(&prop, index));
    CUDA_CHECK_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (buf && cap)
        snprintf(buf, cap, "%s (sm_%d%d), %.1f GiB, %.1f GiB free", prop.name, prop.major,
                 prop.minor, (double)total_bytes / (1 << 30), (double)free_bytes / (1 << 30));
    return STRATA_OK;
}

extern "C" int cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    size_t f = 0, t = 0;
    CUDA_CHECK_RETURN(cudaMemGetInfo(&f, &t));
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return STRATA_OK;
}

extern "C" int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes) {
    REFUSE_IN_CAPTURE("cuda_memcpy_on_device");
    if (!bytes) return STRATA_OK;
    CUDA_CHECK_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    return legacy_done();
}

extern "C" int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cuda_copy_kind kind) {
    REFUSE_IN_CAPTURE("cuda_memcpy_2d");
    if (!width || !height) return STRATA_OK;
    cudaMemcpyKind k = kind == CUDA_COPY_TO_DEVICE ? cudaMemcpyHostToDevice
                       : kind == CUDA_COPY_TO_HOST ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
    CUDA_CHECK_RETURN(cudaMemcpy2D(dst, dpitch, src, spitch, width, height, k));
    return kind == CUDA_COPY_TO_HOST ? STRATA_OK : legacy_done();
}

extern "C" int cuda_memset(void *dst, int value, size_t bytes) {
    REFUSE_IN_CAPTURE("cuda_memset");
    if (!bytes) return STRATA_OK;
    CUDA_CHECK_RETURN(cudaMemset(dst, value, bytes));
    return legacy_done();
}

/* ---------------------------------------------------------------- streams, pinned, async */

static cudaMemcpyKind copy_kind(enum cuda_copy_kind kind) {
    return kind == CUDA_COPY_TO_DEVICE ? cudaMemcpyHostToDevice
           : kind == CUDA_COPY_TO_HOST ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
}

extern "C" int cuda_stream_create(void **stream) {
    if (!stream) return strata_set_error(STRATA_EINVAL, "cuda_stream_create: stream is NULL");
    cudaStream_t s = NULL;
    /* Non-blocking: the legacy default stream (synchronous copies elsewhere in the
     * process) never waits for this stream's work or makes it wait. */
    CUDA_CHECK_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (void *)s;
    return STRATA_OK;
}

extern "C" void cuda_stream_destroy(void *stream) {
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int cuda_stream_synchronize(void *stream) {
    REFUSE_IN_CAPTURE("cuda_stream_synchronize");
    CUDA_CHECK_RETURN(cudaStreamSynchronize((cudaStream_t)stream));
    return STRATA_OK;
}

extern "C" int cuda_event_create(void **event) {
    if (!event) return strata_set_error(STRATA_EINVAL, "cuda_event_create: event is NULL");
    cudaEvent_t e = NULL;
    CUDA_CHECK_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *event = (void *)e;
    return STRATA_OK;
}

extern "C" void cuda_event_destroy(void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

extern "C" int cuda_event_record(void *event, void *stream) {
    CUDA_CHECK_RETURN(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    return STRATA_OK;
}

extern "C" int cuda_stream_wait_event(void *stream, void *event) {
    CUDA_CHECK_RETURN(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return STRATA_OK;
}

extern "C" int cuda_host_alloc(void **ptr, size_t bytes) {
    if (!ptr) return strata_set_error(STRATA_EINVAL, "cuda_host_alloc: ptr is NULL");
    *ptr = NULL;
    CUDA_CHECK_RETURN(cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocDefault));
    return STRATA_OK;
}

extern "C" void cuda_host_free(void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

extern "C" int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                                 void *stream) {
    if (bytes)
        CUDA_CHECK_RETURN(cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), (cudaStream_t)stream));
    return STRATA_OK;
}

extern "C" int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch,
                                    size_t width, size_t height, enum cuda_copy_kind kind,
                                    void *stream) {
    if (!width || !height) return STRATA_OK;
    CUDA_CHECK_RETURN(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, copy_kind(kind),
                                        (cudaStream_t)stream));
    return STRATA_OK;
}

extern "C" int cuda_memset_async(void *dst, int value, size_t bytes, void *stream) {
    if (bytes) CUDA_CHECK_RETURN(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream));
    return STRATA_OK;
}

/* ---------------------------------------------------------------- graphs */

extern "C" int cuda_graph_capture_begin(void *stream) {
    if (!stream)
        return strata_set_error(STRATA_EINVAL, "cuda_graph_capture_begin: the default stream "
                                               "cannot be captured");
    /* Thread-local: another thread's (another backend's) calls are not affected, and a
     * synchronous call of this thread fails instead of silently running outside the graph. */
    CUDA_CHECK_RETURN(
        cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
    capturing = true;
    capture_spoiled = false;
    return STRATA_OK;
}

extern "C" void cuda_graph_capture_abort(void *stream) {
    capturing = capture_spoiled = false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (!stream || cudaStreamIsCapturing((cudaStream_t)stream, &status) != cudaSuccess ||
        status == cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return;
    }
    cudaGraph_t graph = NULL;
    cudaStreamEndCapture((cudaStream_t)stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError(); /* the failure was reported by the call that spoiled the capture */
}

extern "C" int cuda_graph_capture_end(void *stream, void **exec, int *instantiated) {
    cudaGraph_t graph = NULL;
    if (!exec || !instantiated) {
        cuda_graph_capture_abort(stream);
        return strata_set_error(STRATA_EINVAL, "cuda_graph_capture_end: NULL argument");
    }
    *instantiated = 0;
    if (capture_spoiled) {
        cuda_graph_capture_abort(stream);
        return strata_set_error(STRATA_EDEVICE, "cuda_graph_capture_end: a synchronous call "
                                                "inside the capture spoiled it");
    }
    capturing = false;
    CUDA_CHECK_RETURN(cudaStreamEndCapture((cudaStream_t)stream, &graph));
    cudaError_t err = cudaErrorGraphExecUpdateFailure;
    if (*exec) {
        cudaGraphExecUpdateResultInfo info;
        err = cudaGraphExecUpdate((cudaGraphExec_t)*exec, graph, &info);
        if (err != cudaSuccess) cudaGetLastError(); /* not an error: instantiate below */
    }
    if (err != cudaSuccess) {
        if (*exec) cudaGraphExecDestroy((cudaGraphExec_t)*exec);
        *exec = NULL;
        cudaGraphExec_t fresh = NULL;
        err = cudaGraphInstantiate(&fresh, graph, 0);
        if (err == cudaSuccess) {
            *exec = (void *)fresh;
            *instantiated = 1;
        }
    }
    cudaGraphDestroy(graph);
    if (err != cudaSuccess)
        return strata_set_error(STRATA_EDEVICE, "cuda_graph_capture_end: instantiate: %s",
                                cudaGetErrorString(err));
    return STRATA_OK;
}

extern "C" int cuda_graph_launch(void *exec, void *stream) {
    REFUSE_IN_CAPTURE("cuda_graph_launch");
    if (!exec) return strata_set_error(STRATA_EINVAL, "cuda_graph_launch: no graph");
    CUDA_CHECK_RETURN(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream));
    return STRATA_OK;
}

extern "C" void cuda_graph_exec_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
