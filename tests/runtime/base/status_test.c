/* The error idiom: codes come back unchanged and messages are per thread. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/base/status.h"

static void set_error_returns_code_and_keeps_message(void **state) {
    (void)state;
    assert_int_equal(strata_set_error(STRATA_ENOTFOUND, "tensor %s missing", "x.weight"),
                     STRATA_ENOTFOUND);
    assert_string_equal(strata_last_error(), "tensor x.weight missing");
    assert_string_equal(strata_status_name(STRATA_ENOTFOUND), "ENOTFOUND");
    assert_string_equal(strata_status_name(12345), "EUNKNOWN");
}

/* Context wraps the message intact, in front, however often; a message may even be formatted
 * from itself (undefined with one buffer: the old idiom garbled it). */
static void wrap_keeps_the_message_intact(void **state) {
    (void)state;
    strata_set_error(STRATA_ERANGE, "layer 40 is outside [0, 36)");
    assert_int_equal(strata_wrap_error(STRATA_EINVAL, "stage %d of %d", 2, 4), STRATA_EINVAL);
    assert_string_equal(strata_last_error(), "stage 2 of 4: layer 40 is outside [0, 36)");
    strata_wrap_error(STRATA_EINVAL, "loading %s", "/models/q");
    assert_string_equal(strata_last_error(),
                        "loading /models/q: stage 2 of 4: layer 40 is outside [0, 36)");
    strata_set_error(STRATA_EIO, "short read");
    strata_set_error(STRATA_EIO, "reading %s: %s", "a.safetensors", strata_last_error());
    assert_string_equal(strata_last_error(), "reading a.safetensors: short read");
    /* Nothing recorded before: the context alone. */
    strata_set_error(STRATA_OK, "%s", "");
    strata_wrap_error(STRATA_EIO, "opening %s", "x");
    assert_string_equal(strata_last_error(), "opening x");
    /* A message at the cap stays terminated. */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strata_set_error(STRATA_EIO, "%s", big);
    strata_wrap_error(STRATA_EIO, "ctx");
    assert_true(strlen(strata_last_error()) < sizeof big);
    assert_memory_equal(strata_last_error(), "ctx: aaa", 8);
}

struct worker {
    int id;
    int ok;
};

static void *wrap_on_a_thread(void *arg) {
    struct worker *w = arg;
    char want[128];
    w->ok = 1;
    for (int i = 0; i < 1000; i++) {
        strata_set_error(STRATA_EIO, "thread %d round %d", w->id, i);
        strata_wrap_error(STRATA_EIO, "outer %d", w->id);
        snprintf(want, sizeof want, "outer %d: thread %d round %d", w->id, w->id, i);
        if (strcmp(strata_last_error(), want) != 0) w->ok = 0;
    }
    return NULL;
}

/* Messages are per thread: four threads wrapping at once never see each other's. */
static void messages_are_per_thread(void **state) {
    (void)state;
    pthread_t t[4];
    struct worker w[4];
    strata_set_error(STRATA_EIO, "main thread");
    for (int i = 0; i < 4; i++) {
        w[i].id = i;
        assert_int_equal(pthread_create(&t[i], NULL, wrap_on_a_thread, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_true(w[i].ok);
    }
    assert_string_equal(strata_last_error(), "main thread");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(set_error_returns_code_and_keeps_message),
        cmocka_unit_test(wrap_keeps_the_message_intact),
        cmocka_unit_test(messages_are_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
