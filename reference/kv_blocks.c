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
    if (!b->len || !b->in_use || !b->held || !b->reserved || !b->tables || !b->free_ids) {
        kv_blocks_free(b);
        return strata_set_error(STRATA_ENOMEM, "kv blocks: no memory for %d slots' tables",
                                num_slots);
    }
    for (int i = 0; i < b->num_blocks; ++i)
        b->free_ids[i] = b->num_blocks - 1 - i;
    b->num_free = b->num_blocks;
    return 0;
}

void kv_blocks_free(struct kv_blocks *b) {
    if (!b) return;
    free(b->len);
    free(b->in_use);
    free(b->held);
    free(b->reserved);
    free(b->tables);
    free(b->free_ids);
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
        b->free_ids[b->num_free++] = table[i];
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
    if (want > b->num_free - others)
        return strata_set_error(STRATA_EBUSY,
                                "kv cache: %d positions need %d more blocks of %d positions; %d of "
                                "%d are free and not promised to other requests",
                                positions, want, KV_BLOCK, b->num_free - others, b->num_blocks);
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
                                b->num_blocks, KV_BLOCK, b->num_free, b->promised - own);
    int32_t *table = kv_blocks_table(b, slot);
    for (int i = 0; i < want; ++i)
        table[b->held[slot]++] = b->free_ids[--b->num_free];
    b->reserved[slot] -= own;
    b->promised -= own;
    return 0;
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
