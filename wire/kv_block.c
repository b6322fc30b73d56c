/* KV pack/restore between a reference kv_cache and the KvBlock wire layout
 * [L, B, kv_heads, S, head_dim]; see kv_block.h. The cache stores each (slot, layer, head)
 * as [max_seq][head_dim] rows, so both directions copy len x head_dim contiguous floats
 * per (layer, batch row, head). */
#include "wire/kv_block.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

static void describe_tensor(struct wire_tensor *t, const float *data, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    t->defined = 1;
    t->dtype = WIRE_DTYPE_F32;
    t->codec = WIRE_CODEC_NONE;
    t->ndim = 5;
    size_t numel = 1;
    for (int i = 0; i < 5; ++i) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->data = data;
    t->nbytes = numel * sizeof(float);
}

int wire_kv_pack(struct wire_kv_pack *pack, const struct kv_cache *kv, const int *slots,
                 int num_slots) {
    memset(pack, 0, sizeof *pack);
    int rc = 0;
    if (num_slots <= 0 || !slots) return strata_set_error(STRATA_EINVAL, "kv pack: no slots given");
    int seq = 0;
    for (int b = 0; b < num_slots; ++b) {
        if (slots[b] < 0 || slots[b] >= kv->num_slots || !kv->in_use[slots[b]])
            return strata_set_error(
                STRATA_EINVAL, "kv pack: slot %d is not an in-use slot of the cache", slots[b]);
        if (kv->len[slots[b]] > seq) seq = kv->len[slots[b]];
    }
    int layers = kv->layer_end - kv->layer_start;
    const int64_t shape[5] = {layers, num_slots, kv->num_kv_heads, seq, kv->head_dim};
    size_t numel = (size_t)layers * (size_t)num_slots * (size_t)kv->num_kv_heads * (size_t)seq *
                   (size_t)kv->head_dim;
    size_t row = (size_t)kv->head_dim;
    pack->k = calloc(numel ? numel : 1, sizeof(float));
    pack->v = calloc(numel ? numel : 1, sizeof(float));
    pack->lengths = calloc((size_t)num_slots, sizeof(int32_t));
    if (!pack->k || !pack->v || !pack->lengths) {
        rc = strata_set_error(STRATA_ENOMEM, "kv pack: cannot allocate %zu floats", 2 * numel);
        goto fail;
    }
    for (int l = 0; l < layers; ++l)
        for (int b = 0; b < num_slots; ++b)
            for (int h = 0; h < kv->num_kv_heads; ++h) {
                size_t dst = (((size_t)l * num_slots + b) * kv->num_kv_heads + h) * seq * row;
                size_t count = (size_t)kv->len[slots[b]] * row;
                int layer = kv->layer_start + l;
                memcpy(pack->k + dst, kv_cache_k(kv, slots[b], layer, h), count * sizeof(float));
                memcpy(pack->v + dst, kv_cache_v(kv, slots[b], layer, h), count * sizeof(float));
            }
    for (int b = 0; b < num_slots; ++b)
        pack->lengths[b] = kv->len[slots[b]];
    pack->block.layer_start = kv->layer_start;
    pack->block.layer_end = kv->layer_end;
    pack->block.lengths = pack->lengths;
    pack->block.num_lengths = (size_t)num_slots;
    describe_tensor(&pack->block.k, pack->k, shape);
    describe_tensor(&pack->block.v, pack->v, shape);
    return 0;
fail:
    wire_kv_pack_free(pack);
    return rc;
}

void wire_kv_pack_free(struct wire_kv_pack *pack) {
    if (!pack) return;
    free(pack->k);
    free(pack->v);
    free(pack->lengths);
    memset(pack, 0, sizeof *pack);
}

int wire_kv_restore(struct kv_cache *kv, const int *slots, int num_slots,
                    const struct wire_kv_block *block) {
    const struct wire_tensor *k = &block->k, *v = &block->v;
    if (block->layer_start != kv->layer_start || block->layer_end != kv->layer_end)
        return strata_set_error(
            STRATA_ERANGE, "kv restore: block holds layers [%d, %d) but the cache holds [%d, %d)",
            (int)block->layer_start, (int)block->layer_end, kv->layer_start, kv->layer_end);
    if (!k->defined || !v->defined || k->ndim != 5 || v->ndim != 5)
        return strata_set_error(STRATA_EFORMAT, "kv restore: block has no 5-D k and v tensors");
    if (k->dtype != WIRE_DTYPE_F32 || k->codec != WIRE_CODEC_NONE || v->dtype != WIRE_DTYPE_F32 ||
        v->codec != WIRE_CODEC_NONE)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: k/v are %s/%s, %s/%s; an exact restore needs f32/none",
                                wire_dtype_name(k->dtype), wire_codec_name(k->codec),
                                wire_dtype_name(v->dtype), wire_codec_name(v->codec));
    int64_t layers = kv->layer_end - kv->layer_start;
    if (k->shape[0] != layers || k->shape[2] != kv->num_kv_heads || k->shape[4] != kv->head_dim ||
        memcmp(k->shape, v->shape, sizeof k->shape) != 0)
        return strata_set_error(
            STRATA_EFORMAT,
            "kv restore: block shape [%lld, %lld, %lld, %lld, %lld] does not fit a cache of "
            "%lld layers, %d kv heads, head_dim %d",
            (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
            (long long)k->shape[3], (long long)k->shape[4], (long long)layers, kv->num_kv_heads,
            kv->head_dim);
    if (k->shape[1] != num_slots || block->num_lengths != (size_t)num_slots)
        return strata_set_error(STRATA_EINVAL,
                                "kv restore: block has %lld batch rows, %d slots given",
                                (long long)k->shape[1], num_slots);
    int64_t seq = k->shape[3];
    for (int b = 0; b < num_slots; ++b) {
        if (slots[b] < 0 || slots[b] >= kv->num_slots || !kv->in_use[slots[b]])
            return strata_set_error(STRATA_EINVAL, "kv restore: slot %d is not an in-use slot",
                                    slots[b]);
        if (block->lengths[b] < 0 || block->lengths[b] > seq || block->lengths[b] > kv->max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)block->lengths[b], kv->max_seq);
    }
    size_t row = (size_t)kv->head_dim;
    const uint8_t *k_bytes = k->data, *v_bytes = v->data;
    for (int l = 0; l < layers; ++l)
        for (int b = 0; b < num_slots; ++b)
            for (int h = 0; h < kv->num_kv_heads; ++h) {
                size_t src =
                    (((size_t)l * num_slots + b) * kv->num_kv_heads + h) * (size_t)seq * row;
                size_t count = (size_t)block->lengths[b] * row;
                int layer = kv->layer_start + l;
                memcpy(kv_cache_k(kv, slots[b], layer, h), k_bytes + src * sizeof(float),
                       count * sizeof(float));
                memcpy(kv_cache_v(kv, slots[b], layer, h), v_bytes + src * sizeof(float),
                       count * sizeof(float));
            }
    for (int b = 0; b < num_slots; ++b)
        kv->len[slots[b]] = block->lengths[b];
    return 0;
}
