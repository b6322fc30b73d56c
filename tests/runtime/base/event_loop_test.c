/* The event loop: file events fire with the right mask, callbacks may delete fds (their own
 * or another's) mid-pass, timers run in deadline order and bound the wait, a wake from
 * another thread ends a blocked pass, buffered input fires without a readable fd, and
 * misuse comes back as clear statuses. Pipes stand in for sockets. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "runtime/base/cli.h"
#include "runtime/base/event_loop.h"
#include "runtime/base/status.h"

struct hits {
    int n;
    int fd[8];
    int mask[8];
};

static void record(struct event_loop *loop, int fd, void *data, int mask) {
    struct hits *h = data;
    (void)loop;
    if (h->n < 8) {
        h->fd[h->n] = fd;
        h->mask[h->n] = mask;
    }
    h->n++;
}

static void make_pipe(int p[2]) {
    assert_int_equal(pipe(p), 0);
}

static void file_events_fire_with_their_mask(void **state) {
    (void)state;
    struct event_loop *loop;
    struct hits h = {0};
    int a[2], b[2];
    make_pipe(a);
    make_pipe(b);
    assert_int_equal(event_loop_create(&loop, 4), 0);
    assert_int_equal(event_add_file(loop, a[0], EVENT_READ, record, NULL, &h), 0);
    assert_int_equal(event_file_mask(loop, a[0]), EVENT_READ);
    assert_int_equal(event_file_mask(loop, b[0]), -1);
    /* Nothing readable: a bounded pass fires nothing. */
    assert_int_equal(event_loop_run_once(loop, 10), 0);
    assert_int_equal(h.n, 0);
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_int_equal(h.n, 1);
    assert_int_equal(h.fd[0], a[0]);
    assert_int_equal(h.mask[0], EVENT_READ);
    /* A pipe's write end is writable at once; READ is not reported where not asked for. */
    assert_int_equal(event_add_file(loop, b[1], EVENT_NONE, record, NULL, &h), 0);
    assert_int_equal(event_modify_file(loop, b[1], EVENT_WRITE), 0);
    h.n = 0;
    assert_int_equal(event_modify_file(loop, a[0], EVENT_NONE), 0); /* idle: not polled */
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_int_equal(h.fd[0], b[1]);
    assert_int_equal(h.mask[0], EVENT_WRITE);
    /* A hang-up reads as input (the read that follows sees the close). */
    assert_int_equal(event_del_file(loop, b[1]), 0);
    assert_int_equal(event_modify_file(loop, a[0], EVENT_READ), 0);
    close(a[1]);
    h.n = 0;
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_int_equal(h.mask[0], EVENT_READ);
    event_loop_free(loop);
    close(a[0]);
    close(b[0]);
    close(b[1]);
}

/* Three readable pipes; the first to fire deletes itself and the other two, so neither of
 * them fires in the same pass although poll() reported both. */
struct deleter {
    struct event_loop *loop;
    int fds[3];
    int calls;
};

static void delete_all(struct event_loop *loop, int fd, void *data, int mask) {
    struct deleter *d = data;
    (void)fd;
    (void)mask;
    d->calls++;
    for (int i = 0; i < 3; i++)
        assert_int_equal(event_del_file(loop, d->fds[i]), 0);
}

static void handler_may_delete_itself_and_others(void **state) {
    (void)state;
    struct deleter d = {0};
    int p[3][2];
    assert_int_equal(event_loop_create(&d.loop, 8), 0);
    for (int i = 0; i < 3; i++) {
        make_pipe(p[i]);
        d.fds[i] = p[i][0];
        assert_int_equal(write(p[i][1], "x", 1), 1);
        assert_int_equal(event_add_file(d.loop, p[i][0], EVENT_READ, delete_all, NULL, &d), 0);
    }
    assert_int_equal(event_loop_run_once(d.loop, 1000), 1);
    assert_int_equal(d.calls, 1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(event_file_mask(d.loop, p[i][0]), -1);
    /* Deleting what is not there is a clear status. */
    assert_int_equal(event_del_file(d.loop, p[0][0]), STRATA_ENOTFOUND);
    assert_non_null(strstr(strata_last_error(), "not registered"));
    event_loop_free(d.loop);
    for (int i = 0; i < 3; i++) {
        close(p[i][0]);
        close(p[i][1]);
    }
}

/* A callback deletes another fd and registers a new one that reuses its number: the new
 * registration must not fire for what poll() said about the old fd. */
struct reuser {
    int victim;   /* deleted and closed by the first callback */
    int replaced; /* then a new pipe takes its number */
    struct hits *h;
};

static void reuse_fd(struct event_loop *loop, int fd, void *data, int mask) {
    struct reuser *r = data;
    int q[2];
    (void)fd;
    (void)mask;
    assert_int_equal(event_del_file(loop, fd), 0);
    assert_int_equal(event_del_file(loop, r->victim), 0);
    close(r->victim);
    make_pipe(q); /* the lowest free numbers: q[0] is the victim's */
    assert_int_equal(q[0], r->victim);
    r->replaced = q[1];
    assert_int_equal(event_add_file(loop, q[0], EVENT_READ, record, NULL, r->h), 0);
}

static void deleted_fd_reused_in_pass_does_not_fire(void **state) {
    (void)state;
    struct event_loop *loop;
    struct hits h = {0};
    int a[2], b[2];
    make_pipe(a);
    make_pipe(b);
    struct reuser r = {.victim = b[0], .h = &h};
    assert_int_equal(event_loop_create(&loop, 4), 0);
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(write(b[1], "x", 1), 1);
    assert_int_equal(event_add_file(loop, a[0], EVENT_READ, reuse_fd, NULL, &r), 0);
    assert_int_equal(event_add_file(loop, b[0], EVENT_READ, record, NULL, &h), 0);
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_int_equal(h.n, 0); /* the new pipe is empty, and the old one's revents were stale */
    event_loop_free(loop);
    close(a[0]);
    close(a[1]);
    close(b[0]); /* the new pipe's read end */
    close(b[1]);
    close(r.replaced);
}

struct order {
    int n;
    int64_t ids[8];
    int runs_left; /* the periodic timer */
};

static int64_t once(struct event_loop *loop, int64_t id, void *data) {
    struct order *o = data;
    (void)loop;
    o->ids[o->n++] = id;
    return EVENT_TIMER_DONE;
}

static int64_t periodic(struct event_loop *loop, int64_t id, void *data) {
    struct order *o = data;
    (void)loop;
    o->ids[o->n++] = id;
    return --o->runs_left > 0 ? 5 : EVENT_TIMER_DONE;
}

static void timers_fire_in_deadline_order_and_bound_the_wait(void **state) {
    (void)state;
    struct event_loop *loop;
    struct order o = {0};
    assert_int_equal(event_loop_create(&loop, 1), 0);
    assert_int_equal(event_loop_timeout_ms(loop, -1), -1); /* nothing: wait forever */
    assert_int_equal(event_loop_timeout_ms(loop, 100), 100);
    int64_t now = cli_now_ms();
    int64_t late = event_add_timer_at(loop, now + 30, once, &o);
    int64_t early = event_add_timer_at(loop, now + 10, once, &o);
    int64_t middle = event_add_timer_at(loop, now + 20, once, &o);
    assert_true(late > 0 && early > 0 && middle > 0);
    int t = event_loop_timeout_ms(loop, 1000);
    assert_true(t >= 0 && t <= 10); /* the nearest deadline, not the bound */
    assert_int_equal(event_loop_timeout_ms(loop, 3), 3);
    /* Once all three are due, one pass runs them nearest first. */
    usleep(40 * 1000);
    assert_int_equal(event_loop_timeout_ms(loop, 1000), 0);
    assert_int_equal(event_loop_run_once(loop, 1000), 3);
    assert_int_equal(o.n, 3);
    assert_true(o.ids[0] == early && o.ids[1] == middle && o.ids[2] == late);
    assert_int_equal(event_loop_timeout_ms(loop, -1), -1); /* all done */
    /* A periodic timer: the pass waits for it (no fd, no bound), three runs, then done. */
    o.n = 0;
    o.runs_left = 3;
    int64_t p = event_add_timer(loop, 5, periodic, &o);
    int64_t t0 = cli_now_ms();
    while (o.n < 3)
        assert_true(event_loop_run_once(loop, -1) >= 0);
    assert_true(cli_now_ms() - t0 >= 10);
    assert_int_equal(event_del_timer(loop, p), STRATA_ENOTFOUND); /* it ended itself */
    /* A deleted timer never fires. */
    o.n = 0;
    int64_t gone = event_add_timer(loop, 0, once, &o);
    assert_int_equal(event_del_timer(loop, gone), 0);
    assert_int_equal(event_loop_run_once(loop, 5), 0);
    assert_int_equal(o.n, 0);
    event_loop_free(loop);
}

struct waker {
    struct event_loop *loop;
    int woken;
};

static void on_wake(struct event_loop *loop, void *data) {
    struct waker *w = data;
    (void)loop;
    w->woken++;
}

static void *wake_later(void *arg) {
    struct waker *w = arg;
    usleep(50 * 1000);
    event_loop_wake(w->loop);
    return NULL;
}

static void wake_from_another_thread_ends_a_blocked_pass(void **state) {
    (void)state;
    struct waker w = {0};
    pthread_t t;
    assert_int_equal(event_loop_create(&w.loop, 1), 0);
    event_loop_set_wake(w.loop, on_wake, &w);
    assert_int_equal(pthread_create(&t, NULL, wake_later, &w), 0);
    int64_t t0 = cli_now_ms();
    assert_int_equal(event_loop_run_once(w.loop, -1), 1); /* no bound: only the wake ends it */
    assert_int_equal(w.woken, 1);
    assert_true(cli_now_ms() - t0 >= 40);
    pthread_join(t, NULL);
    /* Wakes before the pass coalesce into one callback. */
    event_loop_wake(w.loop);
    event_loop_wake(w.loop);
    assert_int_equal(event_loop_run_once(w.loop, 1000), 1);
    assert_int_equal(w.woken, 2);
    event_loop_free(w.loop);
}

struct buffered {
    int pending; /* "decrypted bytes" the fd does not show */
    struct hits h;
};

static int has_buffered(void *data) {
    return ((struct buffered *)data)->pending > 0;
}

static void consume(struct event_loop *loop, int fd, void *data, int mask) {
    struct buffered *b = data;
    record(loop, fd, &b->h, mask);
    b->pending--;
}

static void buffered_input_fires_without_a_readable_fd(void **state) {
    (void)state;
    struct event_loop *loop;
    struct buffered b = {.pending = 2};
    int p[2];
    make_pipe(p);
    assert_int_equal(event_loop_create(&loop, 2), 0);
    assert_int_equal(event_add_file(loop, p[0], EVENT_READ, consume, has_buffered, &b), 0);
    assert_int_equal(event_loop_timeout_ms(loop, -1), 0); /* served without waiting */
    int64_t t0 = cli_now_ms();
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_int_equal(event_loop_run_once(loop, 1000), 1);
    assert_true(cli_now_ms() - t0 < 500);
    assert_int_equal(b.h.n, 2);
    assert_int_equal(b.h.mask[0], EVENT_READ);
    /* Drained: back to waiting on the fd. */
    assert_int_equal(event_loop_timeout_ms(loop, -1), -1);
    assert_int_equal(event_loop_run_once(loop, 10), 0);
    /* Not asked for READ: buffered input does not fire it. */
    b.pending = 1;
    assert_int_equal(event_modify_file(loop, p[0], EVENT_NONE), 0);
    assert_int_equal(event_loop_run_once(loop, 10), 0);
    event_loop_free(loop);
    close(p[0]);
    close(p[1]);
}

static void misuse_gives_clear_statuses(void **state) {
    (void)state;
    struct event_loop *loop = (struct event_loop *)1;
    struct hits h = {0};
    int a[2], b[2];
    assert_int_equal(event_loop_create(&loop, 0), STRATA_EINVAL);
    assert_null(loop);
    make_pipe(a);
    make_pipe(b);
    assert_int_equal(event_loop_create(&loop, 1), 0);
    assert_int_equal(event_add_file(loop, -1, EVENT_READ, record, NULL, &h), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "bad fd -1"));
    assert_int_equal(event_add_file(loop, a[0], 4, record, NULL, &h), STRATA_EINVAL);
    assert_int_equal(event_add_file(loop, a[0], EVENT_READ, NULL, NULL, &h), STRATA_EINVAL);
    assert_int_equal(event_add_file(loop, a[0], EVENT_READ, record, NULL, &h), 0);
    assert_int_equal(event_add_file(loop, a[0], EVENT_READ, record, NULL, &h), STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "already registered"));
    assert_int_equal(event_add_file(loop, b[0], EVENT_READ, record, NULL, &h), STRATA_EBUSY);
    assert_non_null(strstr(strata_last_error(), "all 1 file events are in use"));
    assert_int_equal(event_modify_file(loop, b[0], EVENT_READ), STRATA_ENOTFOUND);
    assert_int_equal(event_modify_file(loop, a[0], 8), STRATA_EINVAL);
    assert_int_equal(event_add_timer(loop, -5, once, NULL), STRATA_EINVAL);
    assert_int_equal(event_add_timer(loop, 5, NULL, NULL), STRATA_EINVAL);
    assert_int_equal(event_del_timer(loop, 12345), STRATA_ENOTFOUND);
    /* After a delete the slot is free again. */
    assert_int_equal(event_del_file(loop, a[0]), 0);
    assert_int_equal(event_add_file(loop, b[0], EVENT_READ, record, NULL, &h), 0);
    event_loop_free(loop);
    event_loop_free(NULL);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* event_loop_run until a timer stops it. */
static int64_t stop_it(struct event_loop *loop, int64_t id, void *data) {
    (void)id;
    (*(int *)data)++;
    event_loop_stop(loop);
    return EVENT_TIMER_DONE;
}

static void run_until_stopped(void **state) {
    (void)state;
    struct event_loop *loop;
    int stopped = 0;
    assert_int_equal(event_loop_create(&loop, 1), 0);
    assert_true(event_add_timer(loop, 5, stop_it, &stopped) > 0);
    assert_int_equal(event_loop_run(loop), 0);
    assert_int_equal(stopped, 1);
    event_loop_free(loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(file_events_fire_with_their_mask),
        cmocka_unit_test(handler_may_delete_itself_and_others),
        cmocka_unit_test(deleted_fd_reused_in_pass_does_not_fire),
        cmocka_unit_test(timers_fire_in_deadline_order_and_bound_the_wait),
        cmocka_unit_test(wake_from_another_thread_ends_a_blocked_pass),
        cmocka_unit_test(buffered_input_fires_without_a_readable_fd),
        cmocka_unit_test(misuse_gives_clear_statuses),
        cmocka_unit_test(run_until_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
