/* kernels/cuda_device.h on the host, for the kernels' own sources run by the cuda_cpu
 * fiber scheduler (cuda_runtime.h): "device" memory is host memory, every launch and copy
 * completes before its call returns (one in-order stream), so the synchronising calls only
 * report what a launch left in cudaGetLastError. Graphs are not simulated: capture_begin
 * fails with the reason (the emulated backend tests cover graph capture). */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_runtime.h"

extern "C" {
#include "kernels/cuda_device.h"
#include "runtime/base/status.h"
}

/* A launch's failure (bad geometry, a deadlocked barrier) surfaces at the next call, as a
 * kernel fault does on a device. */
static int check_launches(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return strata_set_error(STRATA_EDEVICE, "%s: %s", what, cudaGetErrorString(e));
    return STRATA_OK;
}

extern "C" {

int cuda_device_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "cuda_cpu (the kernels' CUDA source run on the host)");
    return 1;
}

int cuda_malloc(void **ptr, size_t bytes) {
    if (!ptr) return strata_set_error(STRATA_EINVAL, "cuda_malloc: NULL ptr");
    *ptr = calloc(1, bytes ? bytes : 1);
    return *ptr ? STRATA_OK : strata_set_error(STRATA_ENOMEM, "cuda_malloc: %zu bytes", bytes);
}

void cuda_free(void *ptr) {
    free(ptr);
}

static int copy(void *dst, const void *src, size_t bytes, const char *what) {
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
    return check_launches("cuda_synchronize");
}

int cuda_set_device(int index) {
    return index == 0 ? STRATA_OK
                      : strata_set_error(STRATA_EDEVICE, "no CUDA device %d (cuda_cpu has one)", index);
}

int cuda_device_describe(int index, char *buf, size_t cap) {
    if (index != 0) return cuda_set_device(index);
    snprintf(buf, cap, "cuda_cpu (host fibers)");
    return STRATA_OK;
}

int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind) {
    (void)kind;
    if (width > dpitch || width > spitch)
        return strata_set_error(STRATA_EINVAL, "cuda_memcpy_2d: width %zu > pitch", width);
    for (size_t r = 0; r < height; ++r)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return check_launches("cuda_memcpy_2d");
}

int cuda_memset(void *dst, int value, size_t bytes) {
    if (bytes && !dst) return strata_set_error(STRATA_EINVAL, "cuda_memset: NULL pointer");
    if (bytes) memset(dst, value, bytes);
    return check_launches("cuda_memset");
}

int cuda_stream_create(void **stream) {
    *stream = malloc(1); /* a distinct non-NULL handle */
    return *stream ? STRATA_OK : strata_set_error(STRATA_ENOMEM, "cuda_stream_create");
}

void cuda_stream_destroy(void *stream) {
    free(stream);
}

int cuda_stream_synchronize(void *stream) {
    (void)stream;
    return check_launches("cuda_stream_synchronize");
}

int cuda_event_create(void **event) {
    return cuda_stream_create(event);
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
    return cuda_malloc(ptr, bytes);
}

void cuda_host_free(void *ptr) {
    free(ptr);
}

int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                      void *stream) {
    (void)kind, (void)stream;
    return copy(dst, src, bytes, "cuda_memcpy_async");
}

int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cuda_copy_kind kind, void *stream) {
    (void)stream;
    return cuda_memcpy_2d(dst, dpitch, src, spitch, width, height, kind);
}

int cuda_memset_async(void *dst, int value, size_t bytes, void *stream) {
    (void)stream;
    return cuda_memset(dst, value, bytes);
}

int cuda_graph_capture_begin(void *stream) {
    (void)stream;
    return strata_set_error(STRATA_EDEVICE, "cuda_cpu does not simulate CUDA graphs");
}

int cuda_graph_capture_end(void *stream, void **exec, int *instantiated) {
    (void)stream, (void)exec, (void)instantiated;
    return strata_set_error(STRATA_EDEVICE, "cuda_cpu does not simulate CUDA graphs");
}

void cuda_graph_capture_abort(void *stream) {
    (void)stream;
}

int cuda_graph_launch(void *exec, void *stream) {
    (void)exec, (void)stream;
    return strata_set_error(STRATA_EDEVICE, "cuda_cpu does not simulate CUDA graphs");
}

void cuda_graph_exec_destroy(void *exec) {
    (void)exec;
}

} // extern "C"
