/* The resumable encode -> language transfer (wire 1.1 VisionBlock / VisionAck), I/O free.
 *
 * A vision stage (strata-stage --role vision) hands one request's encoder output to stage 0
 * ahead of the request itself:
 *
 *   vision stage                                stage 0
 *   VisionBlock 0 (rows 0..B-1 + DeepStack) --> assembly[nonce] created      --> VisionAck 1
 *   VisionBlock 1 (rows B..2B-1)            --> rows copied                  --> VisionAck 2
 *   ...                                         (connection drops: the assembly stays)
 *   reconnect; resume at the last VisionAck's next_block
 *   VisionBlock k ...                       --> a block already held is acknowledged again
 *   Request (grids, no tensors)             --> vision_rx_attach: the Request rebuilt with
 *                                               vision_embeds + deepstack, into the core
 *
 * The sender sends the Request only after the last block is acknowledged, so a request
 * enters stage 0's core exactly once, whole. Blocks carry raw f32 rows (codec None), the
 * receiver copies them to their row offsets, and DeepStack travels once, in block 0 of the
 * initial transfer (a resumed transfer starts past it): the assembled input is byte-identical
 * to an unbroken transfer whatever block the connection dropped after.
 *
 * The receiver keys assemblies by request nonce (stage 0's request key already) and keeps
 * each for `idle_ms` after its last block, within `max_transfers` and `max_bytes`. */
#ifndef STRATA_RUNTIME_STAGE_VISION_XFER_H
#define STRATA_RUNTIME_STAGE_VISION_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "wire/message.h"

/* ---- sender ---- */

struct vision_tx {
    uint64_t nonce;
    int n_tokens, hidden, num_deepstack, block_tokens; /* T, H, K, B */
    const float *embeds;                               /* [T, H], borrowed */
    const float *deepstack;                            /* [K, T, H] or NULL, borrowed */
    uint32_t num_blocks;                               /* ceil(T / B) */
    uint32_t next_send;                                /* the next block to send */
    uint32_t acked; /* blocks 0 .. acked - 1 are held by the receiver */
};

/* Sets up the transfer of embeds [n_tokens, hidden] (+ deepstack [K, n_tokens, hidden]) in
 * blocks of block_tokens rows. STRATA_EINVAL for sizes the wire cannot carry. */
int vision_tx_init(struct vision_tx *tx, uint64_t nonce, const float *embeds, int n_tokens,
                   int hidden, const float *deepstack, int num_deepstack, int block_tokens);

/* Builds block `index` (< num_blocks) into `arena`; block 0 carries the DeepStack. */
int vision_tx_build(const struct vision_tx *tx, struct wire_arena *arena, uint32_t index);

/* Applies an acknowledgement (never goes back). STRATA_EFORMAT for a next_block beyond the
 * blocks sent. */
int vision_tx_on_ack(struct vision_tx *tx, const struct wire_vision_ack *ack);

/* The connection dropped: the next block to send is the first unacknowledged one. */
void vision_tx_rewind(struct vision_tx *tx);

/* 1 when every block is acknowledged (then the Request goes). */
int vision_tx_done(const struct vision_tx *tx);

/* ---- receiver ---- */

struct vision_rx; /* opaque */

#define VISION_RX_DEFAULT_TRANSFERS 64
#define VISION_RX_DEFAULT_BYTES ((size_t)4 << 30)
#define VISION_RX_DEFAULT_IDLE_MS 60000

/* 0 for a limit picks its default. */
int vision_rx_init(struct vision_rx **out, int max_transfers, size_t max_bytes, int64_t idle_ms);
void vision_rx_free(struct vision_rx *rx); /* accepts NULL */

/* Takes one block at time `now_ms`: fills `ack` (what to answer). A block already held is
 * acknowledged again (a resumed sender may repeat unacknowledged ones). Fails, dropping the
 * request's assembly, for a block that does not continue it (a gap, other sizes:
 * STRATA_EFORMAT), a block k > 0 with no assembly (STRATA_ENOTFOUND: stage 0 restarted or
 * expired it; the sender may start over at block 0), or the limits (STRATA_EBUSY /
 * STRATA_ENOMEM), with the reason: the driver answers an Error with the block's nonce. */
int vision_rx_on_block(struct vision_rx *rx, struct wire_vision_ack *ack,
                       const struct wire_vision_block *block, int64_t now_ms);

/* A Request from the vision link: when a complete assembly for its nonce exists, builds
 * the Request with vision_embeds F32 [T, H] and deepstack F32 [K, T, H] into `arena`,
 * drops the assembly and returns 1; 0 when there is none (a text request: pass it on);
 * STRATA_EINVAL when the assembly is incomplete or the request already carries tensors. */
int vision_rx_attach(struct vision_rx *rx, struct wire_arena *arena,
                     const struct wire_request *request);

/* Drops assemblies idle for longer than idle_ms; returns how many. */
int vision_rx_expire(struct vision_rx *rx, int64_t now_ms);

/* Number of assemblies held. */
int vision_rx_count(const struct vision_rx *rx);

/* Testing: the assembly of `nonce` (rows received so far, blocks held, and the buffers
 * [T, H] and [K, T, H]); STRATA_ENOTFOUND when none. */
int vision_rx_peek(const struct vision_rx *rx, uint64_t nonce, uint32_t *next_block,
                   const float **embeds, size_t *embed_floats, const float **deepstack,
                   size_t *deepstack_floats);

#endif
