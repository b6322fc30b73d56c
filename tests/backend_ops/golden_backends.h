/* The golden-backend harness (golden_backends_test.c) as its further checks use it
 * (golden_backends_checks.c): which device the run tests, how a backend is opened on a golden
 * case's role, the prompt's first forward, and the decode-graph count. One test binary. */
#ifndef STRATA_TESTS_BACKEND_OPS_GOLDEN_BACKENDS_H
#define STRATA_TESTS_BACKEND_OPS_GOLDEN_BACKENDS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/decoder_io.h"
#include "runtime/stage/backend.h"
#include "tests/reference/golden_case.h"

#define MAX_STAGES 3

extern const char *device;                  /* the device under test ("cpu", "cuda:0") */
extern _Thread_local size_t open_kv_memory; /* the KV budget open_on gives (0: every slot) */
extern enum ops_dtype kv_dtype;             /* what every backend's cache stores (--kv-dtype) */

/* Opens `dev`'s backend for layers [start, end) of the case (2 slots of max_seq positions),
 * checking its load progress reports. */
int open_on(struct stage_backend **be, const char *dev, const struct golden_case *gc, int start,
            int end, int max_seq);

/* The prompt's forward item and hidden rows, VL inputs merged as HF's model does. */
struct prefill {
    float *hidden, *deepstack;
    uint8_t *visual;
    struct forward_item item;
};
int prefill_inputs(struct prefill *p, const struct golden_case *gc, struct stage_backend *first);

/* Adds the decode-graph launches a backend reports to this thread's counts. */
void count_graphs(const struct stage_backend *be);

/* Checks on one backend [0, L) beyond the splits; each returns 0 when it holds, else 1 with a
 * line: batched with a second request, speculative steps (a right and a wrong draft, the
 * wrong row dropped), the KV pool under a budget, and an answer's decoded blocks reused by a
 * next turn's prefill; `solo` [n_steps, V] is the solo run. */
int check_batched(const struct golden_case *gc, const char *name, const float *solo);
int check_speculative(const struct golden_case *gc, const char *name, const float *solo);
int check_kv_pool(const struct golden_case *gc, const char *name, const float *solo);
int check_answer_reuse(const struct golden_case *gc, const char *name, const float *solo);

#endif
