/* A process's CPUs: see cpu_pin.h. */
#include "runtime/base/cpu_pin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

/* One id at *p: digits only (no sign, no spaces), below CPU_SETSIZE; advances *p. */
static int parse_id(const char **p, int *id) {
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9') return -1;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s++ - '0');
        if (v >= CPU_SETSIZE) return -1;
    }
    *id = (int)v;
    *p = s;
    return 0;
}

int cpu_pin_parse(const char *text, struct cpu_pin *out) {
    struct cpu_pin p;
    const char *s = text;
    CPU_ZERO(&p.set);
    for (;;) {
        int a, b;
        if (parse_id(&s, &a) < 0) break;
        b = a;
        if (*s == '-') {
            s++;
            if (parse_id(&s, &b) < 0 || b < a) break;
        }
        for (int c = a; c <= b; c++)
            CPU_SET(c, &p.set);
        if (*s == '\0') {
            p.count = CPU_COUNT(&p.set);
            *out = p;
            return 0;
        }
        if (*s++ != ',') break;
    }
    return strata_set_error(STRATA_EINVAL,
                            "needs a CPU list such as 0-3,8 (ids below %d, ranges ascending), "
                            "got \"%s\"",
                            CPU_SETSIZE, text);
}

int cpu_pin_current(struct cpu_pin *out) {
    CPU_ZERO(&out->set);
    if (sched_getaffinity(0, sizeof out->set, &out->set) != 0)
        return strata_set_error(STRATA_EIO, "cannot read this process's CPUs: %s", strerror(errno));
    out->count = CPU_COUNT(&out->set);
    return 0;
}

void cpu_pin_format(const struct cpu_pin *p, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && used < n; c++) {
        if (!CPU_ISSET(c, &p->set)) continue;
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &p->set))
            end++;
        int w = end == c ? snprintf(buf + used, n - used, "%s%d", used ? "," : "", c)
                         : snprintf(buf + used, n - used, "%s%d-%d", used ? "," : "", c, end);
        if (w < 0) break;
        used += (size_t)w;
        c = end;
    }
}

/* The CPUs this thread may be given (online, and in its cgroup's cpuset): what the kernel
 * keeps of a mask naming every id, read back and the thread's own mask restored. A thread's
 * mask now is no bound: a process started under `taskset -c 0` may still widen. */
static int allowed_cpus(struct cpu_pin *out) {
    struct cpu_pin saved, every;
    int rc = cpu_pin_current(&saved);
    if (rc < 0) return rc;
    memset(&every.set, 0xff, sizeof every.set);
    if (sched_setaffinity(0, sizeof every.set, &every.set) != 0)
        return strata_set_error(STRATA_EIO, "cannot read the CPUs this process may use: %s",
                                strerror(errno));
    rc = cpu_pin_current(out);
    if (sched_setaffinity(0, sizeof saved.set, &saved.set) != 0 && rc == 0)
        rc =
            strata_set_error(STRATA_EIO, "cannot restore this process's CPUs: %s", strerror(errno));
    return rc;
}

int cpu_pin_apply(const struct cpu_pin *p, int threads) {
    struct cpu_pin allowed;
    char have[256];
    if (p->count < 1) return strata_set_error(STRATA_EINVAL, "no CPU named");
    int rc = allowed_cpus(&allowed);
    if (rc < 0) return rc;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &p->set) && !CPU_ISSET(c, &allowed.set)) {
            cpu_pin_format(&allowed, have, sizeof have);
            return strata_set_error(STRATA_EINVAL,
                                    "CPU %d is not one this process may run on (it may use %s)", c,
                                    have);
        }
    }
    if (threads > p->count)
        return strata_set_error(STRATA_EINVAL,
                                "%d threads on %d CPU(s): each compute thread wants a CPU of its "
                                "own (name more CPUs or run fewer threads)",
                                threads, p->count);
    if (sched_setaffinity(0, sizeof p->set, &p->set) != 0)
        return strata_set_error(STRATA_EIO, "cannot pin to these CPUs: %s", strerror(errno));
    return 0;
}
