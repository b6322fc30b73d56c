/* KV handoff on the wire: a backend's packed KV (runtime/model/decoder_io.h, struct
 * kv_handoff) as a KvBlock message and back. wire/ knows frames and tensors; the cache's
 * owner (the backend) packs and restores; this module only describes the same bytes as
 * two 5-D f32 tensors [L, B, kv_heads, S, head_dim] and checks a received block. */
#ifndef STRATA_RUNTIME_STAGE_KV_BLOCK_H
#define STRATA_RUNTIME_STAGE_KV_BLOCK_H

#include "runtime/model/decoder_io.h"
#include "wire/message.h"

/* Fills `msg` (layer range, lengths, k and v tensors pointing at `h`'s buffers) for
 * wire_build_kv_block; stage_from, stage_to, step and nonce are left 0 for the caller. */
void kv_block_from_handoff(struct wire_kv_block *msg, const struct kv_handoff *h);

/* A view of a read block's bytes (pointers into the frame). The block must hold two equal
 * 5-D F32 tensors with codec NONE (an exact restore cannot take a lossy payload) and one
 * length per batch row, each within the block's S; otherwise STRATA_EFORMAT. */
int kv_block_to_handoff(struct kv_handoff *h, const struct wire_kv_block *msg);

#endif
