/* The CUDA backend of the harness: device memory from kernels/cuda_device.h and one row per
 * kernels/ twin. In builds without the toolkit these resolve to kernels/cuda_unavailable.c,
 * whose cuda_device_available gives the reason the backend is skipped. */
#include "kernels/cuda_device.h"
#include "kernels/rmsnorm.h"
#include "kernels/softmax.h"
#include "kernels/swiglu.h"
#include "kernels/vec_add.h"
#include "tests/backend_ops/backend_ops.h"

/* Adapters: the reference call of op_cases.c with cuda_ in front and the stream last. */
static int run_rmsnorm(const struct bo_call *c, void *stream) {
    return cuda_rmsnorm(c->buf[0], c->buf[1], c->buf[2], c->s->eps, c->s->n, c->s->dim, stream);
}

static int run_swiglu(const struct bo_call *c, void *stream) {
    return cuda_swiglu(c->buf[0], c->buf[1], c->buf[2], c->s->n, stream);
}

static int run_softmax(const struct bo_call *c, void *stream) {
    return cuda_softmax(c->buf[0], c->s->n, stream);
}

static int run_vec_add(const struct bo_call *c, void *stream) {
    return cuda_vec_add(c->buf[0], c->buf[1], c->s->n, stream);
}

static const struct bo_backend_op cuda_ops[] = {
    {"rmsnorm", run_rmsnorm},
    {"swiglu", run_swiglu},
    {"softmax", run_softmax},
    {"vec_add", run_vec_add},
};

const struct bo_backend bo_backend_cuda = {
    .name = "cuda",
    .available = cuda_device_available,
    .alloc = cuda_malloc,
    .free = cuda_free,
    .upload = cuda_memcpy_to_device,
    .download = cuda_memcpy_to_host,
    .synchronize = cuda_synchronize,
    .ops = cuda_ops,
    .n_ops = sizeof cuda_ops / sizeof cuda_ops[0],
};
