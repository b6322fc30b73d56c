/* Per-request KV cache slots; see kv_cache.h for the layout. */
#include "reference/kv_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

size_t kv_cache_block_floats(int layers, int num_kv_heads, int head_dim) {
    return (size_t)(layers > 0 ? layers : 0) * (size_t)num_kv_heads * KV_BLOCK * (size_t)head_dim;
}

static size_t block_floats(const struct kv_cache *kv) {
    return kv_cache_block_floats(kv->layer_end - kv->layer_start, kv->num_kv_heads, kv->head_dim);
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

int kv_dtype_parse(const char *text, enum ops_dtype *out) {
    static const struct {
        const char *name;
        enum ops_dtype dtype;
    } known[] = {{"f32", OPS_F32}, {"bf16", OPS_BF16}, {"f16", OPS_F16}};
    for (size_t i = 0; text && i < sizeof known / sizeof *known; ++i)
        if (!strcmp(text, known[i].name)) {
            *out = known[i].dtype;
            return 0;
        }
    return strata_set_error(STRATA_EINVAL, "KV dtype '%s': expected f32, bf16 or f16",
                            text ? text : "");
}

const char *kv_dtype_name(enum ops_dtype dtype) {
    return dtype == OPS_F32 ? "f32" : dtype == OPS_BF16 ? "bf16" : dtype == OPS_F16 ? "f16" : "?";
}

static size_t elem(const struct kv_cache *kv) {
    return ops_kv_elem_bytes(kv->dtype);
}

int kv_cache_init(struct kv_cache *kv, int layer_start, int layer_end, int num_kv_heads,
                  int head_dim, int max_seq, int num_slots, int num_blocks, enum ops_dtype dtype) {
    memset(kv, 0, sizeof *kv);
    if (dtype != OPS_F32 && dtype != OPS_BF16 && dtype != OPS_F16)
        return strata_set_error(STRATA_EINVAL, "kv_cache: dtype %d is not f32, bf16 or f16",
                                (int)dtype);
    kv->dtype = dtype;
    if (layer_start < 0 || layer_end < layer_start || num_kv_heads <= 0 || head_dim <= 0)
        return strata_set_error(STRATA_EINVAL,
                                "kv_cache: invalid shape (layers [%d,%d), kv_heads %d, "
                                "head_dim %d)",
                                layer_start, layer_end, num_kv_heads, head_dim);
    kv->layer_start = layer_start;
    kv->layer_end = layer_end;
    kv->num_kv_heads = num_kv_heads;
    kv->head_dim = head_dim;
    int rc = kv_blocks_init(&kv->blocks, max_seq, num_slots, num_blocks);
    if (rc < 0) return rc;
    size_t n = block_floats(kv) * (size_t)kv->blocks.num_blocks;
    /* An owned-layer-free stage (embed/head only) still has valid, empty slots. */
    kv->k = calloc(n ? n : 1, elem(kv));
    kv->v = calloc(n ? n : 1, elem(kv));
    if (!kv->k || !kv->v) {
        size_t bytes = kv_cache_bytes(kv);
        kv_cache_free(kv);
        return strata_set_error(STRATA_ENOMEM, "kv_cache: cannot allocate %zu bytes", bytes);
    }
    advise_huge(kv->k, n * elem(kv));
    advise_huge(kv->v, n * elem(kv));
    return STRATA_OK;
}

void kv_cache_free(struct kv_cache *kv) {
    if (!kv) return;
    kv_blocks_free(&kv->blocks);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

size_t kv_cache_bytes(const struct kv_cache *kv) {
    return 2 * block_floats(kv) * (size_t)kv->blocks.num_blocks * elem(kv);
}

int kv_cache_acquire(struct kv_cache *kv, int *slot) {
    return kv_blocks_acquire(&kv->blocks, slot);
}

void kv_cache_release(struct kv_cache *kv, int slot) {
    kv_blocks_release(&kv->blocks, slot);
}

struct ops_kv kv_cache_view(const struct kv_cache *kv, int slot, int layer) {
    const size_t head = (size_t)KV_BLOCK * (size_t)kv->head_dim;
    const size_t at = (size_t)(layer - kv->layer_start) * (size_t)kv->num_kv_heads * head;
    return (struct ops_kv){.k = (char *)kv->k + at * elem(kv),
                           .v = (char *)kv->v + at * elem(kv),
                           .dtype = kv->dtype,
                           .blocks = kv_blocks_table(&kv->blocks, slot),
                           .block_stride = block_floats(kv),
                           .head_stride = head};
}

/* Both directions copy, per (layer, batch row, head), len x head_dim floats: contiguous in
 * the handoff, one run of up to KV_BLOCK rows per block in the cache. */
static size_t handoff_offset(const struct kv_handoff *h, int l, int b, int head) {
    return (((size_t)l * h->batch + b) * h->kv_heads + head) * (size_t)h->seq * h->head_dim;
}

/* Positions [0, len) of kv head h of (slot, layer) <-> contiguous rows k, v: to_cache 0
 * copies the cache out, 1 copies the rows in. */
static void copy_runs(const struct kv_cache *kv, int slot, int layer, int h, unsigned char *k,
                      unsigned char *v, int len, int to_cache) {
    const struct ops_kv view = kv_cache_view(kv, slot, layer);
    const size_t D = (size_t)kv->head_dim, es = elem(kv);
    for (int j0 = 0; j0 < len; j0 += KV_BLOCK) {
        const size_t at = ops_kv_offset(&view, h, j0, kv->head_dim) * es;
        const size_t row = (size_t)j0 * D * sizeof(float);
        const size_t n = (size_t)(len - j0 < KV_BLOCK ? len - j0 : KV_BLOCK) * D;
        unsigned char *ck = (unsigned char *)view.k + at, *cv = (unsigned char *)view.v + at;
        if (kv->dtype == OPS_F32) {
            if (to_cache) {
                memcpy(ck, k + row, n * sizeof(float));
                memcpy(cv, v + row, n * sizeof(float));
            } else {
                memcpy(k + row, ck, n * sizeof(float));
                memcpy(v + row, cv, n * sizeof(float));
            }
            continue;
        }
        /* A 16-bit cache: element by element through f32 (the handoff's any alignment). */
        for (size_t i = 0; i < n; ++i)
            for (int which = 0; which < 2; ++which) {
                unsigned char *rows = which ? v : k, *cache = which ? cv : ck;
                uint16_t bits;
                float f;
                if (to_cache) {
                    memcpy(&f, rows + row + i * sizeof f, sizeof f);
                    bits = kv->dtype == OPS_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
                    memcpy(cache + i * sizeof bits, &bits, sizeof bits);
                } else {
                    memcpy(&bits, cache + i * sizeof bits, sizeof bits);
                    f = kv->dtype == OPS_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
                    memcpy(rows + row + i * sizeof f, &f, sizeof f);
                }
            }
    }
}

int kv_cache_pack(struct kv_handoff *out, const struct kv_cache *kv, const int *slots,
                  int num_slots) {
    int seq = 0, layers = kv->layer_end - kv->layer_start;
    memset(out, 0, sizeof *out);
    int rc = kv_blocks_check_slots(&kv->blocks, slots, num_slots, "kv pack");
    if (rc < 0) return rc;
    for (int b = 0; b < num_slots; ++b)
        if (kv->blocks.len[slots[b]] > seq) seq = kv->blocks.len[slots[b]];
    *out = (struct kv_handoff){.layer_start = kv->layer_start,
                               .layer_end = kv->layer_end,
                               .stored_dtype = (int)kv->dtype,
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
            for (int h = 0; h < kv->num_kv_heads; ++h)
                copy_runs(kv, slots[b], kv->layer_start + l, h,
                          (unsigned char *)(k + handoff_offset(out, l, b, h)),
                          (unsigned char *)(v + handoff_offset(out, l, b, h)),
                          kv->blocks.len[slots[b]], 0);
    for (int b = 0; b < num_slots; ++b)
        lengths[b] = kv->blocks.len[slots[b]];
    out->k = k;
    out->v = v;
    out->lengths = lengths;
    out->owned = k;
    return 0;
}

static int check_handoff(const struct kv_cache *kv, int num_slots, const struct kv_handoff *in) {
    if (in->stored_dtype != (int)kv->dtype)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: the block was stored as %s, this cache stores %s "
                                "(--kv-dtype must be the same)",
                                kv_dtype_name((enum ops_dtype)in->stored_dtype),
                                kv_dtype_name(kv->dtype));
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
        if (in->lengths[b] < 0 || in->lengths[b] > in->seq || in->lengths[b] > kv->blocks.max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)in->lengths[b], kv->blocks.max_seq);
    return 0;
}

int kv_cache_restore(struct kv_cache *kv, const int *slots, int num_slots,
                     const struct kv_handoff *in) {
    int rc = check_handoff(kv, num_slots, in);
    if (rc == 0) rc = kv_blocks_check_slots(&kv->blocks, slots, num_slots, "kv restore");
    if (rc < 0) return rc;
    for (int b = 0; b < num_slots; ++b)
        if ((rc = kv_blocks_grow(&kv->blocks, slots[b], in->lengths[b])) < 0) return rc;
    /* Only read through these (copy_runs' direction 1). */
    unsigned char *k = (unsigned char *)(uintptr_t)in->k, *v = (unsigned char *)(uintptr_t)in->v;
    for (int l = 0; l < kv->layer_end - kv->layer_start; ++l)
        for (int b = 0; b < num_slots; ++b)
            for (int h = 0; h < kv->num_kv_heads; ++h) {
                size_t src = handoff_offset(in, l, b, h) * sizeof(float);
                copy_runs(kv, slots[b], kv->layer_start + l, h, k + src, v + src, in->lengths[b],
                          1);
            }
    for (int b = 0; b < num_slots; ++b)
        kv->blocks.len[slots[b]] = in->lengths[b];
    return 0;
}
