/* The process's operator log: one line per event on stderr,
 *   "[PREFIX SECONDS.MILLIS] LEVEL: message"
 * e.g. "[stage 2 1700000000.123] warn: upstream link 127.0.0.1:4000 lost: closed".
 * The logger is the one place besides main() allowed to print. Lines from several threads
 * (a stage's acceptor and loop) never interleave: each is written whole under a lock. */
#ifndef STRATA_RUNTIME_BASE_LOG_H
#define STRATA_RUNTIME_BASE_LOG_H

enum strata_log_level { STRATA_LOG_ERROR = 0, STRATA_LOG_WARN, STRATA_LOG_INFO, STRATA_LOG_DEBUG };

/* Sets the line prefix (e.g. "stage 2"; NULL or "" for none) and the most verbose level
 * printed. Default: no prefix, STRATA_LOG_INFO. Safe to call while other threads log. */
void strata_log_setup(const char *prefix, enum strata_log_level max_level);

/* Whether a line at `level` would be printed (to skip building an expensive message). */
int strata_log_enabled(enum strata_log_level level);

/* Logs one printf-style line at `level` when level <= the configured level. */
void strata_log(enum strata_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A short fixed name for a level ("error", "warn", "info", "debug"). */
const char *strata_log_level_name(enum strata_log_level level);

#endif
