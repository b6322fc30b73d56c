/* Per-request KV cache of one stage: fp32 keys and values for the stage's layer range.
 *
 * Layout: one block per slot, [layers][kv_heads][max_seq][head_dim] for K and the same for
 * V, so attention walks each head's positions contiguously. A slot belongs to one request
 * (the runtime maps request nonces to slots); `len` is how many positions it holds. The
 * cached keys are post-q/k-norm and post-RoPE (spec §3 step 4). */
#ifndef STRATA_REFERENCE_KV_CACHE_H
#define STRATA_REFERENCE_KV_CACHE_H

#include <stddef.h>

#include "runtime/model/decoder_io.h"

struct kv_cache {
    int layer_start, layer_end; /* absolute layer range held */
    int num_kv_heads;
    int head_dim;
    int max_seq; /* positions per slot */
    int num_slots;
    int *len;              /* [num_slots] positions filled */
    unsigned char *in_use; /* [num_slots] */
    float *k;              /* [num_slots][layers][kv_heads][max_seq][head_dim] */
    float *v;              /* same shape as k */
};

int kv_cache_init(struct kv_cache *kv, int layer_start, int layer_end, int num_kv_heads,
                  int head_dim, int max_seq, int num_slots);
void kv_cache_free(struct kv_cache *kv); /* accepts a zeroed or half-built cache */

/* Total bytes of K+V storage: 2 × layers × kv_heads × head_dim × 4 × max_seq × slots. */
size_t kv_cache_bytes(const struct kv_cache *kv);

/* Claims a free slot (len 0); STRATA_EBUSY when all are in use. */
int kv_cache_acquire(struct kv_cache *kv, int *slot);
/* Frees a slot and forgets its positions. */
void kv_cache_release(struct kv_cache *kv, int slot);

/* Pointer to [max_seq][head_dim] keys (or values) of one absolute layer and kv head. */
float *kv_cache_k(const struct kv_cache *kv, int slot, int layer, int kv_head);
float *kv_cache_v(const struct kv_cache *kv, int slot, int layer, int kv_head);

/* KV handoff (the cache's owner packs it; runtime/model/decoder_io.h gives the layout).
 * Packs slots [num_slots] (each in use) into `out`, which owns its buffers afterwards
 * (kv_handoff_free). */
int kv_cache_pack(struct kv_handoff *out, const struct kv_cache *kv, const int *slots,
                  int num_slots);
/* Restores batch row b of `in` into slots[b] for every b < num_slots (num_slots must equal
 * in->batch), replacing their contents and lengths, bit for bit. Refuses a handoff whose
 * layer range (STRATA_ERANGE), kv_heads or head_dim (STRATA_EFORMAT) differ from the cache,
 * or whose lengths exceed its capacity (STRATA_ERANGE), naming both values. */
int kv_cache_restore(struct kv_cache *kv, const int *slots, int num_slots,
                     const struct kv_handoff *in);

#endif
