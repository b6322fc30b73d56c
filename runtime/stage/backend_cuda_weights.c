/* The CUDA backend's weights: uploaded once at open through the one manifest walk
 * (reference/weight_load.h), whose host-side results this sink copies to the device: a
 * view of the mapping straight from it, a walk's copy (a widening, a transposition, a TP
 * column slice) from a temporary host buffer freed once uploaded. Under TP a rank uploads
 * only its slice of each tensor, so only the slice's bytes of the checkpoint are read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "reference/weight_load.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend_cuda_internal.h"

static int dev_alloc(struct cuda_context *c, void **p, size_t bytes) {
    if (c->n_owned == c->cap_owned) {
        int cap = c->cap_owned ? 2 * c->cap_owned : 64;
        void **grown = realloc(c->owned, (size_t)cap * sizeof *grown);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
        c->owned = grown;
        c->cap_owned = cap;
    }
    int rc = cuda_malloc(p, bytes);
    if (rc) return rc;
    c->owned[c->n_owned++] = *p;
    c->device_weight_bytes += bytes;
    return 0;
}

static int dev_upload(struct cuda_context *c, const void **out, const void *src, size_t bytes) {
    void *p = NULL;
    int rc = dev_alloc(c, &p, bytes);
    if (!rc) rc = cuda_memcpy_to_device(p, src, bytes);
    *out = p;
    return rc;
}

static void *sink_alloc(void *ctx, size_t bytes, int extra) {
    (void)ctx;
    (void)extra;
    return malloc(bytes ? bytes : 1);
}

static void sink_release(void *ctx, void *copy) {
    (void)ctx;
    free(copy);
}

static size_t dtype_bytes(enum ops_dtype dt) {
    return dt == OPS_BF16 ? 2 : 4;
}

/* The sink's context: the device, and the progress (the bytes uploaded so far after each
 * tensor). */
struct upload_progress {
    struct cuda_context *c;
    const struct strata_progress *progress;
    uint64_t done, total;
};

static int sink_matrix(void *ctx, struct ops_weight *w, struct ops_weight host, int copy) {
    *w = (struct ops_weight){NULL, host.dtype, host.rows, host.cols};
    int rc = dev_upload(((struct upload_progress *)ctx)->c, &w->data, host.data,
                        (size_t)host.rows * (size_t)host.cols * dtype_bytes(host.dtype));
    if (copy) free((void *)host.data);
    return rc;
}

static int sink_vector(void *ctx, const float **out, float *host, size_t n) {
    int rc =
        dev_upload(((struct upload_progress *)ctx)->c, (const void **)out, host, n * sizeof(float));
    free(host);
    return rc;
}

static const char upload_phase[] = "uploading to the device";

static void sink_begin(void *ctx, uint64_t total) {
    struct upload_progress *p = ctx;
    p->total = total;
    strata_progress_report(p->progress, 0, total, upload_phase);
}

static void sink_placed(void *ctx, uint64_t bytes, int copied) {
    struct upload_progress *p = ctx;
    (void)copied;
    p->done += bytes;
    strata_progress_report(p->progress, p->done, p->total, upload_phase);
}

int backend_cuda_load_weights(struct cuda_context *c, const struct safetensors *st,
                              const struct strata_progress *progress) {
    struct upload_progress up = {.c = c, .progress = progress};
    const int report = progress && progress->fn;
    const struct weight_sink sink = {.ctx = &up,
                                     .alloc = sink_alloc,
                                     .release = sink_release,
                                     .matrix = sink_matrix,
                                     .vector = sink_vector,
                                     .begin = report ? sink_begin : NULL,
                                     .placed = report ? sink_placed : NULL};
    struct weight_target target = {
        .cfg = c->cfg,
        .role = c->role,
        .shard = c->tp > 1 ? &c->shard : NULL,
        .who = "cuda backend",
        .layers = c->layers,
        .embed = &c->embed,
        .lm_head = &c->lm_head,
        .final_norm = &c->final_norm,
    };
    int rc = weight_load(&target, &sink, st);
    c->weight_bytes += target.weight_bytes;
    c->num_tensors += target.num_tensors;
    return rc;
}
