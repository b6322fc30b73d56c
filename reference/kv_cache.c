/* Per-request KV cache slots; see kv_cache.h for the layout. */
#include "reference/kv_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/base/status.h"

static size_t slot_floats(const struct kv_cache *kv) {
    return (size_t)(kv->layer_end - kv->layer_start) * (size_t)kv->num_kv_heads *
           (size_t)kv->max_seq * (size_t)kv->head_dim;
}

/* Long-context decode streams a slot's keys and values once per token, as it does the
 * weights: the same advice (reference/weight_arena.h) for the whole 2 MiB pages inside a
 * large calloc, which the allocator maps fresh and the kernel fills on first touch. */
static void advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t first = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t last = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (last > first) madvise((void *)first, last - first, MADV_HUGEPAGE); /* advisory */
#else
    (void)p, (void)bytes;
#endif
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
    advise_huge(kv->k, n * sizeof(float));
    advise_huge(kv->v, n * sizeof(float));
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

/* Both directions copy len x head_dim contiguous floats per (layer, batch row, head): the
 * cache keeps each (slot, layer, head) as [max_seq][head_dim] rows. */
static size_t handoff_offset(const struct kv_handoff *h, int l, int b, int head) {
    return (((size_t)l * h->batch + b) * h->kv_heads + head) * (size_t)h->seq * h->head_dim;
}

static int check_slots(const struct kv_cache *kv, const int *slots, int num_slots,
                       const char *what) {
    if (num_slots <= 0 || !slots)
        return strata_set_error(STRATA_EINVAL, "%s: no slots given", what);
    for (int b = 0; b < num_slots; ++b)
        if (slots[b] < 0 || slots[b] >= kv->num_slots || !kv->in_use[slots[b]])
            return strata_set_error(STRATA_EINVAL, "%s: slot %d is not an in-use slot of the cache",
                                    what, slots[b]);
    return 0;
}

int kv_cache_pack(struct kv_handoff *out, const struct kv_cache *kv, const int *slots,
                  int num_slots) {
    int seq = 0, layers = kv->layer_end - kv->layer_start;
    memset(out, 0, sizeof *out);
    int rc = check_slots(kv, slots, num_slots, "kv pack");
    if (rc < 0) return rc;
    for (int b = 0; b < num_slots; ++b)
        if (kv->len[slots[b]] > seq) seq = kv->len[slots[b]];
    *out = (struct kv_handoff){.layer_start = kv->layer_start,
                               .layer_end = kv->layer_end,
                               .batch = num_slots,
                               .kv_heads = kv->num_kv_heads,
                               .seq = seq,
                               .head_dim = kv->head_dim};
    size_t numel = kv_handoff_numel(out);
    /* One block: k, v, then the lengths (f32 then i32: alignment holds). */
    float *k = calloc(2 * numel * sizeof(float) + (size_t)num_slots * sizeof(int32_t), 1);
    if (!k)
        return strata_set_error(STRATA_ENOMEM, "kv pack: cannot allocate %zu floats", 2 * numel);
    float *v = k + numel;
    int32_t *lengths = (int32_t *)(v + numel);
    for (int l = 0; l < layers; ++l)
        for (int b = 0; b < num_slots; ++b)
            for (int h = 0; h < kv->num_kv_heads; ++h) {
                size_t dst = handoff_offset(out, l, b, h);
                size_t count = (size_t)kv->len[slots[b]] * kv->head_dim * sizeof(float);
                int layer = kv->layer_start + l;
                memcpy(k + dst, kv_cache_k(kv, slots[b], layer, h), count);
                memcpy(v + dst, kv_cache_v(kv, slots[b], layer, h), count);
            }
    for (int b = 0; b < num_slots; ++b)
        lengths[b] = kv->len[slots[b]];
    out->k = k;
    out->v = v;
    out->lengths = lengths;
    out->owned = k;
    return 0;
}

static int check_handoff(const struct kv_cache *kv, int num_slots, const struct kv_handoff *in) {
    if (in->layer_start != kv->layer_start || in->layer_end != kv->layer_end)
        return strata_set_error(
            STRATA_ERANGE, "kv restore: block holds layers [%d, %d) but the cache holds [%d, %d)",
            in->layer_start, in->layer_end, kv->layer_start, kv->layer_end);
    if (in->kv_heads != kv->num_kv_heads || in->head_dim != kv->head_dim || in->seq < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: block shape [%d, %d, %d, %d, %d] does not fit a cache "
                                "of %d layers, %d kv heads, head_dim %d",
                                in->layer_end - in->layer_start, in->batch, in->kv_heads, in->seq,
                                in->head_dim, kv->layer_end - kv->layer_start, kv->num_kv_heads,
                                kv->head_dim);
    if (in->batch != num_slots)
        return strata_set_error(STRATA_EINVAL,
                                "kv restore: block has %d batch rows, %d slots given", in->batch,
                                num_slots);
    for (int b = 0; b < num_slots; ++b)
        if (in->lengths[b] < 0 || in->lengths[b] > in->seq || in->lengths[b] > kv->max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)in->lengths[b], kv->max_seq);
    return 0;
}

int kv_cache_restore(struct kv_cache *kv, const int *slots, int num_slots,
                     const struct kv_handoff *in) {
    int rc = check_handoff(kv, num_slots, in);
    if (rc == 0) rc = check_slots(kv, slots, num_slots, "kv restore");
    if (rc < 0) return rc;
    const uint8_t *k = in->k, *v = in->v;
    for (int l = 0; l < kv->layer_end - kv->layer_start; ++l)
        for (int b = 0; b < num_slots; ++b)
            for (int h = 0; h < kv->num_kv_heads; ++h) {
                size_t src = handoff_offset(in, l, b, h) * sizeof(float);
                size_t count = (size_t)in->lengths[b] * kv->head_dim * sizeof(float);
                int layer = kv->layer_start + l;
                memcpy(kv_cache_k(kv, slots[b], layer, h), k + src, count);
                memcpy(kv_cache_v(kv, slots[b], layer, h), v + src, count);
            }
    for (int b = 0; b < num_slots; ++b)
        kv->len[slots[b]] = in->lengths[b];
    return 0;
}
