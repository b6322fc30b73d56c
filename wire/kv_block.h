/* KV handoff: pack a stage's KV cache for its layer range into a KvBlock message and
 * restore it into another cache holding the same layer range.
 *
 * The packed layout is [L, B, kv_heads, S, head_dim] f32 for k and for v, where L is the
 * cache's layer count, B the number of slots packed, S the longest slot length; rows of a
 * shorter slot are zero past its length (lengths[b] says how many are valid). Restore is
 * bit-exact and refuses a block whose layer range, kv_heads or head_dim differ from the
 * target cache, or whose lengths exceed its capacity, with a message naming both values. */
#ifndef STRATA_WIRE_KV_BLOCK_H
#define STRATA_WIRE_KV_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "reference/kv_cache.h"
#include "wire/message.h"

/* Owns the packed buffers; `block` points into them and is ready for wire_build_kv_block
 * (stage_from, stage_to, step and nonce are left 0 for the caller to set). */
struct wire_kv_pack {
    float *k;         /* [L, B, kv_heads, S, head_dim] */
    float *v;         /* same shape */
    int32_t *lengths; /* [B] */
    struct wire_kv_block block;
};

/* Packs slots [num_slots] of `kv` (each must be in use). */
int wire_kv_pack(struct wire_kv_pack *pack, const struct kv_cache *kv, const int *slots,
                 int num_slots);
/* Accepts a zeroed or half-built pack. */
void wire_kv_pack_free(struct wire_kv_pack *pack);

/* Restores batch row b of `block` into slots[b] of `kv` for every b < num_slots
 * (num_slots must equal B), replacing their contents and setting their lengths.
 * The block must be F32 with codec NONE (or decodable: lossy codecs are refused, since a
 * restore must be exact). */
int wire_kv_restore(struct kv_cache *kv, const int *slots, int num_slots,
                    const struct wire_kv_block *block);

#endif
