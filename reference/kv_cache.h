/* The KV cache of one stage: keys and values for the stage's layer range, stored as f32 (the
 * exact mode), bf16 or f16 (half the bytes; rounded to nearest even when stored, widened
 * exactly when read), in a pool of blocks that requests hold through block tables
 * (reference/kv_blocks.h keeps which).
 *
 * A block is KV_BLOCK (16) positions of every layer and kv head the stage holds,
 * [layers][kv_heads][KV_BLOCK][head_dim] for K and the same for V. The pool's size is the
 * caller's (a memory budget), not max_seq times the slots.
 *
 * The cached keys are post-q/k-norm and post-RoPE (spec §3 step 4). */
#ifndef STRATA_REFERENCE_KV_CACHE_H
#define STRATA_REFERENCE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "reference/kv_blocks.h"
#include "runtime/base/op_contract.h"
#include "runtime/model/decoder_io.h"

struct kv_cache {
    int layer_start, layer_end; /* absolute layer range held */
    int num_kv_heads;
    int head_dim;
    struct kv_blocks blocks; /* slots, lengths, block tables */
    enum ops_dtype dtype;    /* OPS_F32, OPS_BF16 or OPS_F16 */
    void *k;                 /* [num_blocks][layers][kv_heads][KV_BLOCK][head_dim] */
    void *v;                 /* same shape as k */
};

/* Elements of K (or of V) in one block of a cache of this shape. */
size_t kv_cache_block_floats(int layers, int num_kv_heads, int head_dim);

/* A cache of num_blocks blocks (0: enough for every slot to hold max_seq positions) for
 * num_slots requests of at most max_seq positions each, storing `dtype` (OPS_F32, OPS_BF16,
 * OPS_F16; anything else is STRATA_EINVAL). */
int kv_cache_init(struct kv_cache *kv, int layer_start, int layer_end, int num_kv_heads,
                  int head_dim, int max_seq, int num_slots, int num_blocks, enum ops_dtype dtype);

/* "f32", "bf16", "f16" <-> the dtype (--kv-dtype); parse: STRATA_EINVAL naming the text. */
int kv_dtype_parse(const char *text, enum ops_dtype *out);
const char *kv_dtype_name(enum ops_dtype dtype);
void kv_cache_free(struct kv_cache *kv); /* accepts a zeroed or half-built cache */

/* Total bytes of K+V storage: 2 × num_blocks × kv_cache_block_floats × the element's bytes. */
size_t kv_cache_bytes(const struct kv_cache *kv);

/* Claims a free slot (len 0, no blocks); STRATA_EBUSY when all are in use. */
int kv_cache_acquire(struct kv_cache *kv, int *slot);
/* Frees a slot: its blocks return to the pool and its reservation lapses. */
void kv_cache_release(struct kv_cache *kv, int slot);

/* The view of slot's keys and values in one absolute layer (reference/ops.h attention and
 * kv_store read and write through it). */
struct ops_kv kv_cache_view(const struct kv_cache *kv, int slot, int layer);

/* KV handoff (the cache's owner packs it; runtime/model/decoder_io.h gives the layout).
 * Packs slots [num_slots] (each in use) into `out`, which owns its buffers afterwards
 * (kv_handoff_free). The handoff is f32 whatever the cache stores (a 16-bit cache's values
 * widen exactly, and restore into a cache of the same dtype gives back its bits). */
int kv_cache_pack(struct kv_handoff *out, const struct kv_cache *kv, const int *slots,
                  int num_slots);
/* Restores batch row b of `in` into slots[b] for every b < num_slots (num_slots must equal
 * in->batch), replacing their contents and lengths, bit for bit (taking the blocks they need
 * as kv_blocks_grow does). Refuses a handoff whose layer range (STRATA_ERANGE), kv_heads or
 * head_dim (STRATA_EFORMAT) differ from the cache, whose lengths exceed its capacity
 * (STRATA_ERANGE), naming both values, or that the pool has no blocks for (STRATA_EBUSY). */
int kv_cache_restore(struct kv_cache *kv, const int *slots, int num_slots,
                     const struct kv_handoff *in);

#endif
