/* Per-request KV cache slots; see kv_cache.h for the layout. */
#include "reference/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

static size_t slot_floats(const struct kv_cache *kv) {
    return (size_t)(kv->layer_end - kv->layer_start) * (size_t)kv->num_kv_heads *
           (size_t)kv->max_seq * (size_t)kv->head_dim;
}

int kv_cache_init(struct kv_cache *kv, int layer_start, int layer_end, int num_kv_heads,
                  int head_dim, int max_seq, int num_slots) {
    memset(kv, 0, sizeof *kv);
    if (layer_start < 0 || layer_end < layer_start || num_kv_heads <= 0 || head_dim <= 0 ||
        max_seq <= 0 || num_slots <= 0)
        return strata_set_error(STRATA_EINVAL,
                                "kv_cache: invalid shape (layers [%d,%d), kv_heads %d, "
                                "head_dim %d, max_seq %d, slots %d)",
                                layer_start, layer_end, num_kv_heads, head_dim, max_seq, num_slots);
    kv->layer_start = layer_start;
    kv->layer_end = layer_end;
    kv->num_kv_heads = num_kv_heads;
    kv->head_dim = head_dim;
    kv->max_seq = max_seq;
    kv->num_slots = num_slots;
    size_t n = slot_floats(kv) * (size_t)num_slots;
    kv->len = calloc((size_t)num_slots, sizeof *kv->len);
    kv->in_use = calloc((size_t)num_slots, 1);
    /* An owned-layer-free stage (embed/head only) still has valid, empty slots. */
    kv->k = calloc(n ? n : 1, sizeof(float));
    kv->v = calloc(n ? n : 1, sizeof(float));
    if (!kv->len || !kv->in_use || !kv->k || !kv->v) {
        size_t bytes = kv_cache_bytes(kv);
        kv_cache_free(kv);
        return strata_set_error(STRATA_ENOMEM, "kv_cache: cannot allocate %zu bytes", bytes);
    }
    return STRATA_OK;
}

void kv_cache_free(struct kv_cache *kv) {
    if (!kv) return;
    free(kv->len);
    free(kv->in_use);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

size_t kv_cache_bytes(const struct kv_cache *kv) {
    return 2 * slot_floats(kv) * (size_t)kv->num_slots * sizeof(float);
}

int kv_cache_acquire(struct kv_cache *kv, int *slot) {
    for (int s = 0; s < kv->num_slots; ++s) {
        if (!kv->in_use[s]) {
            kv->in_use[s] = 1;
            kv->len[s] = 0;
            *slot = s;
            return STRATA_OK;
        }
    }
    return strata_set_error(STRATA_EBUSY, "kv_cache: all %d slots are in use", kv->num_slots);
}

void kv_cache_release(struct kv_cache *kv, int slot) {
    if (slot < 0 || slot >= kv->num_slots) return;
    kv->in_use[slot] = 0;
    kv->len[slot] = 0;
}

static size_t head_offset(const struct kv_cache *kv, int slot, int layer, int kv_head) {
    size_t per_head = (size_t)kv->max_seq * (size_t)kv->head_dim;
    size_t l = (size_t)(layer - kv->layer_start);
    return (size_t)slot * slot_floats(kv) +
           (l * (size_t)kv->num_kv_heads + (size_t)kv_head) * per_head;
}

float *kv_cache_k(const struct kv_cache *kv, int slot, int layer, int kv_head) {
    return kv->k + head_offset(kv, slot, layer, kv_head);
}

float *kv_cache_v(const struct kv_cache *kv, int slot, int layer, int kv_head) {
    return kv->v + head_offset(kv, slot, layer, kv_head);
}
