/* The device, and device memory, seen from plain C: whether a usable CUDA device is
 * present (tests print "skipped: <reason>" without one), and the allocation, copy and
 * synchronisation calls that tests and the backend-ops harness need to feed the cuda_<op>
 * twins without including CUDA headers. Every int-returning call returns 0 or
 * STRATA_EDEVICE / STRATA_EINVAL with the message in strata_last_error(). */
#ifndef STRATA_KERNELS_CUDA_DEVICE_H
#define STRATA_KERNELS_CUDA_DEVICE_H

#include <stddef.h>

/* 1 when at least one CUDA device can be used; else 0 with the reason in reason[cap]
 * ("no CUDA device (...)" or, in builds without the toolkit, "CUDA toolkit not installed
 * (nvcc not found)"). On success reason holds the device name. */
int cuda_device_available(char *reason, size_t cap);

/* *ptr = `bytes` of device memory (a 0-byte request still returns a freeable pointer). */
int cuda_malloc(void **ptr, size_t bytes);
void cuda_free(void *ptr); /* accepts NULL */

/* Synchronous copies between host and device memory: done when they return (they run on the
 * legacy default stream and wait for it), so kernels on any stream see the bytes. */
int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes);
int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes);

/* Waits for all work on the device; reports a fault of any earlier asynchronous launch. */
int cuda_synchronize(void);

/* Makes device `index` the calling thread's current device (every later allocation,
 * copy and launch of this thread goes to it); STRATA_EDEVICE "no CUDA device N (...)"
 * when it does not exist. */
int cuda_set_device(int index);

/* One line about device `index`: "NVIDIA H100 80GB HBM3 (sm_90), 79.1 GiB, 78.6 GiB free". */
int cuda_device_describe(int index, char *buf, size_t cap);

/* The current device's free and total memory in bytes (cudaMemGetInfo): what a budget given
 * as a share of the free memory is of (the stage backend's KV pool). */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Synchronous copy between two device buffers (done when it returns). */
int cuda_memcpy_on_device(void *dst, const void *src, size_t bytes);

/* The device's copy bandwidth, bytes read + written per second: the best of `rounds`
 * synchronous copies of `bytes` between two buffers it allocates (and frees), after one
 * warm-up copy. The HBM roofline the GPU benchmarks divide by (kernels/cuda_bandwidth.c, in
 * //kernels:cuda_bandwidth: not in kernels/cuda_cpu, where no benchmark runs). */
int cuda_copy_bandwidth(double *bw, size_t bytes, int rounds);

/* Synchronous strided copy of `height` rows of `width` bytes (cudaMemcpy2D); dst/src rows
 * are dpitch/spitch bytes apart. `kind` says where dst and src live. */
enum cuda_copy_kind { CUDA_COPY_TO_DEVICE = 0, CUDA_COPY_TO_HOST = 1, CUDA_COPY_ON_DEVICE = 2 };
int cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, enum cuda_copy_kind kind);

/* Sets `bytes` of device memory to the byte `value`; done when it returns. */
int cuda_memset(void *dst, int value, size_t bytes);

/* ---- Streams, pinned host memory and asynchronous copies (the stage backend's per-call
 * path: one stream per backend, staging buffers in pinned memory, one synchronisation per
 * call). `stream` is a cudaStream_t as a void *; NULL is the legacy default stream. */

/* *stream = a new stream that does not synchronise with the legacy default stream. */
int cuda_stream_create(void **stream);
void cuda_stream_destroy(void *stream); /* accepts NULL */
/* Waits for everything queued on `stream`; reports a fault of any of it. */
int cuda_stream_synchronize(void *stream);

/* Events order work across streams: the work queued on `stream` after
 * cuda_stream_wait_event(stream, e) waits for what preceded cuda_event_record(e, other) on
 * the other stream (timing disabled: ordering only). */
int cuda_event_create(void **event);
void cuda_event_destroy(void *event); /* accepts NULL */
int cuda_event_record(void *event, void *stream);
int cuda_stream_wait_event(void *stream, void *event);

/* *ptr = `bytes` of page-locked host memory (cudaHostAlloc): copies from and to it are
 * truly asynchronous, and a copy from it can be captured into a CUDA graph (a copy from
 * pageable memory cannot). */
int cuda_host_alloc(void **ptr, size_t bytes);
void cuda_host_free(void *ptr); /* accepts NULL */

/* Asynchronous on `stream` (cudaMemcpyAsync, cudaMemcpy2DAsync, cudaMemsetAsync). The host
 * side of a copy must be pinned (cuda_host_alloc) for the call to return before the copy
 * is done, and must stay untouched until the stream is synchronised. */
int cuda_memcpy_async(void *dst, const void *src, size_t bytes, enum cuda_copy_kind kind,
                      void *stream);
int cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cuda_copy_kind kind, void *stream);
int cuda_memset_async(void *dst, int value, size_t bytes, void *stream);

/* ---- CUDA graphs (decode without per-launch overhead). Between capture_begin and
 * capture_end nothing runs: every launch and async copy queued on `stream` by this thread
 * is recorded instead, and any synchronous call (cuda_memcpy_to_host, cuda_malloc,
 * cuda_synchronize, ...) fails and spoils the capture. capture_end turns the recording
 * into an executable graph: when *exec already holds one of the same topology it is
 * updated in place (cudaGraphExecUpdate: new kernel arguments and 1-D copy addresses, no
 * re-instantiation), otherwise *exec is replaced by a new instantiation and *instantiated
 * is set to 1. The graph runs when launched. */
int cuda_graph_capture_begin(void *stream);
int cuda_graph_capture_end(void *stream, void **exec, int *instantiated);
/* Ends a capture after a failed call so the stream is usable again (no error reported). */
void cuda_graph_capture_abort(void *stream);
int cuda_graph_launch(void *exec, void *stream);
void cuda_graph_exec_destroy(void *exec); /* accepts NULL */

#endif
