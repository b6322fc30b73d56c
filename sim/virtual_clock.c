/* Discrete-event queue of the simulator (see virtual_clock.h): a binary min-heap keyed by
 * (time, stage, sequence number), which is a strict total order, so pops are deterministic. */
#include "sim/virtual_clock.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

/* 1 if a must pop before b. Sequence numbers are unique, so no two events compare equal. */
static int event_before(const struct sim_event *a, const struct sim_event *b) {
    if (a->time_ns != b->time_ns) return a->time_ns < b->time_ns;
    if (a->stage != b->stage) return a->stage < b->stage;
    return a->seq < b->seq;
}

static void swap_events(struct sim_event *a, struct sim_event *b) {
    struct sim_event t = *a;
    *a = *b;
    *b = t;
}

static void sift_up(struct sim_event *heap, size_t i) {
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!event_before(&heap[i], &heap[parent])) break;
        swap_events(&heap[i], &heap[parent]);
        i = parent;
    }
}

static void sift_down(struct sim_event *heap, size_t count, size_t i) {
    for (;;) {
        size_t left = 2 * i + 1, right = left + 1, best = i;
        if (left < count && event_before(&heap[left], &heap[best])) best = left;
        if (right < count && event_before(&heap[right], &heap[best])) best = right;
        if (best == i) return;
        swap_events(&heap[i], &heap[best]);
        i = best;
    }
}

int vclock_init(struct virtual_clock *clock) {
    memset(clock, 0, sizeof *clock);
    clock->capacity = 64;
    clock->heap = calloc(clock->capacity, sizeof *clock->heap);
    if (!clock->heap) {
        clock->capacity = 0;
        return strata_set_error(STRATA_ENOMEM, "virtual clock: cannot allocate event queue");
    }
    return 0;
}

void vclock_free(struct virtual_clock *clock) {
    if (!clock) return;
    for (size_t i = 0; i < clock->count; i++)
        free(clock->heap[i].data);
    free(clock->heap);
    memset(clock, 0, sizeof *clock);
}

int vclock_schedule(struct virtual_clock *clock, int64_t time_ns, int stage, int kind, int64_t arg,
                    void *data, size_t len, uint64_t *seq_out) {
    if (time_ns < clock->now_ns)
        return strata_set_error(STRATA_EINVAL,
                                "virtual clock: event at %lld ns is before now (%lld ns)",
                                (long long)time_ns, (long long)clock->now_ns);
    if (clock->count == clock->capacity) {
        size_t grown = clock->capacity ? clock->capacity * 2 : 64;
        struct sim_event *heap = realloc(clock->heap, grown * sizeof *heap);
        if (!heap)
            return strata_set_error(STRATA_ENOMEM, "virtual clock: cannot grow queue to %zu",
                                    grown);
        clock->heap = heap;
        clock->capacity = grown;
    }
    struct sim_event *ev = &clock->heap[clock->count];
    ev->time_ns = time_ns;
    ev->stage = stage;
    ev->seq = clock->next_seq++;
    ev->kind = kind;
    ev->arg = arg;
    ev->data = data;
    ev->len = len;
    if (seq_out) *seq_out = ev->seq;
    sift_up(clock->heap, clock->count);
    clock->count++;
    return 0;
}

int vclock_pop(struct virtual_clock *clock, struct sim_event *out) {
    if (clock->count == 0) return 0;
    *out = clock->heap[0];
    clock->count--;
    if (clock->count > 0) {
        clock->heap[0] = clock->heap[clock->count];
        sift_down(clock->heap, clock->count, 0);
    }
    clock->now_ns = out->time_ns;
    return 1;
}

const struct sim_event *vclock_peek(const struct virtual_clock *clock) {
    return clock->count ? &clock->heap[0] : NULL;
}

size_t vclock_cancel(struct virtual_clock *clock, int stage, int kind) {
    size_t kept = 0, removed = 0;
    for (size_t i = 0; i < clock->count; i++) {
        struct sim_event *ev = &clock->heap[i];
        if (ev->stage == stage && (kind < 0 || ev->kind == kind)) {
            free(ev->data);
            removed++;
        } else {
            clock->heap[kept++] = *ev;
        }
    }
    clock->count = kept;
    /* Rebuild the heap bottom-up; the order is total, so the result pops identically. */
    for (size_t i = kept / 2; i-- > 0;)
        sift_down(clock->heap, kept, i);
    return removed;
}
