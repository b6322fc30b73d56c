/* Block tables of a paged KV pool; see kv_blocks.h. */
#include "reference/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

int kv_blocks_init(struct kv_blocks *b, int max_seq, int num_slots, int num_blocks) {
    memset(b, 0, sizeof *b);
    if (max_seq <= 0 || num_slots <= 0 || num_blocks < 0)
        return strata_set_error(STRATA_EINVAL,
                                "kv blocks: invalid shape (max_seq %d, slots %d, "
                                "blocks %d)",
                                max_seq, num_slots, num_blocks);
    b->max_seq = max_seq;
    b->num_slots = num_slots;
    b->slot_blocks = kv_blocks_for(max_seq);
    const long long whole = (long long)num_slots * b->slot_blocks;
    if (num_blocks == 0 && whole > INT32_MAX)
        return strata_set_error(STRATA_EINVAL,
                                "kv blocks: %d slots of %d positions need %lld blocks", num_slots,
                                max_seq, whole);
    b->num_blocks = num_blocks ? num_blocks : (int)whole;
    b->len = calloc((size_t)num_slots, sizeof *b->len);
    b->in_use = calloc((size_t)num_slots, 1);
    b->held = calloc((size_t)num_slots, sizeof *b->held);
    b->reserved = calloc((size_t)num_slots, sizeof *b->reserved);
    b->tables = calloc((size_t)num_slots * (size_t)b->slot_blocks, sizeof *b->tables);
    b->free_ids = calloc((size_t)b->num_blocks + 1, sizeof *b->free_ids);
    const size_t nb = (size_t)b->num_blocks + 1;
    b->index_cap = 16;
    while (b->index_cap < 2 * b->num_blocks && b->index_cap < (1 << 30))
        b->index_cap *= 2;
    b->refs = calloc(nb, sizeof *b->refs);
    b->key = calloc(nb, sizeof *b->key);
    b->lru_prev = malloc(nb * sizeof *b->lru_prev);
    b->lru_next = malloc(nb * sizeof *b->lru_next);
    b->index = malloc((size_t)b->index_cap * sizeof *b->index);
    if (!b->len || !b->in_use || !b->held || !b->reserved || !b->tables || !b->free_ids ||
        !b->refs || !b->key || !b->lru_prev || !b->lru_next || !b->index) {
        kv_blocks_free(b);
        return strata_set_error(STRATA_ENOMEM, "kv blocks: no memory for %d slots' tables",
                                num_slots);
    }
    for (int i = 0; i < b->num_blocks; ++i)
        b->free_ids[i] = b->num_blocks - 1 - i;
    b->num_free = b->num_blocks;
    for (int i = 0; i < b->index_cap; ++i)
        b->index[i] = -1;
    b->lru_head = b->lru_tail = -1;
    return 0;
}

/* ---- the key index: linear probing, deletion by backward shift (no tombstones) ---- */

static size_t slot_of(const struct kv_blocks *b, uint64_t key) {
    key ^= key >> 31; /* keys are hashes already; this only spreads them over the mask */
    key *= 0x9e3779b97f4a7c15ull;
    return (size_t)(key >> 17) & (size_t)(b->index_cap - 1);
}

static int find(const struct kv_blocks *b, uint64_t key) {
    for (size_t i = slot_of(b, key);; i = (i + 1) & (size_t)(b->index_cap - 1)) {
        const int blk = b->index[i];
        if (blk < 0) return -1;
        if (b->key[blk] == key) return blk;
    }
}

static void index_add(struct kv_blocks *b, int blk) {
    size_t i = slot_of(b, b->key[blk]);
    while (b->index[i] >= 0)
        i = (i + 1) & (size_t)(b->index_cap - 1);
    b->index[i] = blk;
}

static void index_remove(struct kv_blocks *b, int blk) {
    const size_t mask = (size_t)(b->index_cap - 1);
    size_t i = slot_of(b, b->key[blk]);
    while (b->index[i] != blk)
        i = (i + 1) & mask;
    /* Shift later members of the run back over the hole when their home allows it. */
    for (size_t j = (i + 1) & mask; b->index[j] >= 0; j = (j + 1) & mask) {
        const size_t home = slot_of(b, b->key[b->index[j]]);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            b->index[i] = b->index[j];
            i = j;
        }
    }
    b->index[i] = -1;
}

/* ---- the cached blocks' least-recently-used list ---- */

static void lru_unlink(struct kv_blocks *b, int blk) {
    const int p = b->lru_prev[blk], n = b->lru_next[blk];
    if (p >= 0)
        b->lru_next[p] = n;
    else
        b->lru_head = n;
    if (n >= 0)
        b->lru_prev[n] = p;
    else
        b->lru_tail = p;
    b->num_cached--;
}

static void lru_push_head(struct kv_blocks *b, int blk) {
    b->lru_prev[blk] = -1;
    b->lru_next[blk] = b->lru_head;
    if (b->lru_head >= 0) b->lru_prev[b->lru_head] = blk;
    b->lru_head = blk;
    if (b->lru_tail < 0) b->lru_tail = blk;
    b->num_cached++;
}

/* A block for new positions: a free one, else the least recently used cached one (its key
 * forgotten). The caller checked that one is available. */
static int32_t take_block(struct kv_blocks *b) {
    int32_t blk;
    if (b->num_free > 0) {
        blk = b->free_ids[--b->num_free];
    } else {
        blk = b->lru_tail;
        lru_unlink(b, blk);
        index_remove(b, blk);
        b->key[blk] = 0;
    }
    b->refs[blk] = 1;
    return blk;
}

/* The last holder lets blk go: cached when it has a key, else free. */
static void drop_block(struct kv_blocks *b, int32_t blk) {
    if (--b->refs[blk] > 0) return;
    if (b->key[blk])
        lru_push_head(b, blk);
    else
        b->free_ids[b->num_free++] = blk;
}

void kv_blocks_free(struct kv_blocks *b) {
    if (!b) return;
    free(b->len);
    free(b->in_use);
    free(b->held);
    free(b->reserved);
    free(b->tables);
    free(b->free_ids);
    free(b->refs);
    free(b->key);
    free(b->lru_prev);
    free(b->lru_next);
    free(b->index);
    memset(b, 0, sizeof *b);
}

int kv_blocks_acquire(struct kv_blocks *b, int *slot) {
    for (int s = 0; s < b->num_slots; ++s) {
        if (!b->in_use[s]) {
            b->in_use[s] = 1;
            b->len[s] = 0;
            b->held[s] = 0;
            b->reserved[s] = 0;
            *slot = s;
            return STRATA_OK;
        }
    }
    return strata_set_error(STRATA_EBUSY, "kv cache: all %d slots are in use", b->num_slots);
}

void kv_blocks_release(struct kv_blocks *b, int slot) {
    if (slot < 0 || slot >= b->num_slots || !b->in_use[slot]) return;
    const int32_t *table = kv_blocks_table(b, slot);
    for (int i = b->held[slot] - 1; i >= 0; --i)
        drop_block(b, table[i]);
    b->promised -= b->reserved[slot];
    b->in_use[slot] = 0;
    b->len[slot] = 0;
    b->held[slot] = 0;
    b->reserved[slot] = 0;
}

static int check_positions(const struct kv_blocks *b, int slot, int positions, const char *what) {
    if (slot < 0 || slot >= b->num_slots || !b->in_use[slot])
        return strata_set_error(STRATA_EINVAL, "%s: slot %d is not an in-use slot of the cache",
                                what, slot);
    if (positions < 0 || positions > b->max_seq)
        return strata_set_error(STRATA_ERANGE, "%s: %d positions, a slot holds at most %d", what,
                                positions, b->max_seq);
    return 0;
}

int kv_blocks_reserve(struct kv_blocks *b, int slot, int positions) {
    const int ask = slot == -1;
    int rc = ask && positions >= 0 && positions <= b->max_seq
                 ? 0
                 : check_positions(b, slot, positions, "kv reserve");
    if (rc < 0) return rc;
    int want = kv_blocks_for(positions) - (ask ? 0 : b->held[slot]);
    if (want < 0) want = 0;
    const int others = b->promised - (ask ? 0 : b->reserved[slot]);
    if (want > b->num_free + b->num_cached - others)
        return strata_set_error(STRATA_EBUSY,
                                "kv cache: %d positions need %d more blocks of %d positions; %d of "
                                "%d are free and not promised to other requests",
                                positions, want, KV_BLOCK, b->num_free + b->num_cached - others,
                                b->num_blocks);
    if (ask) return 0;
    b->promised = others + want;
    b->reserved[slot] = want;
    return 0;
}

int kv_blocks_grow(struct kv_blocks *b, int slot, int positions) {
    int rc = check_positions(b, slot, positions, "kv grow");
    if (rc < 0) return rc;
    const int want = kv_blocks_for(positions) - b->held[slot];
    if (want <= 0) return 0;
    const int own = b->reserved[slot] < want ? b->reserved[slot] : want;
    if (want - own > kv_blocks_available(b))
        return strata_set_error(STRATA_EBUSY,
                                "kv cache: the pool is full (%d blocks of %d positions; %d free, "
                                "%d of them promised to other requests)",
                                b->num_blocks, KV_BLOCK, b->num_free + b->num_cached,
                                b->promised - own);
    int32_t *table = kv_blocks_table(b, slot);
    for (int i = 0; i < want; ++i)
        table[b->held[slot]++] = take_block(b);
    b->reserved[slot] -= own;
    b->promised -= own;
    return 0;
}

int kv_blocks_truncate(struct kv_blocks *b, int slot, int positions) {
    /* Lengths are global under KVP (a rank's max_seq is its share): only the length bounds. */
    if (slot < 0 || slot >= b->num_slots || !b->in_use[slot])
        return strata_set_error(STRATA_EINVAL,
                                "kv truncate: slot %d is not an in-use slot of the cache", slot);
    if (positions < 0 || positions > b->len[slot])
        return strata_set_error(STRATA_ERANGE,
                                "kv truncate: slot %d holds %d positions, cannot keep %d", slot,
                                b->len[slot], positions);
    b->len[slot] = positions;
    return 0;
}

int kv_blocks_lookup(const struct kv_blocks *b, const uint64_t *keys, int n, int *cached) {
    int found = 0, idle = 0;
    for (; found < n; ++found) {
        const int blk = keys[found] ? find(b, keys[found]) : -1;
        if (blk < 0) break;
        idle += b->refs[blk] == 0;
    }
    if (cached) *cached = idle;
    return found;
}

int kv_blocks_lookup_range(const struct kv_blocks *b, const uint64_t *keys, int n, int lo, int hi,
                           int *cached) {
    if (hi <= lo) {
        if (cached) *cached = 0;
        return n;
    }
    const int found = kv_blocks_lookup(b, keys + lo, hi - lo, cached);
    return found == hi - lo ? n : lo + found;
}

int kv_blocks_attach(struct kv_blocks *b, int slot, const uint64_t *keys, int n, int positions) {
    if (slot < 0 || slot >= b->num_slots || !b->in_use[slot] || b->held[slot] || b->len[slot])
        return strata_set_error(STRATA_EINVAL, "kv attach: slot %d is not a fresh in-use slot",
                                slot);
    int32_t *table = kv_blocks_table(b, slot);
    int got = 0;
    for (; got < n && got < b->slot_blocks; ++got) {
        const int blk = keys[got] ? find(b, keys[got]) : -1;
        if (blk < 0 || (b->refs[blk] == 0 && kv_blocks_available(b) <= 0)) break;
        if (b->refs[blk]++ == 0) lru_unlink(b, blk);
        table[got] = blk;
    }
    b->held[slot] = got;
    b->len[slot] = got ? positions : 0;
    return got;
}

void kv_blocks_register(struct kv_blocks *b, int slot, const uint64_t *keys, int n) {
    if (slot < 0 || slot >= b->num_slots || !b->in_use[slot]) return;
    const int32_t *table = kv_blocks_table(b, slot);
    for (int i = 0; i < n && i < b->held[slot]; ++i) {
        const int32_t blk = table[i];
        if (!keys[i] || b->key[blk] || find(b, keys[i]) >= 0) continue;
        b->key[blk] = keys[i];
        index_add(b, blk);
    }
}

void kv_blocks_forget(struct kv_blocks *b) {
    while (b->lru_tail >= 0) {
        const int32_t blk = b->lru_tail;
        lru_unlink(b, blk);
        b->free_ids[b->num_free++] = blk;
    }
    for (int i = 0; i < b->num_blocks; ++i)
        b->key[i] = 0;
    for (int i = 0; i < b->index_cap; ++i)
        b->index[i] = -1;
}

int kv_blocks_check_slots(const struct kv_blocks *b, const int *slots, int n, const char *what) {
    if (n <= 0 || !slots) return strata_set_error(STRATA_EINVAL, "%s: no slots given", what);
    for (int i = 0; i < n; ++i) {
        if (slots[i] < 0 || slots[i] >= b->num_slots || !b->in_use[slots[i]])
            return strata_set_error(STRATA_EINVAL, "%s: slot %d is not an in-use slot of the cache",
                                    what, slots[i]);
        for (int j = 0; j < i; ++j)
            if (slots[j] == slots[i])
                return strata_set_error(STRATA_EINVAL, "%s: slot %d is given twice", what,
                                        slots[i]);
    }
    return 0;
}
