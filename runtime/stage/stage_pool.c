/* Stage core memory that is reused instead of allocated per message (house style: no malloc
 * on the forward path once the stage is warm):
 *
 * - Work items: a free list of stage_item records, max_batch of them made at init. Each
 *   keeps its hidden-row buffer when recycled, so a stage r > 0 decodes an activation into
 *   a buffer it already has (it grows only when a larger chunk than ever before arrives).
 * - Outgoing frames: one 64-byte aligned byte buffer holding the queued frames back to
 *   back (each slot 64-byte aligned, so payloads stay aligned for zero-copy readers) and
 *   an array of descriptors. Drivers drain the queue after each call, so the next frame
 *   starts at offset 0 again; the buffer grows (amortised doubling) only for a larger
 *   backlog than ever before. A popped frame points into the buffer and stays valid until
 *   the next call into the core (see stage_core_pop_frame). */
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/stage_core_internal.h"

#define OUT_ALIGN 64

static size_t round_up(size_t value, size_t align) {
    return (value + align - 1) / align * align;
}

int stage_pool_init(struct stage_core *core, int num_items) {
    for (int i = 0; i < num_items; i++) {
        struct stage_item *it = calloc(1, sizeof *it);
        if (!it) return strata_set_error(STRATA_ENOMEM, "out of memory for work items");
        it->next = core->work.free_items;
        core->work.free_items = it;
    }
    /* One result record per KV slot and as many again for refusals: ending a request
     * needs no allocation while the driver drains results after each call. */
    for (int i = 0; i < 2 * num_items; i++) {
        struct stage_result_node *node = calloc(1, sizeof *node);
        if (!node) return strata_set_error(STRATA_ENOMEM, "out of memory for result records");
        node->next = core->outbox.free_results;
        core->outbox.free_results = node;
    }
    return 0;
}

static void item_destroy(struct stage_item *it) {
    free(it->positions);
    free(it->visual);
    free(it->deepstack);
    free(it->hidden);
    free(it);
}

void stage_pool_free(struct stage_core *core) {
    for (struct stage_item *it = core->work.head, *next; it; it = next) {
        next = it->next;
        item_destroy(it);
    }
    for (struct stage_item *it = core->work.free_items, *next; it; it = next) {
        next = it->next;
        item_destroy(it);
    }
    core->work.head = core->work.tail = core->work.free_items = NULL;
    free(core->outbox.frames.bytes);
    free(core->outbox.frames.descs);
    memset(&core->outbox.frames, 0, sizeof core->outbox.frames);
}

struct stage_item *stage_item_get(struct stage_core *core, int hidden_rows) {
    struct stage_item *it = core->work.free_items;
    size_t need = (size_t)hidden_rows * (size_t)core->hidden_size;
    if (it) {
        core->work.free_items = it->next;
    } else {
        it = calloc(1, sizeof *it);
        if (!it) {
            strata_set_error(STRATA_ENOMEM, "out of memory queueing work");
            return NULL;
        }
    }
    if (need > it->hidden_cap) {
        float *grown = realloc(it->hidden, sizeof(float) * need);
        if (!grown) {
            stage_item_put(core, it);
            strata_set_error(STRATA_ENOMEM, "out of memory for %d hidden rows", hidden_rows);
            return NULL;
        }
        it->hidden = grown;
        it->hidden_cap = need;
    }
    {
        struct stage_item keep = *it; /* the buffers, kept across recycling */
        memset(it, 0, sizeof *it);
        it->hidden = keep.hidden;
        it->hidden_cap = keep.hidden_cap;
        it->positions = keep.positions;
        it->positions_cap = keep.positions_cap;
        it->visual = keep.visual;
        it->visual_cap = keep.visual_cap;
        it->deepstack = keep.deepstack;
        it->deepstack_cap = keep.deepstack_cap;
    }
    return it;
}

void stage_item_put(struct stage_core *core, struct stage_item *item) {
    if (!item) return;
    item->next = core->work.free_items;
    core->work.free_items = item;
}

/* Makes room for `bytes` more bytes and one more descriptor, moving the live frames to the
 * front first (popped frames before them are dead by the validity rule). */
static int out_reserve(struct stage_out_queue *q, size_t bytes) {
    if (q->count == 0) {
        q->head = 0;
        q->used = 0;
    }
    if (q->head > 0 && (q->head + q->count == q->descs_cap || q->used + bytes > q->cap)) {
        size_t start = q->descs[q->head].offset;
        memmove(q->bytes, q->bytes + start, q->used - start);
        q->used -= start;
        memmove(q->descs, q->descs + q->head, sizeof *q->descs * q->count);
        for (size_t i = 0; i < q->count; i++)
            q->descs[i].offset -= start;
        q->head = 0;
    }
    if (q->count == q->descs_cap) {
        size_t cap = q->descs_cap ? 2 * q->descs_cap : 64;
        struct stage_out_desc *grown = realloc(q->descs, sizeof *grown * cap);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "out of memory for the frame queue");
        q->descs = grown;
        q->descs_cap = cap;
    }
    if (q->used + bytes > q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 1 << 16;
        uint8_t *grown;
        while (cap < q->used + bytes)
            cap *= 2;
        grown = aligned_alloc(OUT_ALIGN, cap);
        if (!grown)
            return strata_set_error(STRATA_ENOMEM, "out of memory queueing a %zu-byte frame",
                                    bytes);
        if (q->used) memcpy(grown, q->bytes, q->used);
        free(q->bytes);
        q->bytes = grown;
        q->cap = cap;
    }
    return 0;
}

/* Queues a copy of frame [len] for `link`. */
int stage_emit_raw(struct stage_core *core, enum stage_link link, uint32_t client_id,
                   const uint8_t *frame, size_t len) {
    struct stage_out_queue *q = &core->outbox.frames;
    size_t slot = round_up(len ? len : 1, OUT_ALIGN);
    struct stage_out_desc *d;
    int rc = out_reserve(q, slot);
    if (rc < 0) return rc;
    memcpy(q->bytes + q->used, frame, len);
    d = &q->descs[q->head + q->count++];
    d->link = link;
    d->client_id = client_id;
    d->offset = q->used;
    d->len = len;
    q->used += slot;
    core->stats.frames_out++;
    return 0;
}

int stage_core_pop_frame(struct stage_core *core, struct stage_frame *out) {
    struct stage_out_queue *q = &core->outbox.frames;
    const struct stage_out_desc *d;
    memset(out, 0, sizeof *out);
    if (q->count == 0) return 0;
    d = &q->descs[q->head];
    out->link = d->link;
    out->client_id = d->client_id;
    out->data = q->bytes + d->offset;
    out->len = d->len;
    q->head++;
    q->count--;
    return 1;
}
