/* stderr logger behind log.h. */
#include "runtime/base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_prefix[64];
/* Atomic so the level test before formatting needs no lock. */
static atomic_int log_max = STRATA_LOG_INFO;

void strata_log_setup(const char *prefix, enum strata_log_level max_level) {
    pthread_mutex_lock(&log_lock);
    snprintf(log_prefix, sizeof log_prefix, "%s", prefix ? prefix : "");
    pthread_mutex_unlock(&log_lock);
    atomic_store(&log_max, (int)max_level);
}

int strata_log_enabled(enum strata_log_level level) {
    return (int)level <= atomic_load(&log_max);
}

const char *strata_log_level_name(enum strata_log_level level) {
    switch (level) {
    case STRATA_LOG_ERROR: return "error";
    case STRATA_LOG_WARN: return "warn";
    case STRATA_LOG_INFO: return "info";
    case STRATA_LOG_DEBUG: return "debug";
    default: return "?";
    }
}

void strata_log(enum strata_log_level level, const char *fmt, ...) {
    char line[2048];
    struct timespec ts;
    va_list ap;
    if (!strata_log_enabled(level)) return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* Wall time, so operators can line the logs of several machines up. */
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "[%s%s%ld.%03ld] %s: %s\n", log_prefix, log_prefix[0] ? " " : "",
            (long)ts.tv_sec, ts.tv_nsec / 1000000, strata_log_level_name(level), line);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}
