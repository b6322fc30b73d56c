/* A small single-threaded event loop, after redis's ae.c: file events, timers and a
 * cross-thread wake, run one pass at a time.
 *
 * File events: a callback per registered fd, fired with the mask of what happened
 * (EVENT_READ when poll() reports input, a hang-up or an error; EVENT_WRITE when the socket
 * takes more). A file event may also carry a "has buffered input" callback: a TLS
 * connection can hold decrypted bytes that poll() cannot see, and such an fd must be served
 * without waiting for the socket (the loop then polls without blocking and fires
 * EVENT_READ). The loop knows nothing of connections: that callback keeps it below wire/.
 *
 * Timers: a callback at a deadline; it returns the delay to its next run (a period) or
 * EVENT_TIMER_DONE. The poll timeout of a pass comes from the nearest timer, so periodic
 * housekeeping runs on its own cadence instead of on every pass.
 *
 * Cross-thread wake: event_loop_wake may be called from any thread (or a signal handler);
 * the loop's wake callback then runs on the loop's thread. What is handed over (accepted
 * connections, finished work) stays in the caller's own queue under the caller's lock;
 * the loop only carries the "look now".
 *
 * Dispatch is safe against changes made by callbacks: a callback may delete or add any
 * file event or timer, its own included; an fd deleted during a pass (and perhaps reused
 * by a new registration) is not fired for what poll() said about the old one.
 *
 * Everything except event_loop_wake is for the loop's thread only. */
#ifndef STRATA_RUNTIME_BASE_EVENT_LOOP_H
#define STRATA_RUNTIME_BASE_EVENT_LOOP_H

#include <stdint.h>

#define EVENT_NONE 0
#define EVENT_READ 1
#define EVENT_WRITE 2

#define EVENT_TIMER_DONE (-1) /* a timer callback's return: delete the timer */

struct event_loop;

/* `mask`: what fired (EVENT_READ and/or EVENT_WRITE, within what was asked for). */
typedef void (*event_file_proc)(struct event_loop *loop, int fd, void *data, int mask);
/* Non-zero when input waits that poll() on the fd cannot see. */
typedef int (*event_buffered_proc)(void *data);
/* Returns the delay in ms to the timer's next run (0: on the next pass), or
 * EVENT_TIMER_DONE. `id` is the timer's, as event_add_timer returned it. */
typedef int64_t (*event_timer_proc)(struct event_loop *loop, int64_t id, void *data);
typedef void (*event_wake_proc)(struct event_loop *loop, void *data);

/* A loop for up to `max_files` file events (the wake pipe is not counted). 0 with *out,
 * or STRATA_EINVAL / STRATA_ENOMEM / STRATA_EIO (the wake pipe). */
int event_loop_create(struct event_loop **out, int max_files);
/* Frees the loop and its wake pipe; accepts NULL. Registered fds are the caller's: they
 * are not closed. */
void event_loop_free(struct event_loop *loop);

/* Registers `fd` for `mask` (EVENT_READ | EVENT_WRITE, or EVENT_NONE to hold the slot
 * idle) with its callback, optional buffered-input callback and their data. STRATA_EINVAL
 * for a negative fd, a bad mask, no callback or an fd already registered; STRATA_EBUSY
 * when max_files are registered. */
int event_add_file(struct event_loop *loop, int fd, int mask, event_file_proc proc,
                   event_buffered_proc buffered, void *data);
/* Sets what a registered fd is watched for. STRATA_ENOTFOUND when it is not registered,
 * STRATA_EINVAL for a bad mask. */
int event_modify_file(struct event_loop *loop, int fd, int mask);
/* Unregisters `fd` (the fd itself stays open: the caller closes it). Safe during a pass,
 * for any fd. STRATA_ENOTFOUND when it is not registered. */
int event_del_file(struct event_loop *loop, int fd);
/* The mask `fd` is watched for, or -1 when it is not registered. */
int event_file_mask(const struct event_loop *loop, int fd);

/* A timer first run `delay_ms` from now (0: on the next pass). Returns its id (> 0), or
 * STRATA_EINVAL (negative delay, no callback) / STRATA_ENOMEM. */
int64_t event_add_timer(struct event_loop *loop, int64_t delay_ms, event_timer_proc proc,
                        void *data);
/* The same with an absolute deadline on the cli_now_ms clock (a past one: the next pass). */
int64_t event_add_timer_at(struct event_loop *loop, int64_t deadline_ms, event_timer_proc proc,
                           void *data);
/* Deletes a timer; safe during a pass, from its own callback too. STRATA_ENOTFOUND when no
 * timer has that id. */
int event_del_timer(struct event_loop *loop, int64_t id);

/* The callback event_loop_wake makes the loop run (on its thread, at the start of the next
 * pass, before file events). NULL: wakes only end the wait. */
void event_loop_set_wake(struct event_loop *loop, event_wake_proc proc, void *data);
/* From any thread, or a signal handler: makes a pass that waits return and run the wake
 * callback. Wakes before the callback runs coalesce into one run. */
void event_loop_wake(struct event_loop *loop);

/* How long the next pass would wait, at most `max_wait_ms` (< 0: no bound): 0 when a file
 * event has buffered input or a timer is due, else until the nearest timer; -1 for
 * forever. What event_loop_run_once passes to poll(). */
int event_loop_timeout_ms(const struct event_loop *loop, int max_wait_ms);

/* One pass: waits (event_loop_timeout_ms) for a file event, a wake or the nearest timer,
 * then runs the wake callback, the file events that fired and the timers that are due.
 * Returns the number of callbacks run, or STRATA_EIO when poll() fails (EINTR is not a
 * failure: the pass just ends early). */
int event_loop_run_once(struct event_loop *loop, int max_wait_ms);
/* Runs passes until event_loop_stop; 0, or the first failing pass's status. */
int event_loop_run(struct event_loop *loop);
/* Makes event_loop_run return after the current pass (loop thread only; from another
 * thread, follow it with event_loop_wake). */
void event_loop_stop(struct event_loop *loop);

#endif
