/* The CPUs a process computes on (strata-stage --cpus): a list written as taskset and numactl
 * write it ("0-3,8,10-11"), checked against the CPUs this process may use, and applied to the
 * calling thread before the process starts any other, so every thread started later (the
 * matmul pool, the links' threads) inherits it.
 *
 * Why a process would pin: two stages on one box (or a stage beside other work) left to the
 * scheduler may share a core's hyperthreads while another core idles, and each then runs at
 * a fraction of its speed; an operator places each stage on cores of its own, as the
 * benchmarks that stand several stages on one box for several boxes must too. */
#ifndef STRATA_RUNTIME_BASE_CPU_PIN_H
#define STRATA_RUNTIME_BASE_CPU_PIN_H

#include <sched.h>
#include <stddef.h>

struct cpu_pin {
    cpu_set_t set;
    int count; /* CPUs in set */
};

/* Parses a CPU list: comma-separated ids and inclusive ranges "A-B" (A <= B), each id in
 * [0, CPU_SETSIZE); an id named twice counts once. Empty text, an empty item, a descending
 * range or junk is STRATA_EINVAL with a message naming the text. */
int cpu_pin_parse(const char *text, struct cpu_pin *out);

/* The CPUs the calling thread may run on now (sched_getaffinity). STRATA_EIO on failure. */
int cpu_pin_current(struct cpu_pin *out);

/* Writes the set as a list ("0-3,8"), ranges folded; truncated to fit n (n > 0). */
void cpu_pin_format(const struct cpu_pin *p, char *buf, size_t n);

/* Pins the calling thread (and so the threads it starts later) to `p`'s CPUs. Each must be
 * one this process may be given (online and in its cgroup's cpuset; else STRATA_EINVAL naming
 * the first that is not, and those it may use), and `threads` compute threads must each have a CPU
 * of their own (more threads than CPUs is STRATA_EINVAL: they would take turns on a core, the
 * slowdown pinning is for avoiding). STRATA_EIO when the kernel refuses. Nothing changes on
 * failure. */
int cpu_pin_apply(const struct cpu_pin *p, int threads);

#endif
