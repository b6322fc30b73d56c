/* The simulator's virtual clock: a discrete-event queue ordered by virtual time.
 *
 * Every simulated happening (a frame arriving at a stage, a stage finishing a compute
 * step, a stage being killed, a peer timeout firing) is an event with a virtual time in
 * nanoseconds. The coordinator pops the earliest event and the clock jumps to its time;
 * nothing in the simulation ever reads the wall clock to decide what happens next, so a
 * run is deterministic.
 *
 * Order: earliest time first; ties broken by the event's stage index (lower first), then
 * by the sequence number the clock gave it when it was scheduled (earlier first). That is
 * a total order, so two runs that schedule the same events see the same pops.
 *
 * Events may carry a heap-allocated payload (`data`, from malloc). The clock owns the
 * payload of every event still queued: vclock_free() frees them. A popped event's payload
 * belongs to the caller. */
#ifndef STRATA_SIM_VIRTUAL_CLOCK_H
#define STRATA_SIM_VIRTUAL_CLOCK_H

#include <stddef.h>
#include <stdint.h>

struct sim_event {
    int64_t time_ns; /* virtual time the event happens at */
    int stage;       /* stage the event is addressed to (tie-breaker) */
    uint64_t seq;    /* assigned by the clock: scheduling order (tie-breaker) */
    int kind;        /* meaning defined by the user of the clock */
    int64_t arg;     /* small integer argument (e.g. source stage) */
    void *data;      /* malloc'd payload or NULL; owned by the clock while queued */
    size_t len;      /* bytes in data */
};

struct virtual_clock {
    int64_t now_ns;         /* time of the last popped event (starts at 0) */
    uint64_t next_seq;      /* next sequence number to hand out */
    struct sim_event *heap; /* [capacity] binary min-heap on (time, stage, seq) */
    size_t count;           /* events queued */
    size_t capacity;        /* heap slots allocated */
};

/* Starts an empty clock at virtual time 0. */
int vclock_init(struct virtual_clock *clock);
/* Frees the queue and the payloads of events still in it; accepts a zeroed clock. */
void vclock_free(struct virtual_clock *clock);

/* Queues an event at absolute virtual time `time_ns` (must not be before now_ns:
 * STRATA_EINVAL). On success the clock owns `data`; on failure the caller keeps it.
 * `seq_out` (may be NULL) receives the event's sequence number. */
int vclock_schedule(struct virtual_clock *clock, int64_t time_ns, int stage, int kind, int64_t arg,
                    void *data, size_t len, uint64_t *seq_out);

/* Pops the earliest event into *out and advances now_ns to its time. Returns 1 when an
 * event was popped, 0 when the queue is empty. The caller owns out->data. */
int vclock_pop(struct virtual_clock *clock, struct sim_event *out);

/* The earliest queued event without removing it, or NULL when empty. */
const struct sim_event *vclock_peek(const struct virtual_clock *clock);

/* Removes every queued event of `kind` addressed to `stage` (kind < 0: any kind), freeing
 * their payloads; returns how many were removed. Used when a stage is killed. */
size_t vclock_cancel(struct virtual_clock *clock, int stage, int kind);

#endif
