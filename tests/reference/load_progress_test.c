/* reference_load_options.progress (reference/model_load.c, model_memory.c, model_q8.c): on
 * every golden case, whole and split in two stages, with the weights copied to the huge-page
 * arena, left in the file, or quantised to q8, the callback sees one fixed total (the stored
 * bytes the model holds: reference_model_weight_bytes), done bytes that never decrease,
 * never pass it and end at it, and the phase that reads the views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "reference/model.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

struct seen {
    int calls, bad_total, backwards, past_total, phase_calls;
    uint64_t total, last;
    const char *want_phase; /* calls with this phase are counted in phase_calls */
};

static void record(void *ctx, uint64_t done, uint64_t total, const char *phase) {
    struct seen *s = ctx;
    if (s->calls == 0) s->total = total;
    if (total != s->total) s->bad_total++;
    if (s->calls > 0 && done < s->last) s->backwards++;
    if (done > total) s->past_total++;
    if (phase && s->want_phase && strcmp(phase, s->want_phase) == 0) s->phase_calls++;
    s->last = done;
    s->calls++;
}

enum mode { COPIED, IN_FILE, Q8 };

static void check_load(const struct golden_case *gc, int start, int end, enum mode mode) {
    static const char *const phase[] = {"copying to huge pages", "reading tensors",
                                        "quantising to q8"};
    struct seen s = {.want_phase = phase[mode]};
    const int L = gc->cfg.num_layers;
    struct reference_load_options opt = {.layer_start = start,
                                         .layer_end = end,
                                         .with_embed = start == 0,
                                         .with_head = end == L,
                                         .num_threads = 1,
                                         .weights_dtype = mode == Q8 ? REFERENCE_WEIGHTS_Q8
                                                                     : REFERENCE_WEIGHTS_STORED,
                                         .weights_in_file = mode == IN_FILE,
                                         .progress = {record, &s}};
    struct reference_model *m = NULL;
    int rc = reference_model_load(&m, &gc->cfg, gc->st, &opt);
    if (rc) fail_msg("%s [%d,%d) mode %d: %s", gc->name, start, end, mode, strata_last_error());
    if (s.calls < 2 || s.bad_total || s.backwards || s.past_total)
        fail_msg("%s [%d,%d) mode %d: %d calls, %d with another total, %d backwards, %d past it",
                 gc->name, start, end, mode, s.calls, s.bad_total, s.backwards, s.past_total);
    assert_int_equal(s.total, reference_model_weight_bytes(m));
    assert_int_equal(s.last, s.total);
    /* The phase that pages the views in reports them (q8 and the copy read every view). */
    if (s.phase_calls == 0)
        fail_msg("%s [%d,%d): no '%s' report", gc->name, start, end, s.want_phase);
    reference_model_free(m);
}

static void test_progress_every_golden(void **state) {
    (void)state;
    for (int i = 0; golden_case_names[i]; ++i) {
        struct golden_case gc;
        if (golden_case_open(&gc, golden_case_names[i]))
            fail_msg("%s: %s", golden_case_names[i], strata_last_error());
        const int L = gc.cfg.num_layers;
        for (int mode = COPIED; mode <= Q8; ++mode) {
            check_load(&gc, 0, L, (enum mode)mode);
            if (L >= 2) { /* a tied head read by a last stage without the embedding */
                check_load(&gc, 0, L / 2, (enum mode)mode);
                check_load(&gc, L / 2, L, (enum mode)mode);
            }
        }
        printf("%-18s progress: monotonic to the total, copied / in file / q8, whole and split\n",
               gc.name);
        golden_case_close(&gc);
    }
}

/* No callback: the same load, nothing called (and nothing to crash on). */
static void test_no_callback(void **state) {
    (void)state;
    struct golden_case gc;
    assert_int_equal(golden_case_open(&gc, golden_case_names[0]), STRATA_OK);
    struct reference_model *m = NULL;
    assert_int_equal(golden_model(&m, &gc, 0, gc.cfg.num_layers, 1, 1, 1), STRATA_OK);
    reference_model_free(m);
    golden_case_close(&gc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_every_golden),
        cmocka_unit_test(test_no_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
