/* The CUDA backend's KV slots (backend_cuda.c has the design): lengths and in-use flags on
 * the host, the cache on the device in reference/kv_cache.h's layout, so a pack or restore
 * is one strided copy per (layer, batch row). The copies are synchronous on the legacy
 * stream, which does not wait for the backend's non-blocking stream: a call that succeeded
 * left that stream idle, and one that failed may not have, so the stream is synchronised
 * first. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/backend_cuda_internal.h"

int backend_cuda_kv_acquire(struct stage_backend *be, int *slot) {
    struct cuda_context *c = ctx(be);
    for (int s = 0; s < be->num_slots; ++s)
        if (!c->in_use[s]) {
            c->in_use[s] = 1;
            c->len[s] = 0;
            *slot = s;
            return 0;
        }
    return strata_set_error(STRATA_EBUSY, "cuda kv: all %d slots are in use", be->num_slots);
}

void backend_cuda_kv_release(struct stage_backend *be, int slot) {
    struct cuda_context *c = ctx(be);
    if (slot < 0 || slot >= be->num_slots) return;
    c->in_use[slot] = 0;
    c->len[slot] = 0;
}

size_t backend_cuda_kv_bytes(const struct stage_backend *be) {
    return 2 * ctx(be)->slot_floats * (size_t)be->num_slots * sizeof(float);
}

/* A KVP rank holds some positions of each slot: its cache is not a handoff of the slot. */
static int check_kvp(const struct cuda_context *c, const char *what) {
    if (c->kvp <= 1) return 0;
    return strata_set_error(STRATA_EINVAL,
                            "%s: a KVP rank holds only positions [%d, %d) of each sequence (no KV "
                            "handoff under KVP)",
                            what, c->kvp_lo, c->kvp_lo + c->kvp_held);
}

static int check_slots(const struct stage_backend *be, const int *slots, int n, const char *what) {
    if (n <= 0 || !slots) return strata_set_error(STRATA_EINVAL, "%s: no slots given", what);
    for (int b = 0; b < n; ++b)
        if (slots[b] < 0 || slots[b] >= be->num_slots || !ctx(be)->in_use[slots[b]])
            return strata_set_error(STRATA_EINVAL, "%s: slot %d is not an in-use slot of the cache",
                                    what, slots[b]);
    return 0;
}

/* The handoff layout (decoder_io.h): [layer][batch][head][seq][D]; the device cache keeps
 * [slot][layer][head][max_seq][D], so one (layer, batch row) is a strided copy of kv_heads
 * rows of len*D floats. */
int backend_cuda_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots,
                         int n) {
    struct cuda_context *c = ctx(be);
    int seq = 0, nkv = c->nkv, D = c->cfg->head_dim, rc;
    memset(out, 0, sizeof *out);
    if ((rc = check_kvp(c, "cuda kv pack")) || (rc = check_slots(be, slots, n, "cuda kv pack")) ||
        (rc = cuda_set_device(c->device)) || (rc = backend_cuda_sync(c)))
        return rc;
    for (int b = 0; b < n; ++b)
        if (c->len[slots[b]] > seq) seq = c->len[slots[b]];
    *out = (struct kv_handoff){.layer_start = c->role.layer_start,
                               .layer_end = c->role.layer_end,
                               .batch = n,
                               .kv_heads = nkv,
                               .seq = seq,
                               .head_dim = D};
    size_t numel = kv_handoff_numel(out);
    float *k = calloc(2 * numel * sizeof(float) + (size_t)n * sizeof(int32_t), 1);
    if (!k)
        return strata_set_error(STRATA_ENOMEM, "cuda kv pack: cannot allocate %zu floats",
                                2 * numel);
    float *v = k + numel;
    int32_t *lengths = (int32_t *)(v + numel);
    size_t row = (size_t)seq * D, cache_row = c->head_floats;
    for (int l = 0; l < c->n_layers && !rc; ++l)
        for (int b = 0; b < n && !rc; ++b) {
            size_t dst = ((size_t)l * n + b) * nkv * row;
            size_t width = (size_t)c->len[slots[b]] * D * sizeof(float);
            int layer = c->role.layer_start + l;
            rc = cuda_memcpy_2d(k + dst, row * 4, k_slot(c, slots[b], layer, 0), cache_row * 4,
                                width, (size_t)nkv, CUDA_COPY_TO_HOST);
            if (!rc)
                rc = cuda_memcpy_2d(v + dst, row * 4, v_slot(c, slots[b], layer, 0), cache_row * 4,
                                    width, (size_t)nkv, CUDA_COPY_TO_HOST);
        }
    if (rc) {
        free(k);
        memset(out, 0, sizeof *out);
        return rc;
    }
    for (int b = 0; b < n; ++b)
        lengths[b] = c->len[slots[b]];
    out->k = k;
    out->v = v;
    out->lengths = lengths;
    out->owned = k;
    return 0;
}

int backend_cuda_kv_restore(struct stage_backend *be, const int *slots, int n,
                            const struct kv_handoff *in) {
    struct cuda_context *c = ctx(be);
    int nkv = c->nkv, D = c->cfg->head_dim, rc;
    if ((rc = check_kvp(c, "kv restore"))) return rc;
    if (in->layer_start != c->role.layer_start || in->layer_end != c->role.layer_end)
        return strata_set_error(
            STRATA_ERANGE, "kv restore: block holds layers [%d, %d) but the cache holds [%d, %d)",
            in->layer_start, in->layer_end, c->role.layer_start, c->role.layer_end);
    if (in->kv_heads != nkv || in->head_dim != D || in->seq < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: block shape [%d, %d, %d, %d, %d] does not fit a cache "
                                "of %d layers, %d kv heads, head_dim %d",
                                in->layer_end - in->layer_start, in->batch, in->kv_heads, in->seq,
                                in->head_dim, c->n_layers, nkv, D);
    if (in->batch != n)
        return strata_set_error(
            STRATA_EINVAL, "kv restore: block has %d batch rows, %d slots given", in->batch, n);
    for (int b = 0; b < n; ++b)
        if (in->lengths[b] < 0 || in->lengths[b] > in->seq || in->lengths[b] > be->max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)in->lengths[b], be->max_seq);
    if ((rc = check_slots(be, slots, n, "kv restore")) || (rc = cuda_set_device(c->device)) ||
        (rc = backend_cuda_sync(c)))
        return rc;
    const uint8_t *k = in->k, *v = in->v;
    size_t row = (size_t)in->seq * D, cache_row = c->head_floats;
    for (int l = 0; l < c->n_layers && !rc; ++l)
        for (int b = 0; b < n && !rc; ++b) {
            size_t src = ((size_t)l * n + b) * nkv * row * sizeof(float);
            size_t width = (size_t)in->lengths[b] * D * sizeof(float);
            int layer = c->role.layer_start + l;
            rc = cuda_memcpy_2d(k_slot(c, slots[b], layer, 0), cache_row * 4, k + src, row * 4,
                                width, (size_t)nkv, CUDA_COPY_TO_DEVICE);
            if (!rc)
                rc = cuda_memcpy_2d(v_slot(c, slots[b], layer, 0), cache_row * 4, v + src, row * 4,
                                    width, (size_t)nkv, CUDA_COPY_TO_DEVICE);
        }
    if (rc) return rc;
    for (int b = 0; b < n; ++b)
        c->len[slots[b]] = in->lengths[b];
    return 0;
}
