/* kernels/cuda_device.h's stream, pinned-memory and graph calls as the CUDA stage backend
 * uses them (runtime/stage/backend_cuda.c): pinned staging in and out with asynchronous
 * copies on one stream; a captured step launched as a graph; the next capture with other
 * kernel arguments and copy addresses updating that graph in place (not instantiated
 * again); a capture of another topology instantiating a new one; a synchronous call inside
 * a capture failing, the capture aborted and the stream usable afterwards; events ordering
 * a second stream's work between two pieces of the first's (the MoE experts' fork / join). The
 * golden backends tests on kernels/cuda_cpu check the backend's use of these calls on the
 * host; this checks that CUDA behaves as cuda_cpu's recordings assume.
 * Prints "skipped: <reason>" without a device. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/vec_add.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

enum { N = 1000 };

/* Queues: x = staged input; x += y (`adds` times); staged output = x. */
static int enqueue_step(float *d_x, const float *d_y, float *h_in, float *h_out, int adds,
                        void *stream) {
    int rc = cuda_memcpy_async(d_x, h_in, N * sizeof(float), CUDA_COPY_TO_DEVICE, stream);
    for (int a = 0; a < adds && !rc; ++a)
        rc = cuda_vec_add(d_x, d_y, N, stream);
    if (!rc) rc = cuda_memcpy_async(h_out, d_x, N * sizeof(float), CUDA_COPY_TO_HOST, stream);
    return rc;
}

/* 1 when h_out[i] == h_in[i] + adds * y_value for all i. */
static int result_is(const float *h_in, const float *h_out, int adds, float y_value) {
    for (int i = 0; i < N; ++i) {
        float want = h_in[i];
        for (int a = 0; a < adds; ++a)
            want += y_value;
        if (h_out[i] != want) return 0;
    }
    return 1;
}

/* One captured step: capture, end (update or instantiate), launch, synchronise. */
static int graph_step(void **exec, int *instantiated, float *d_x, const float *d_y, float *h_in,
                      float *h_out, int adds, void *stream) {
    int rc = cuda_graph_capture_begin(stream);
    if (!rc && (rc = enqueue_step(d_x, d_y, h_in, h_out, adds, stream))) {
        cuda_graph_capture_abort(stream);
        return rc;
    }
    if (!rc) rc = cuda_graph_capture_end(stream, exec, instantiated);
    if (!rc) rc = cuda_graph_launch(*exec, stream);
    if (!rc) rc = cuda_stream_synchronize(stream);
    return rc;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    void *stream = NULL, *exec = NULL;
    float *h_in = NULL, *h_out = NULL, *h_out2 = NULL, *d_x = NULL, *d_y1 = NULL, *d_y2 = NULL;
    float ones[N], twos[N];
    int failures = 0, inst = -1;
    int rc = cuda_stream_create(&stream);
    if (!rc) rc = cuda_host_alloc((void **)&h_in, N * sizeof(float));
    if (!rc) rc = cuda_host_alloc((void **)&h_out, N * sizeof(float));
    if (!rc) rc = cuda_host_alloc((void **)&h_out2, N * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_x, N * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_y1, N * sizeof(float));
    if (!rc) rc = cuda_malloc((void **)&d_y2, N * sizeof(float));
    for (int i = 0; i < N; ++i)
        ones[i] = 1.0f, twos[i] = 2.0f;
    if (!rc) rc = cuda_memcpy_to_device(d_y1, ones, sizeof ones);
    if (!rc) rc = cuda_memcpy_to_device(d_y2, twos, sizeof twos);
    if (failures += kernel_test_check(rc == 0, "stream, pinned buffers, device buffers")) return 1;
    for (int i = 0; i < N; ++i)
        h_in[i] = (float)i;

    rc = enqueue_step(d_x, d_y1, h_in, h_out, 1, stream);
    if (!rc) rc = cuda_stream_synchronize(stream);
    failures +=
        kernel_test_check(!rc && result_is(h_in, h_out, 1, 1.0f), "eager step, async copies");

    rc = graph_step(&exec, &inst, d_x, d_y1, h_in, h_out, 1, stream);
    failures += kernel_test_check(!rc && inst == 1 && result_is(h_in, h_out, 1, 1.0f),
                                  "first capture instantiates and computes the step");
    for (int i = 0; i < N; ++i)
        h_in[i] = (float)(3 * i);
    rc = graph_step(&exec, &inst, d_x, d_y2, h_in, h_out2, 1, stream);
    failures +=
        kernel_test_check(!rc && inst == 0 && result_is(h_in, h_out2, 1, 2.0f),
                          "new kernel argument and copy address: updated in place, new result");
    rc = graph_step(&exec, &inst, d_x, d_y1, h_in, h_out, 3, stream);
    failures += kernel_test_check(!rc && inst == 1 && result_is(h_in, h_out, 3, 1.0f),
                                  "another topology: instantiated again");

    rc = cuda_graph_capture_begin(stream);
    if (!rc) rc = cuda_vec_add(d_x, d_y1, N, stream);
    int spoiled = !rc && cuda_memcpy_to_host(ones, d_x, sizeof ones) != 0;
    void *spoiled_exec = NULL;
    int spoiled_inst = 0;
    int end_fails = spoiled && cuda_graph_capture_end(stream, &spoiled_exec, &spoiled_inst) != 0 &&
                    !spoiled_exec;
    cuda_graph_capture_abort(stream); /* still capturing where the copy was not refused */
    failures += kernel_test_check(spoiled && end_fails,
                                  "a synchronous copy inside a capture fails, and so does its end");
    rc = enqueue_step(d_x, d_y2, h_in, h_out, 2, stream);
    if (!rc) rc = cuda_stream_synchronize(stream);
    failures += kernel_test_check(!rc && result_is(h_in, h_out, 2, 2.0f),
                                  "the stream works after the abort");

    /* Fork / join as the MoE experts do: a second stream waits for the first one's event,
     * adds, records; the first waits for that before copying out. */
    void *other = NULL, *fork = NULL, *join = NULL;
    rc = cuda_stream_create(&other);
    if (!rc) rc = cuda_event_create(&fork);
    if (!rc) rc = cuda_event_create(&join);
    if (!rc) rc = cuda_memcpy_async(d_x, h_in, N * sizeof(float), CUDA_COPY_TO_DEVICE, stream);
    if (!rc) rc = cuda_event_record(fork, stream);
    if (!rc) rc = cuda_stream_wait_event(other, fork);
    if (!rc) rc = cuda_vec_add(d_x, d_y2, N, other);
    if (!rc) rc = cuda_event_record(join, other);
    if (!rc) rc = cuda_stream_wait_event(stream, join);
    if (!rc) rc = cuda_vec_add(d_x, d_y1, N, stream);
    if (!rc) rc = cuda_memcpy_async(h_out, d_x, N * sizeof(float), CUDA_COPY_TO_HOST, stream);
    if (!rc) rc = cuda_stream_synchronize(stream);
    int forked = 1;
    for (int i = 0; !rc && i < N; ++i)
        forked &= h_out[i] == (h_in[i] + 2.0f) + 1.0f;
    failures +=
        kernel_test_check(!rc && forked, "events order work across two streams (fork / join)");
    cuda_event_destroy(fork), cuda_event_destroy(join);
    cuda_stream_destroy(other);

    cuda_graph_exec_destroy(exec);
    cuda_free(d_x), cuda_free(d_y1), cuda_free(d_y2);
    cuda_host_free(h_in), cuda_host_free(h_out), cuda_host_free(h_out2);
    cuda_stream_destroy(stream);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
