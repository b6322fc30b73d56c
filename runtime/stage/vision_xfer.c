/* The resumable vision transfer (see vision_xfer.h): block cutting and acknowledgements on
 * the sender, per-nonce assembly with limits and expiry on the receiver. */
#include "runtime/stage/vision_xfer.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

/* ---- sender ---- */

int vision_tx_init(struct vision_tx *tx, uint64_t nonce, const float *embeds, int n_tokens,
                   int hidden, const float *deepstack, int num_deepstack, int block_tokens) {
    memset(tx, 0, sizeof *tx);
    if (nonce == 0 || !embeds || n_tokens < 1 || hidden < 1 || block_tokens < 1 ||
        num_deepstack < 0 || (num_deepstack && !deepstack))
        return strata_set_error(STRATA_EINVAL,
                                "vision transfer: nonce %llu, %d tokens x %d, K %d, blocks of %d "
                                "are not a transfer",
                                (unsigned long long)nonce, n_tokens, hidden, num_deepstack,
                                block_tokens);
    tx->nonce = nonce;
    tx->embeds = embeds;
    tx->n_tokens = n_tokens;
    tx->hidden = hidden;
    tx->deepstack = num_deepstack ? deepstack : NULL;
    tx->num_deepstack = num_deepstack;
    tx->block_tokens = block_tokens;
    tx->num_blocks = (uint32_t)((n_tokens + block_tokens - 1) / block_tokens);
    return 0;
}

int vision_tx_build(const struct vision_tx *tx, struct wire_arena *arena, uint32_t index) {
    struct wire_vision_block b;
    if (index >= tx->num_blocks)
        return strata_set_error(STRATA_EINVAL, "vision transfer: block %u of %u", index,
                                tx->num_blocks);
    int64_t start = (int64_t)index * tx->block_tokens, n = tx->n_tokens - start;
    if (n > tx->block_tokens) n = tx->block_tokens;
    memset(&b, 0, sizeof b);
    b.nonce = tx->nonce;
    b.index = index;
    b.num_blocks = tx->num_blocks;
    b.token_start = (uint32_t)start;
    b.total_tokens = (uint32_t)tx->n_tokens;
    b.embeds = (struct wire_tensor){.defined = 1,
                                    .dtype = WIRE_DTYPE_F32,
                                    .ndim = 2,
                                    .shape = {n, tx->hidden},
                                    .data = tx->embeds + (size_t)start * (size_t)tx->hidden,
                                    .nbytes = sizeof(float) * (size_t)n * (size_t)tx->hidden};
    if (index == 0 && tx->num_deepstack)
        b.deepstack = (struct wire_tensor){.defined = 1,
                                           .dtype = WIRE_DTYPE_F32,
                                           .ndim = 3,
                                           .shape = {tx->num_deepstack, tx->n_tokens, tx->hidden},
                                           .data = tx->deepstack,
                                           .nbytes = sizeof(float) * (size_t)tx->num_deepstack *
                                                     (size_t)tx->n_tokens * (size_t)tx->hidden};
    return wire_build_vision_block(arena, &b);
}

int vision_tx_on_ack(struct vision_tx *tx, const struct wire_vision_ack *ack) {
    if (ack->nonce != tx->nonce || ack->next_block > tx->num_blocks)
        return strata_set_error(STRATA_EFORMAT,
                                "vision transfer %llu: acknowledgement of %u blocks (nonce %llu) "
                                "for a transfer of %u",
                                (unsigned long long)tx->nonce, ack->next_block,
                                (unsigned long long)ack->nonce, tx->num_blocks);
    if (ack->next_block > tx->acked) tx->acked = ack->next_block;
    if (tx->next_send < tx->acked) tx->next_send = tx->acked;
    return 0;
}

void vision_tx_rewind(struct vision_tx *tx) {
    tx->next_send = tx->acked;
}

int vision_tx_done(const struct vision_tx *tx) {
    return tx->acked == tx->num_blocks;
}

/* ---- receiver ---- */

struct assembly {
    uint64_t nonce; /* 0 = free entry */
    uint32_t num_blocks, next_block, total_tokens, rows;
    int hidden, num_deepstack;
    float *embeds;    /* [total_tokens, hidden] */
    float *deepstack; /* [K, total_tokens, hidden] or NULL */
    size_t bytes;
    int64_t last_ms;
};

struct vision_rx {
    int max_transfers;
    size_t max_bytes, bytes;
    int64_t idle_ms;
    struct assembly *a; /* [max_transfers] */
};

int vision_rx_init(struct vision_rx **out, int max_transfers, size_t max_bytes, int64_t idle_ms) {
    struct vision_rx *rx = calloc(1, sizeof *rx);
    *out = NULL;
    if (!rx) return strata_set_error(STRATA_ENOMEM, "out of memory");
    rx->max_transfers = max_transfers > 0 ? max_transfers : VISION_RX_DEFAULT_TRANSFERS;
    rx->max_bytes = max_bytes ? max_bytes : VISION_RX_DEFAULT_BYTES;
    rx->idle_ms = idle_ms > 0 ? idle_ms : VISION_RX_DEFAULT_IDLE_MS;
    rx->a = calloc((size_t)rx->max_transfers, sizeof *rx->a);
    if (!rx->a) {
        free(rx);
        return strata_set_error(STRATA_ENOMEM, "out of memory");
    }
    *out = rx;
    return 0;
}

static void drop(struct vision_rx *rx, struct assembly *a) {
    free(a->embeds);
    free(a->deepstack);
    rx->bytes -= a->bytes;
    memset(a, 0, sizeof *a);
}

void vision_rx_free(struct vision_rx *rx) {
    if (!rx) return;
    for (int i = 0; i < rx->max_transfers; i++)
        if (rx->a[i].nonce) drop(rx, &rx->a[i]);
    free(rx->a);
    free(rx);
}

static struct assembly *find(const struct vision_rx *rx, uint64_t nonce) {
    for (int i = 0; i < rx->max_transfers; i++)
        if (rx->a[i].nonce == nonce) return &rx->a[i];
    return NULL;
}

/* Block 0 of a new transfer: an entry and the buffers, within the limits. */
static int start(struct vision_rx *rx, struct assembly **out, const struct wire_vision_block *b) {
    struct assembly *a = find(rx, 0);
    int H = (int)b->embeds.shape[1], K = b->deepstack.defined ? (int)b->deepstack.shape[0] : 0;
    size_t floats = (size_t)b->total_tokens * (size_t)H, bytes = sizeof(float) * floats * (1 + K);
    if (b->index != 0) /* ENOTFOUND: the sender may start over from block 0 */
        return strata_set_error(STRATA_ENOTFOUND,
                                "vision block %u of request %llu, which has no transfer here "
                                "(block 0 first; stage 0 may have restarted or expired it)",
                                b->index, (unsigned long long)b->nonce);
    if (!a)
        return strata_set_error(STRATA_EBUSY, "%d vision transfers are in progress (the limit)",
                                rx->max_transfers);
    if (bytes > rx->max_bytes - rx->bytes)
        return strata_set_error(STRATA_EBUSY,
                                "vision transfer of %zu bytes over the %zu-byte limit (%zu held)",
                                bytes, rx->max_bytes, rx->bytes);
    a->embeds = malloc(sizeof(float) * floats);
    a->deepstack = K ? malloc(sizeof(float) * floats * (size_t)K) : NULL;
    if (!a->embeds || (K && !a->deepstack)) {
        free(a->embeds);
        free(a->deepstack);
        a->embeds = a->deepstack = NULL;
        return strata_set_error(STRATA_ENOMEM, "out of memory for a %zu-byte vision transfer",
                                bytes);
    }
    if (K) memcpy(a->deepstack, b->deepstack.data, b->deepstack.nbytes);
    a->nonce = b->nonce;
    a->num_blocks = b->num_blocks;
    a->total_tokens = b->total_tokens;
    a->hidden = H;
    a->num_deepstack = K;
    a->bytes = bytes;
    rx->bytes += bytes;
    *out = a;
    return 0;
}

static int take(struct vision_rx *rx, struct assembly *a, const struct wire_vision_block *b) {
    if (b->num_blocks != a->num_blocks || b->total_tokens != a->total_tokens ||
        b->embeds.shape[1] != a->hidden || b->token_start != a->rows || b->index != a->next_block ||
        (b->index > 0 && b->deepstack.defined))
        return strata_set_error(
            STRATA_EFORMAT,
            "vision block %u of request %llu (%u of %u tokens from %u, H %lld) "
            "does not continue the transfer (%u blocks held, %u rows of %u, H %d)",
            b->index, (unsigned long long)b->nonce, b->num_blocks, b->total_tokens, b->token_start,
            (long long)b->embeds.shape[1], a->next_block, a->rows, a->total_tokens, a->hidden);
    memcpy(a->embeds + (size_t)a->rows * (size_t)a->hidden, b->embeds.data, b->embeds.nbytes);
    a->rows += (uint32_t)b->embeds.shape[0];
    a->next_block++;
    if (a->next_block == a->num_blocks && a->rows != a->total_tokens)
        return strata_set_error(STRATA_EFORMAT,
                                "vision transfer of request %llu ended with %u of %u rows",
                                (unsigned long long)b->nonce, a->rows, a->total_tokens);
    (void)rx;
    return 0;
}

int vision_rx_on_block(struct vision_rx *rx, struct wire_vision_ack *ack,
                       const struct wire_vision_block *b, int64_t now_ms) {
    struct assembly *a = find(rx, b->nonce);
    int rc = 0;
    memset(ack, 0, sizeof *ack);
    if (!a)
        rc = start(rx, &a, b);
    else if (b->index < a->next_block) /* a resumed sender repeating a held block */
        goto answer;
    if (rc == 0) rc = take(rx, a, b);
    if (rc < 0) {
        if (a) drop(rx, a);
        return rc;
    }
answer:
    a->last_ms = now_ms;
    ack->nonce = b->nonce;
    ack->next_block = a->next_block;
    return 0;
}

int vision_rx_attach(struct vision_rx *rx, struct wire_arena *arena,
                     const struct wire_request *request) {
    struct assembly *a = find(rx, request->nonce);
    struct wire_request full = *request;
    if (!a || request->nonce == 0) return 0;
    if (a->next_block != a->num_blocks || request->vision_embeds.defined ||
        request->deepstack.defined) {
        int rc = strata_set_error(STRATA_EINVAL,
                                  "request %llu arrived with %u of its %u vision blocks%s",
                                  (unsigned long long)request->nonce, a->next_block, a->num_blocks,
                                  request->vision_embeds.defined ? " and its own tensors" : "");
        drop(rx, a);
        return rc;
    }
    size_t floats = (size_t)a->total_tokens * (size_t)a->hidden;
    full.vision_embeds = (struct wire_tensor){.defined = 1,
                                              .dtype = WIRE_DTYPE_F32,
                                              .ndim = 2,
                                              .shape = {a->total_tokens, a->hidden},
                                              .data = a->embeds,
                                              .nbytes = sizeof(float) * floats};
    if (a->num_deepstack)
        full.deepstack =
            (struct wire_tensor){.defined = 1,
                                 .dtype = WIRE_DTYPE_F32,
                                 .ndim = 3,
                                 .shape = {a->num_deepstack, a->total_tokens, a->hidden},
                                 .data = a->deepstack,
                                 .nbytes = sizeof(float) * floats * (size_t)a->num_deepstack};
    int rc = wire_build_request(arena, &full);
    drop(rx, a);
    return rc < 0 ? rc : 1;
}

int vision_rx_expire(struct vision_rx *rx, int64_t now_ms) {
    int n = 0;
    for (int i = 0; i < rx->max_transfers; i++)
        if (rx->a[i].nonce && now_ms - rx->a[i].last_ms > rx->idle_ms) {
            drop(rx, &rx->a[i]);
            n++;
        }
    return n;
}

int vision_rx_count(const struct vision_rx *rx) {
    int n = 0;
    for (int i = 0; i < rx->max_transfers; i++)
        n += rx->a[i].nonce != 0;
    return n;
}

int vision_rx_peek(const struct vision_rx *rx, uint64_t nonce, uint32_t *next_block,
                   const float **embeds, size_t *embed_floats, const float **deepstack,
                   size_t *deepstack_floats) {
    const struct assembly *a = nonce ? find(rx, nonce) : NULL;
    if (!a)
        return strata_set_error(STRATA_ENOTFOUND, "no vision transfer %llu",
                                (unsigned long long)nonce);
    *next_block = a->next_block;
    *embeds = a->embeds;
    *embed_floats = (size_t)a->rows * (size_t)a->hidden;
    *deepstack = a->deepstack;
    *deepstack_floats = (size_t)a->num_deepstack * (size_t)a->total_tokens * (size_t)a->hidden;
    return 0;
}
