/* The event loop (see event_loop.h). poll() over a fixed table of file events: the
 * servers it serves watch at most a few hundred fds, so a linear table is simpler than
 * epoll and as fast; a pass snapshots the table into the pollfd array, and each snapshot
 * entry carries its registration's serial, so an fd that a callback deletes (or deletes
 * and reuses) in the same pass is never fired for stale revents. Timers are a small
 * unsorted array: a pass scans it for the nearest deadline. */
#include "runtime/base/event_loop.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

struct file_event {
    int fd; /* -1: free slot */
    int mask;
    event_file_proc proc;
    event_buffered_proc buffered;
    void *data;
    uint64_t serial; /* this registration's: tells a reused fd from the one polled */
};

struct timer {
    int64_t id; /* 0: free slot */
    int64_t deadline_ms;
    uint64_t ran_pass; /* the pass that last ran it: once per pass */
    event_timer_proc proc;
    void *data;
};

struct event_loop {
    int max_files;
    struct file_event *files; /* [max_files] */
    struct pollfd *pfd;       /* [1 + max_files] a pass's snapshot; [0] the wake pipe */
    int *snap_slot;           /* [1 + max_files] which file slot each pfd entry was */
    uint64_t *snap_serial;    /* [1 + max_files] and its serial then */
    uint64_t next_serial;
    struct timer *timers; /* [num_timers] */
    int num_timers;
    int64_t next_timer_id;
    uint64_t pass;
    int wake[2]; /* [0] polled by the loop, [1] written by event_loop_wake */
    event_wake_proc wake_proc;
    void *wake_data;
    atomic_int stop;
};

static int valid_mask(int mask) {
    return (mask & ~(EVENT_READ | EVENT_WRITE)) == 0;
}

static struct file_event *find_file(const struct event_loop *loop, int fd) {
    if (fd < 0) return NULL;
    for (int i = 0; i < loop->max_files; i++)
        if (loop->files[i].fd == fd) return &loop->files[i];
    return NULL;
}

static struct timer *find_timer(const struct event_loop *loop, int64_t id) {
    if (id <= 0) return NULL;
    for (int i = 0; i < loop->num_timers; i++)
        if (loop->timers[i].id == id) return &loop->timers[i];
    return NULL;
}

int event_loop_create(struct event_loop **out, int max_files) {
    struct event_loop *loop = NULL;
    int rc;
    *out = NULL;
    if (max_files <= 0 || max_files > 65536)
        return strata_set_error(STRATA_EINVAL, "event loop: max_files %d is out of [1, 65536]",
                                max_files);
    loop = calloc(1, sizeof *loop);
    if (!loop) return strata_set_error(STRATA_ENOMEM, "event loop: out of memory");
    loop->wake[0] = loop->wake[1] = -1;
    loop->max_files = max_files;
    loop->files = calloc((size_t)max_files, sizeof *loop->files);
    loop->pfd = calloc((size_t)max_files + 1, sizeof *loop->pfd);
    loop->snap_slot = calloc((size_t)max_files + 1, sizeof *loop->snap_slot);
    loop->snap_serial = calloc((size_t)max_files + 1, sizeof *loop->snap_serial);
    if (!loop->files || !loop->pfd || !loop->snap_slot || !loop->snap_serial) {
        rc = strata_set_error(STRATA_ENOMEM, "event loop: out of memory for %d fds", max_files);
        goto fail;
    }
    for (int i = 0; i < max_files; i++)
        loop->files[i].fd = -1;
    if (pipe2(loop->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        rc = strata_set_error(STRATA_EIO, "event loop: pipe2: %s", strerror(errno));
        goto fail;
    }
    *out = loop;
    return 0;
fail:
    event_loop_free(loop);
    return rc;
}

void event_loop_free(struct event_loop *loop) {
    if (!loop) return;
    if (loop->wake[0] >= 0) close(loop->wake[0]);
    if (loop->wake[1] >= 0) close(loop->wake[1]);
    free(loop->files);
    free(loop->pfd);
    free(loop->snap_slot);
    free(loop->snap_serial);
    free(loop->timers);
    free(loop);
}

int event_add_file(struct event_loop *loop, int fd, int mask, event_file_proc proc,
                   event_buffered_proc buffered, void *data) {
    struct file_event *slot = NULL;
    if (fd < 0) return strata_set_error(STRATA_EINVAL, "event loop: bad fd %d", fd);
    if (!valid_mask(mask) || !proc)
        return strata_set_error(STRATA_EINVAL, "event loop: fd %d: bad mask %d or no callback", fd,
                                mask);
    if (find_file(loop, fd))
        return strata_set_error(STRATA_EINVAL, "event loop: fd %d is already registered", fd);
    for (int i = 0; i < loop->max_files && !slot; i++)
        if (loop->files[i].fd < 0) slot = &loop->files[i];
    if (!slot)
        return strata_set_error(STRATA_EBUSY, "event loop: fd %d: all %d file events are in use",
                                fd, loop->max_files);
    *slot = (struct file_event){.fd = fd,
                                .mask = mask,
                                .proc = proc,
                                .buffered = buffered,
                                .data = data,
                                .serial = ++loop->next_serial};
    return 0;
}

int event_modify_file(struct event_loop *loop, int fd, int mask) {
    struct file_event *f = find_file(loop, fd);
    if (!valid_mask(mask))
        return strata_set_error(STRATA_EINVAL, "event loop: fd %d: bad mask %d", fd, mask);
    if (!f) return strata_set_error(STRATA_ENOTFOUND, "event loop: fd %d is not registered", fd);
    f->mask = mask;
    return 0;
}

int event_del_file(struct event_loop *loop, int fd) {
    struct file_event *f = find_file(loop, fd);
    if (!f) return strata_set_error(STRATA_ENOTFOUND, "event loop: fd %d is not registered", fd);
    memset(f, 0, sizeof *f);
    f->fd = -1;
    return 0;
}

int event_file_mask(const struct event_loop *loop, int fd) {
    const struct file_event *f = find_file(loop, fd);
    return f ? f->mask : -1;
}

int64_t event_add_timer_at(struct event_loop *loop, int64_t deadline_ms, event_timer_proc proc,
                           void *data) {
    struct timer *t = NULL;
    if (!proc) return strata_set_error(STRATA_EINVAL, "event loop: a timer without a callback");
    for (int i = 0; i < loop->num_timers && !t; i++)
        if (loop->timers[i].id == 0) t = &loop->timers[i];
    if (!t) {
        struct timer *grown = realloc(loop->timers, ((size_t)loop->num_timers + 1) * sizeof *grown);
        if (!grown) return strata_set_error(STRATA_ENOMEM, "event loop: out of memory for a timer");
        loop->timers = grown;
        t = &loop->timers[loop->num_timers++];
    }
    /* ran_pass = this pass: a timer added by a callback waits for the next pass, so a
     * timer re-adding itself with delay 0 cannot keep one pass running forever. */
    *t = (struct timer){.id = ++loop->next_timer_id,
                        .deadline_ms = deadline_ms,
                        .ran_pass = loop->pass,
                        .proc = proc,
                        .data = data};
    return t->id;
}

int64_t event_add_timer(struct event_loop *loop, int64_t delay_ms, event_timer_proc proc,
                        void *data) {
    if (delay_ms < 0)
        return strata_set_error(STRATA_EINVAL, "event loop: negative timer delay %lld ms",
                                (long long)delay_ms);
    return event_add_timer_at(loop, cli_now_ms() + delay_ms, proc, data);
}

int event_del_timer(struct event_loop *loop, int64_t id) {
    struct timer *t = find_timer(loop, id);
    if (!t) return strata_set_error(STRATA_ENOTFOUND, "event loop: no timer %lld", (long long)id);
    memset(t, 0, sizeof *t);
    return 0;
}

void event_loop_set_wake(struct event_loop *loop, event_wake_proc proc, void *data) {
    loop->wake_proc = proc;
    loop->wake_data = data;
}

void event_loop_wake(struct event_loop *loop) {
    /* A full pipe is already a pending wake: EAGAIN loses nothing. */
    ssize_t w = write(loop->wake[1], "w", 1);
    (void)w;
}

void event_loop_stop(struct event_loop *loop) {
    atomic_store(&loop->stop, 1);
}

int event_loop_timeout_ms(const struct event_loop *loop, int max_wait_ms) {
    int64_t wait = max_wait_ms < 0 ? -1 : max_wait_ms, now = cli_now_ms();
    for (int i = 0; i < loop->max_files; i++) {
        const struct file_event *f = &loop->files[i];
        if (f->fd >= 0 && (f->mask & EVENT_READ) && f->buffered && f->buffered(f->data)) return 0;
    }
    for (int i = 0; i < loop->num_timers; i++) {
        const struct timer *t = &loop->timers[i];
        if (t->id == 0) continue;
        int64_t d = t->deadline_ms > now ? t->deadline_ms - now : 0;
        if (wait < 0 || d < wait) wait = d;
    }
    return wait > INT_MAX ? INT_MAX : (int)wait;
}

/* Runs the timers due now, nearest deadline first, each at most once per pass. */
static int run_timers(struct event_loop *loop) {
    int ran = 0;
    for (;;) {
        int64_t now = cli_now_ms();
        struct timer *due = NULL;
        for (int i = 0; i < loop->num_timers; i++) {
            struct timer *t = &loop->timers[i];
            if (t->id && t->ran_pass != loop->pass && t->deadline_ms <= now &&
                (!due || t->deadline_ms < due->deadline_ms))
                due = t;
        }
        if (!due) return ran;
        int64_t id = due->id;
        due->ran_pass = loop->pass;
        /* The callback may add timers (the array may move) or delete this one. */
        int64_t next = due->proc(loop, id, due->data);
        ran++;
        struct timer *t = find_timer(loop, id);
        if (!t) continue;
        if (next < 0)
            memset(t, 0, sizeof *t);
        else
            t->deadline_ms = cli_now_ms() + next;
    }
}

int event_loop_run_once(struct event_loop *loop, int max_wait_ms) {
    int n = 0, ran = 0, timeout;
    char drain[64];
    loop->pass++;
    loop->pfd[n++] = (struct pollfd){.fd = loop->wake[0], .events = POLLIN};
    for (int i = 0; i < loop->max_files; i++) {
        const struct file_event *f = &loop->files[i];
        if (f->fd < 0 || f->mask == EVENT_NONE) continue;
        loop->pfd[n] = (struct pollfd){.fd = f->fd,
                                       .events = (short)((f->mask & EVENT_READ ? POLLIN : 0) |
                                                         (f->mask & EVENT_WRITE ? POLLOUT : 0))};
        loop->snap_slot[n] = i;
        loop->snap_serial[n++] = f->serial;
    }
    timeout = event_loop_timeout_ms(loop, max_wait_ms);
    if (poll(loop->pfd, (nfds_t)n, timeout) < 0) {
        if (errno != EINTR) return strata_set_error(STRATA_EIO, "poll: %s", strerror(errno));
        for (int k = 0; k < n; k++)
            loop->pfd[k].revents = 0; /* a signal: nothing fired, timers may be due */
    }
    /* Handoffs first: a connection handed over may replace one polled below. */
    if (loop->pfd[0].revents & POLLIN) {
        while (read(loop->wake[0], drain, sizeof drain) > 0) {
        }
        if (loop->wake_proc) {
            loop->wake_proc(loop, loop->wake_data);
            ran++;
        }
    }
    for (int k = 1; k < n; k++) {
        const struct file_event *f = &loop->files[loop->snap_slot[k]];
        short rev = loop->pfd[k].revents;
        int mask = 0;
        if (f->fd < 0 || f->serial != loop->snap_serial[k]) continue; /* deleted this pass */
        /* A hang-up or an error reads as input: the read that follows reports it. */
        if ((rev & (POLLIN | POLLHUP | POLLERR)) && (f->mask & EVENT_READ)) mask |= EVENT_READ;
        if ((rev & POLLOUT) && (f->mask & EVENT_WRITE)) mask |= EVENT_WRITE;
        if (!(mask & EVENT_READ) && (f->mask & EVENT_READ) && f->buffered && f->buffered(f->data))
            mask |= EVENT_READ;
        if (!mask) continue;
        f->proc(loop, f->fd, f->data, mask);
        ran++;
    }
    return ran + run_timers(loop);
}

int event_loop_run(struct event_loop *loop) {
    atomic_store(&loop->stop, 0);
    while (!atomic_load(&loop->stop)) {
        int rc = event_loop_run_once(loop, -1);
        if (rc < 0) return rc;
    }
    return 0;
}
