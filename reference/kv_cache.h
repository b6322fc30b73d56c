/* The KV cache of one stage: fp32 keys and values for the stage's layer range, in a pool of
 * fixed-size blocks that requests hold through block tables.
 *
 * A block is OPS_ATTN_BLOCK (16) positions of every layer and kv head the stage holds,
 * [layers][kv_heads][16][head_dim] for K and the same for V: one leaf of attention's tree
 * (reference/ops.h), so a request's sums keep their order wherever its blocks lie. The pool
 * is num_blocks of them, sized by the caller (a memory budget), not by max_seq: a slot (one
 * request) holds only the blocks its positions fill, taken as they arrive and given back
 * when it ends.
 *
 * A request that must not fail for want of KV reserves the blocks it will need when it
 * starts (kv_cache_reserve): reserved blocks are promised, not yet taken, and no other slot
 * can take them. Growth takes from the slot's own reservation first, then from blocks that
 * nobody is promised.
 *
 * The cached keys are post-q/k-norm and post-RoPE (spec §3 step 4). */
#ifndef STRATA_REFERENCE_KV_CACHE_H
#define STRATA_REFERENCE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/op_contract.h"
#include "runtime/model/decoder_io.h"

/* Positions per block. */
#define KV_BLOCK OPS_ATTN_BLOCK

struct kv_cache {
    int layer_start, layer_end; /* absolute layer range held */
    int num_kv_heads;
    int head_dim;
    int max_seq;     /* positions one slot may hold */
    int num_slots;   /* requests at once */
    int num_blocks;  /* the pool */
    int slot_blocks; /* a slot's table length: ceil(max_seq / KV_BLOCK) */
    int *len;              /* [num_slots] positions filled */
    unsigned char *in_use; /* [num_slots] */
    int32_t *tables;       /* [num_slots][slot_blocks] block ids; [0, held) valid */
    int *held;             /* [num_slots] blocks in the table */
    int *reserved;         /* [num_slots] blocks promised to the slot beyond those it holds */
    int32_t *free_ids;     /* [num_blocks] a stack of the free blocks' ids */
    int num_free, promised; /* free blocks; the sum of reserved */
    float *k;               /* [num_blocks][layers][kv_heads][KV_BLOCK][head_dim] */
    float *v;               /* same shape as k */
};

/* Floats of K (or of V) in one block of a cache of this shape. */
size_t kv_cache_block_floats(int layers, int num_kv_heads, int head_dim);

/* A cache of num_blocks blocks (0: enough for every slot to hold max_seq positions). */
int kv_cache_init(struct kv_cache *kv, int layer_start, int layer_end, int num_kv_heads,
                  int head_dim, int max_seq, int num_slots, int num_blocks);
void kv_cache_free(struct kv_cache *kv); /* accepts a zeroed or half-built cache */

/* Total bytes of K+V storage: 2 × num_blocks × kv_cache_block_floats × 4. */
size_t kv_cache_bytes(const struct kv_cache *kv);

/* Blocks that n positions fill. */
static inline int kv_cache_blocks_for(int positions) {
    return positions <= 0 ? 0 : (positions + KV_BLOCK - 1) / KV_BLOCK;
}

/* Blocks free and promised to nobody: what a new reservation may take. */
static inline int kv_cache_available(const struct kv_cache *kv) {
    return kv->num_free - kv->promised;
}

/* Claims a free slot (len 0, no blocks); STRATA_EBUSY when all are in use. */
int kv_cache_acquire(struct kv_cache *kv, int *slot);
/* Frees a slot: its blocks return to the pool and its reservation lapses. */
void kv_cache_release(struct kv_cache *kv, int slot);

/* Promises slot the blocks that `positions` positions fill beyond those it holds (replacing
 * its earlier reservation); STRATA_EBUSY naming the counts when the pool cannot, STRATA_ERANGE
 * past max_seq. */
int kv_cache_reserve(struct kv_cache *kv, int slot, int positions);

/* Makes slot's table cover `positions` positions (from its reservation first, then from
 * blocks promised to nobody); STRATA_EBUSY when the pool has no block for it, STRATA_ERANGE
 * past max_seq. Never shrinks. */
int kv_cache_grow(struct kv_cache *kv, int slot, int positions);

/* The view of slot's keys and values in one absolute layer (reference/ops.h attention and
 * kv_store read and write through it). */
struct ops_kv kv_cache_view(const struct kv_cache *kv, int slot, int layer);

/* KV handoff (the cache's owner packs it; runtime/model/decoder_io.h gives the layout).
 * Packs slots [num_slots] (each in use) into `out`, which owns its buffers afterwards
 * (kv_handoff_free). */
int kv_cache_pack(struct kv_handoff *out, const struct kv_cache *kv, const int *slots,
                  int num_slots);
/* Restores batch row b of `in` into slots[b] for every b < num_slots (num_slots must equal
 * in->batch), replacing their contents and lengths, bit for bit (taking the blocks they need
 * as kv_cache_grow does). Refuses a handoff whose layer range (STRATA_ERANGE), kv_heads or
 * head_dim (STRATA_EFORMAT) differ from the cache, whose lengths exceed its capacity
 * (STRATA_ERANGE), naming both values, or that the pool has no blocks for (STRATA_EBUSY). */
int kv_cache_restore(struct kv_cache *kv, const int *slots, int num_slots,
                     const struct kv_handoff *in);

#endif
