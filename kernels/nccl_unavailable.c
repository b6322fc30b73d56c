/* kernels/nccl.h for builds without the toolkit (--define=strata_cuda=0): every call
 * reports that CUDA / NCCL is missing, so GPU tests print "skipped: ..." and a CUDA TP group
 * fails with a clear error instead of the build breaking. */
#include <stdio.h>

#include "kernels/nccl.h"
#include "runtime/base/status.h"

static const char *const reason_text = "CUDA toolkit not installed (nvcc not found), so no NCCL";

static int unavailable(const char *fn) {
    return strata_set_error(STRATA_EDEVICE, "%s: %s", fn, reason_text);
}

int cuda_nccl_available(char *reason, size_t cap) {
    if (reason && cap) snprintf(reason, cap, "%s", reason_text);
    return 0;
}

int cuda_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES]) {
    (void)id;
    return unavailable(__func__);
}

int cuda_nccl_comm_init(struct cuda_nccl_comm **out, const uint8_t id[CUDA_NCCL_ID_BYTES], int size,
                        int rank, int timeout_ms, const char *label) {
    (void)id, (void)size, (void)rank, (void)timeout_ms, (void)label;
    if (out) *out = NULL;
    return unavailable(__func__);
}

void cuda_nccl_comm_destroy(struct cuda_nccl_comm *c) {
    (void)c;
}

void cuda_nccl_comm_abort(struct cuda_nccl_comm *c) {
    (void)c;
}

int cuda_nccl_rank(const struct cuda_nccl_comm *c) {
    (void)c;
    return -1;
}

int cuda_nccl_size(const struct cuda_nccl_comm *c) {
    (void)c;
    return 0;
}

int cuda_nccl_allgather(struct cuda_nccl_comm *c, float *out, const float *in, size_t n,
                        void *stream) {
    (void)c, (void)out, (void)in, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_nccl_allreduce_sum2(struct cuda_nccl_comm *c, float *data, size_t n, void *stream) {
    (void)c, (void)data, (void)n, (void)stream;
    return unavailable(__func__);
}

int cuda_nccl_stream_wait(struct cuda_nccl_comm *c, void *stream, int timeout_ms) {
    (void)c, (void)stream, (void)timeout_ms;
    return unavailable(__func__);
}

int cuda_ops_tree_sum(float *out, const float *parts, int count, size_t n, void *stream) {
    (void)out, (void)parts, (void)count, (void)n, (void)stream;
    return unavailable(__func__);
}
