/* What a stage hands a decoder backend and gets back, independent of the device: the
 * items of one forward microbatch and the KV handoff layout. Shared by the CPU reference
 * (reference/model.h, reference/kv_cache.h), the stage backends (runtime/stage/backend.h)
 * and the wire conversion of a KvBlock (runtime/stage/kv_block.h). */
#ifndef STRATA_RUNTIME_MODEL_DECODER_IO_H
#define STRATA_RUNTIME_MODEL_DECODER_IO_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One request's share of a forward batch: `n_tokens` consecutive rows of the hidden
 * buffer belonging to KV slot `slot`, at cache positions pos .. pos+n_tokens-1. */
struct forward_item {
    int slot;
    int pos;
    int n_tokens;
    /* M-RoPE position ids [3][n_tokens] (t, h, w rows), or NULL for 1-D positions
     * equal to the cache positions (text-only; spec §5.1 reduces to plain RoPE). */
    const int32_t *mrope_positions;
    /* DeepStack (spec §5.4): NULL, or [num_deepstack][n_tokens][H] features added to the
     * output of absolute layer k (k < num_deepstack) on rows where visual_mask[i] != 0. */
    const float *deepstack;
    const uint8_t *visual_mask; /* [n_tokens] */
    int num_deepstack;
};

/* Checks a microbatch against a KV cache's bookkeeping (len [num_slots] positions held,
 * in_use [num_slots]): every item has >= 1 token, an acquired slot of its own, continues its
 * slot exactly (pos == len[slot]) and fits max_seq; DeepStack counts within num_layers.
 * Messages start with `who` ("reference_forward", "cuda forward"). Fills *rows (total tokens)
 * and *ctx (the longest context after the batch, >= 1). Every backend's forward runs it, so
 * they refuse the same things with the same words. */
int forward_items_check(const char *who, const struct forward_item *items, int n_items,
                        const int *len, const unsigned char *in_use, int num_slots, int max_seq,
                        int num_layers, int *rows, int *ctx);

/* The KV of `batch` requests of one layer range in the handoff layout: f32 k and v, each
 * [layers][batch][kv_heads][seq][head_dim] with layers = layer_end - layer_start and seq
 * the longest request; row b holds lengths[b] valid positions and zeros after them. The
 * wire KvBlock carries exactly these bytes (wire/strata.fbs), so a pack is one copy out
 * of the cache and a restore one copy in, whatever the device's own cache layout. */
struct kv_handoff {
    int layer_start, layer_end;
    int batch, kv_heads, seq, head_dim;
    const int32_t *lengths; /* [batch] */
    const void *k, *v;      /* f32 bytes, any alignment (a restore may read from a frame) */
    int stored_dtype;       /* what the packing cache stored (enum ops_dtype; 0: f32): a
                             * restore goes only into a cache storing the same, so a 16-bit
                             * cache gets its own bits back */
    void *owned;            /* the one allocation behind k, v and lengths after a pack */
};

/* Elements in each of k and v. */
static inline size_t kv_handoff_numel(const struct kv_handoff *h) {
    return (size_t)(h->layer_end - h->layer_start) * (size_t)h->batch * (size_t)h->kv_heads *
           (size_t)h->seq * (size_t)h->head_dim;
}

/* Frees what a pack allocated; accepts a zeroed handoff or a borrowed view. */
static inline void kv_handoff_free(struct kv_handoff *h) {
    if (!h) return;
    free(h->owned);
    memset(h, 0, sizeof *h);
}

#endif
