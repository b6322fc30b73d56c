/* The binaries' load-progress reporter: a strata_progress callback (runtime/base/progress.h)
 * that prints lines such as
 *     loading weights: 43% (5.1 / 11.9 GB) 2.3 s, copying to huge pages
 *     loading weights: done, 11.9 GB in 5.4 s (2.2 GB/s)
 * to the FILE a main gives it (stderr: stdout carries the startup summary the tests parse).
 *
 * When: always (PROGRESS_ALWAYS, e.g. STRATA_PROGRESS=1), never (PROGRESS_NEVER,
 * STRATA_PROGRESS=0), or by default (PROGRESS_AUTO) when the stream is a terminal or once the
 * load has run longer than 2 s, so the millisecond loads of tests and tiny models leave no
 * lines in logs. At most one line per 0.5 s, plus the 100% one and the final summary. */
#ifndef STRATA_RUNTIME_BASE_PROGRESS_PRINTER_H
#define STRATA_RUNTIME_BASE_PROGRESS_PRINTER_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/base/progress.h"

enum progress_mode { PROGRESS_AUTO = 0, PROGRESS_ALWAYS = 1, PROGRESS_NEVER = 2 };

struct progress_printer {
    FILE *out;
    const char *what; /* "loading weights" */
    enum progress_mode mode;
    int is_tty;     /* out is a terminal (AUTO prints from the start) */
    double t_start; /* cli_now_sec() at init */
    double t_last;  /* time of the last line printed (< 0: none yet) */
    int finished;   /* the final line was printed (or the load ended silently) */
};

/* The mode named by the environment variable `env_name` ("1": always, "0": never, unset or
 * anything else: auto). Only a main reads the environment. */
enum progress_mode progress_mode_from_env(const char *env_name);

/* Starts the clock; `what` is the lines' prefix (borrowed: must outlive the printer). */
void progress_printer_init(struct progress_printer *p, FILE *out, const char *what,
                           enum progress_mode mode);

/* The strata_progress callback (ctx = the printer). */
void progress_printer_report(void *ctx, uint64_t done_bytes, uint64_t total_bytes,
                             const char *phase);

/* progress_printer_report at time `now` (cli_now_sec() seconds; tests pass their own). */
void progress_printer_step(struct progress_printer *p, double now, uint64_t done_bytes,
                           uint64_t total_bytes, const char *phase);

/* {progress_printer_report, p}: what a main puts in the load options. */
struct strata_progress progress_printer_callback(struct progress_printer *p);

#endif
