/* Which blocks of a KV pool each request holds: the bookkeeping of a paged cache, apart from
 * where the blocks' bytes live (host memory for reference/kv_cache.h, device memory for the
 * CUDA backend), so every backend counts, reserves and frees blocks the same way.
 *
 * The pool is num_blocks blocks of KV_BLOCK positions (OPS_ATTN_BLOCK: one leaf of
 * attention's tree, reference/ops.h, so a request's sums keep their order wherever its
 * blocks lie). A slot (one request in flight) holds a table of block ids, filled as its
 * positions arrive and given back when it ends; no memory is tied to max_seq, which only
 * caps a slot's positions.
 *
 * A request that must not fail for want of KV reserves what it will need when it starts
 * (kv_blocks_reserve): reserved blocks are promised, not yet taken, and no other slot can
 * take them. Growth takes from the slot's own reservation first, then from blocks promised to
 * nobody. Free blocks are a stack, popped from the top: a fresh pool gives block 0 first.
 *
 * Prefix reuse: a full block can be registered under a key (a hash chain over the tokens of
 * its request up to it, the caller's), kept when its last holder lets it go (cached: counted
 * as available, taken least-recently-used first when no block is free) and attached to a new
 * request whose prefix has the same keys, so two requests, or two turns of one chat, that
 * share a prefix share its blocks. A shared block is only ever read: a request writes from
 * its own length on, and attached prefixes are whole blocks. */
#ifndef STRATA_REFERENCE_KV_BLOCKS_H
#define STRATA_REFERENCE_KV_BLOCKS_H

#include <stdint.h>

#include "runtime/base/op_contract.h"

/* Positions per block. */
#define KV_BLOCK OPS_ATTN_BLOCK

struct kv_blocks {
    int max_seq;            /* positions one slot may hold */
    int num_slots;          /* requests at once */
    int num_blocks;         /* the pool */
    int slot_blocks;        /* a slot's table length: ceil(max_seq / KV_BLOCK) */
    int *len;               /* [num_slots] positions filled */
    unsigned char *in_use;  /* [num_slots] */
    int32_t *tables;        /* [num_slots][slot_blocks] block ids; [0, held) valid */
    int *held;              /* [num_slots] blocks in the table */
    int *reserved;          /* [num_slots] blocks promised to the slot beyond those it holds */
    int32_t *free_ids;      /* [num_blocks] a stack of the free blocks' ids */
    int num_free, promised; /* free blocks; the sum of reserved */
    /* Prefix reuse, per block: holders, key (0: none), and the least-recently-used list of
     * cached blocks (registered, no holder; head = most recent); index: key -> block, open
     * addressing over index_cap (a power of two) entries, -1 empty. */
    int32_t *refs;
    uint64_t *key;
    int32_t *lru_prev, *lru_next, *index;
    int lru_head, lru_tail, num_cached, index_cap;
};

/* Blocks that n positions fill. */
static inline int kv_blocks_for(int positions) {
    return positions <= 0 ? 0 : (positions + KV_BLOCK - 1) / KV_BLOCK;
}

/* num_blocks 0: enough for every slot to hold max_seq positions. STRATA_EINVAL / ENOMEM. */
int kv_blocks_init(struct kv_blocks *b, int max_seq, int num_slots, int num_blocks);
void kv_blocks_free(struct kv_blocks *b); /* accepts a zeroed or half-built one */

/* Blocks free or cached and promised to nobody: what a new reservation may take. */
static inline int kv_blocks_available(const struct kv_blocks *b) {
    return b->num_free + b->num_cached - b->promised;
}

/* slot's table (block ids, kv_blocks.held[slot] of them valid). */
static inline int32_t *kv_blocks_table(const struct kv_blocks *b, int slot) {
    return b->tables + (size_t)slot * (size_t)b->slot_blocks;
}

/* Claims a free slot (len 0, no blocks); STRATA_EBUSY when all are in use. */
int kv_blocks_acquire(struct kv_blocks *b, int *slot);
/* Frees a slot: its blocks return to the pool and its reservation lapses (a slot not in use:
 * nothing). */
void kv_blocks_release(struct kv_blocks *b, int slot);

/* Promises slot the blocks that `positions` positions fill beyond those it holds (replacing
 * its earlier reservation); STRATA_EBUSY naming the counts when the pool cannot, STRATA_ERANGE
 * past max_seq, STRATA_EINVAL for a slot not in use. Slot -1 only asks: whether a new
 * request of `positions` would get its reservation now (0 or STRATA_EBUSY), promising
 * nothing. */
int kv_blocks_reserve(struct kv_blocks *b, int slot, int positions);

/* Makes slot's table cover `positions` positions (its reservation first, then blocks promised
 * to nobody); STRATA_EBUSY when the pool has no block for it, STRATA_ERANGE past max_seq,
 * STRATA_EINVAL for a slot not in use. Never shrinks. */
int kv_blocks_grow(struct kv_blocks *b, int slot, int positions);

/* Keeps slot's first `positions` positions (<= its length; STRATA_ERANGE else): the rest
 * are dropped, as speculative decoding drops the rows of rejected draft tokens. The blocks
 * stay the slot's (its reservation counted them) and are written again as positions
 * arrive. Only positions past a request's prompt are ever dropped, so no registered or
 * shared block changes. */
int kv_blocks_truncate(struct kv_blocks *b, int slot, int positions);

/* How many of keys [n] lead with registered blocks (keys[0], keys[1], ... until one is
 * missing); *cached (may be NULL) = how many of those are cached, not held: attaching them
 * takes them from what is available. */
int kv_blocks_lookup(const struct kv_blocks *b, const uint64_t *keys, int n, int *cached);

/* A KVP rank's part of a group's lookup of keys [n] (a prompt's whole blocks), of which it
 * holds global blocks [lo, hi): how many leading blocks the group can reuse as far as this
 * rank knows, n when it holds every one of its range's (or its range is empty), else lo +
 * the leading ones of its range it holds; the group's answer is the least of its ranks'.
 * *cached (may be NULL): how many of its blocks below that are cached, not held. */
int kv_blocks_lookup_range(const struct kv_blocks *b, const uint64_t *keys, int n, int lo, int hi,
                           int *cached);

/* Of a sequence's first n blocks, those [*lo, *hi) of a KVP rank that holds its global
 * positions [first, first + held) (first a multiple of KV_BLOCK; without KVP first 0, held
 * max_seq: all of them). */
static inline void kv_blocks_rank_range(int n, int first, int held, int *lo, int *hi) {
    *lo = first / KV_BLOCK;
    *hi = kv_blocks_for(first + held);
    if (*hi > n) *hi = n;
    if (*lo > *hi) *lo = *hi;
}

/* Gives a fresh slot (no blocks yet) the registered blocks of keys [n] as its first blocks,
 * while they lead (as kv_blocks_lookup counts them), and `positions` as its length (the
 * caller's: attached x KV_BLOCK, or under KVP the global positions of the prefix whose blocks
 * in this rank's range were attached); returns how many were attached, or
 * STRATA_EINVAL for a slot not fresh. Stops early rather than take a cached block that a
 * reservation counts on. */
int kv_blocks_attach(struct kv_blocks *b, int slot, const uint64_t *keys, int n, int positions);

/* Registers slot's first n blocks under keys [n] (each key != 0) before the slot is released,
 * so they stay cached; a block already registered, or whose key another block holds, is
 * left as it is. The caller passes only full blocks whose positions are all written. */
void kv_blocks_register(struct kv_blocks *b, int slot, const uint64_t *keys, int n);

/* Forgets every key (held blocks keep their holders; cached ones become free). */
void kv_blocks_forget(struct kv_blocks *b);

/* 0 when slots [n] are distinct in-use slots, else STRATA_EINVAL naming `what`. */
int kv_blocks_check_slots(const struct kv_blocks *b, const int *slots, int n, const char *what);

#endif
