/* Progress of a long load (a multi-GB checkpoint paged in, copied, quantised or uploaded),
 * reported by library code through a callback the caller supplies: library code never
 * prints (house style), so a binary's main decides what, if anything, reaches the terminal
 * (runtime/base/progress_printer.h).
 *
 * Contract for a loader that takes a `struct strata_progress`: `total_bytes` is fixed for one
 * load (known up front from the manifest, runtime/model/stage_tensors.h), `done_bytes` never
 * decreases, never exceeds it, and the last call has done_bytes == total_bytes. Calls come at
 * tensor granularity from the loading thread; `phase` is a short static string ("placing
 * tensors", "copying to huge pages", ...). A NULL fn costs one branch per tensor. */
#ifndef STRATA_RUNTIME_BASE_PROGRESS_H
#define STRATA_RUNTIME_BASE_PROGRESS_H

#include <stdint.h>

typedef void (*strata_progress_fn)(void *ctx, uint64_t done_bytes, uint64_t total_bytes,
                                   const char *phase);

struct strata_progress {
    strata_progress_fn fn; /* NULL: no reports */
    void *ctx;
};

static inline void strata_progress_report(const struct strata_progress *p, uint64_t done_bytes,
                                          uint64_t total_bytes, const char *phase) {
    if (p && p->fn) p->fn(p->ctx, done_bytes, total_bytes, phase);
}

#endif
