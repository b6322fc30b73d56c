/* KvBlock <-> kv_handoff; see kv_block.h. */
#include "runtime/stage/kv_block.h"

#include <string.h>

#include "runtime/base/status.h"

static void describe_tensor(struct wire_tensor *t, const void *data, const struct kv_handoff *h) {
    const int64_t shape[5] = {h->layer_end - h->layer_start, h->batch, h->kv_heads, h->seq,
                              h->head_dim};
    memset(t, 0, sizeof *t);
    t->defined = 1;
    t->dtype = WIRE_DTYPE_F32;
    t->codec = WIRE_CODEC_NONE;
    t->ndim = 5;
    memcpy(t->shape, shape, sizeof shape);
    t->data = data;
    t->nbytes = kv_handoff_numel(h) * sizeof(float);
}

void kv_block_from_handoff(struct wire_kv_block *msg, const struct kv_handoff *h) {
    memset(msg, 0, sizeof *msg);
    msg->layer_start = h->layer_start;
    msg->layer_end = h->layer_end;
    msg->stored_dtype = h->stored_dtype;
    msg->lengths = h->lengths;
    msg->num_lengths = (size_t)h->batch;
    describe_tensor(&msg->k, h->k, h);
    describe_tensor(&msg->v, h->v, h);
}

int kv_block_to_handoff(struct kv_handoff *h, const struct wire_kv_block *msg) {
    const struct wire_tensor *k = &msg->k, *v = &msg->v;
    memset(h, 0, sizeof *h);
    if (!k->defined || !v->defined || k->ndim != 5 || v->ndim != 5)
        return strata_set_error(STRATA_EFORMAT, "kv restore: block has no 5-D k and v tensors");
    if (k->dtype != WIRE_DTYPE_F32 || k->codec != WIRE_CODEC_NONE || v->dtype != WIRE_DTYPE_F32 ||
        v->codec != WIRE_CODEC_NONE)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: k/v are %s/%s, %s/%s; an exact restore needs f32/none",
                                wire_dtype_name(k->dtype), wire_codec_name(k->codec),
                                wire_dtype_name(v->dtype), wire_codec_name(v->codec));
    if (memcmp(k->shape, v->shape, sizeof k->shape) != 0 ||
        k->shape[0] != (int64_t)msg->layer_end - msg->layer_start || k->shape[1] < 1 ||
        k->shape[2] < 1 || k->shape[3] < 0 || k->shape[4] < 1 || k->shape[1] > (1 << 20) ||
        k->shape[2] > (1 << 20) || k->shape[3] > (1 << 30) || k->shape[4] > (1 << 20) ||
        (size_t)k->shape[1] != msg->num_lengths)
        return strata_set_error(
            STRATA_EFORMAT,
            "kv restore: block shape [%lld, %lld, %lld, %lld, %lld] (v [%lld, ...]) does not "
            "match its layer range [%d, %d) and %zu lengths",
            (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
            (long long)k->shape[3], (long long)k->shape[4], (long long)v->shape[0],
            (int)msg->layer_start, (int)msg->layer_end, msg->num_lengths);
    *h = (struct kv_handoff){.layer_start = msg->layer_start,
                             .layer_end = msg->layer_end,
                             .stored_dtype = msg->stored_dtype,
                             .batch = (int)k->shape[1],
                             .kv_heads = (int)k->shape[2],
                             .seq = (int)k->shape[3],
                             .head_dim = (int)k->shape[4],
                             .lengths = msg->lengths,
                             .k = k->data,
                             .v = v->data};
    size_t want = kv_handoff_numel(h) * sizeof(float);
    if (k->nbytes != want || v->nbytes != want) {
        memset(h, 0, sizeof *h);
        return strata_set_error(STRATA_EFORMAT, "kv restore: k/v hold %zu/%zu bytes, not %zu",
                                k->nbytes, v->nbytes, want);
    }
    return 0;
}
