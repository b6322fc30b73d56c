/* The stream-capture state of the host emulation of kernels/nccl.h (nccl_emulated.c), so that
 * an NCCL collective queued inside a captured decode step is held to the rules a kernel
 * launch is (kernels/cuda_cpu holds its launches to them). Per thread,
 * as CUDA's cudaStreamCaptureModeThreadLocal (kernels/cuda_device.cu's mode): the ranks of a
 * TP / KVP group are threads of one process, each capturing its own stream at once.
 *
 * The rules (what a device enforces, or what the backend's graphs rely on):
 *   - while a thread captures a stream, every launch, copy and collective it queues goes to
 *     that stream (counted as one graph node);
 *   - a call that waits on the host or is synchronous (cudaStreamSynchronize, a blocking
 *     copy, malloc, ncclCommInit, the NCCL group's stream wait) fails and spoils the
 *     capture (cudaErrorStreamCaptureUnsupported), so capture_end fails too.
 * Every function returns 0 or a negative STRATA_E* with the message set. */
#ifndef STRATA_TESTS_BACKEND_OPS_EMULATED_CAPTURE_H
#define STRATA_TESTS_BACKEND_OPS_EMULATED_CAPTURE_H

/* Starts capturing `stream` on this thread; refused when this thread already captures. */
int emulated_capture_begin(void *stream);
/* Stops capturing `stream` (when it is this thread's) without a graph. */
void emulated_capture_abort(void *stream);
/* Stops capturing `stream`: *nodes = the operations recorded; STRATA_EDEVICE when this
 * thread was not capturing it or a call spoiled the capture. */
int emulated_capture_end(void *stream, int *nodes);
/* An asynchronous operation `fn` queued on `stream`: when this thread captures, `stream`
 * must be the captured one (else the capture is spoiled) and the operation is a node. */
int emulated_capture_enqueue(const char *fn, void *stream);
/* A synchronous call `fn`: refused (and the capture spoiled) while this thread captures. */
int emulated_capture_sync(const char *fn);
/* rc, after spoiling this thread's capture if there is one (a failed call inside it). */
int emulated_capture_spoil(int rc);
/* 1 while this thread captures. */
int emulated_capturing(void);

#endif
