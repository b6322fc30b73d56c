/* The binaries' load-progress lines: see progress_printer.h. Time comes from the monotonic
 * clock (runtime/base/cli.h); the decision to print is made per call, so a load that turns
 * out slow starts reporting at 2 s without knowing in advance how long it will take. */
#include "runtime/base/progress_printer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"

enum { AUTO_AFTER_MS = 2000, EVERY_MS = 500 };

enum progress_mode progress_mode_from_env(const char *env_name) {
    const char *v = getenv(env_name);
    if (v && strcmp(v, "1") == 0) return PROGRESS_ALWAYS;
    if (v && strcmp(v, "0") == 0) return PROGRESS_NEVER;
    return PROGRESS_AUTO;
}

void progress_printer_init(struct progress_printer *p, FILE *out, const char *what,
                           enum progress_mode mode) {
    memset(p, 0, sizeof *p);
    p->out = out;
    p->what = what;
    p->mode = mode;
    p->is_tty = out && isatty(fileno(out));
    p->t_start = cli_now_sec();
    p->t_last = -1.0;
}

/* Bytes in the unit the total reads best in (GB from 1 GB on, MB below). */
static void amount(char *buf, size_t cap, uint64_t done, uint64_t total) {
    const int gb = total >= 1000000000ull;
    const double unit = gb ? 1e9 : 1e6;
    snprintf(buf, cap, "%.1f / %.1f %s", (double)done / unit, (double)total / unit,
             gb ? "GB" : "MB");
}

void progress_printer_report(void *ctx, uint64_t done_bytes, uint64_t total_bytes,
                             const char *phase) {
    progress_printer_step(ctx, cli_now_sec(), done_bytes, total_bytes, phase);
}

void progress_printer_step(struct progress_printer *p, double now, uint64_t done_bytes,
                           uint64_t total_bytes, const char *phase) {
    if (!p->out || p->finished || p->mode == PROGRESS_NEVER) return;
    const double elapsed = now - p->t_start;
    const int last = done_bytes >= total_bytes;
    const int on = p->mode == PROGRESS_ALWAYS || p->is_tty || elapsed * 1000.0 > AUTO_AFTER_MS;
    if (!on) {
        p->finished = last; /* a quick load: silent to the end */
        return;
    }
    if (!last && p->t_last >= 0 && (now - p->t_last) * 1000.0 < EVERY_MS) return;
    char amt[64];
    amount(amt, sizeof amt, done_bytes, total_bytes);
    const int pct = total_bytes ? (int)(100.0 * (double)done_bytes / (double)total_bytes) : 100;
    fprintf(p->out, "%s: %d%% (%s) %.1f s, %s\n", p->what, pct, amt, elapsed, phase ? phase : "");
    p->t_last = now;
    if (last) {
        const double unit = total_bytes >= 1000000000ull ? 1e9 : 1e6;
        const char *u = total_bytes >= 1000000000ull ? "GB" : "MB";
        fprintf(p->out, "%s: done, %.1f %s in %.1f s (%.2f GB/s)\n", p->what,
                (double)total_bytes / unit, u, elapsed,
                elapsed > 0 ? (double)total_bytes / 1e9 / elapsed : 0.0);
        p->finished = 1;
    }
    fflush(p->out);
}

struct strata_progress progress_printer_callback(struct progress_printer *p) {
    return (struct strata_progress){progress_printer_report, p};
}
