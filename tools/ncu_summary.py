#!/usr/bin/env python3
"""Where a decode step's time goes on the GPU: reads the CSV that `ncu --metrics
gpu__time_duration.sum --csv --print-units base` printed for a strata-bench-backend run
(tools/gpu_run.sh's profile step) and prints the last complete decode step's kernels, summed
by kernel and launch grid, largest first, with the step's total. A step ends at the argmax
kernel (the greedy token), so the last step is everything after the one argmax before it.
Each kernel ran on its own under ncu (no overlap, clocks as the device left them), so the
total is an upper bound of the step's device time; small kernels read slower than in a
graph. Usage: ncu_summary.py NCU_CSV."""
import collections
import csv
import sys


def kernels(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("ncu_summary: no ncu CSV header in " + path)
    rows = []
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        name = r["Kernel Name"].split("(")[0].replace("void ", "")
        rows.append((int(r["ID"]), name, r["Grid Size"], r["Block Size"], ns))
    return sorted(rows)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = kernels(sys.argv[1])
    ends = [i for i, r in enumerate(rows) if r[1].startswith("argmax")]
    if len(ends) < 2:
        sys.exit("ncu_summary: fewer than two decode steps (argmax kernels) in the profile")
    step = rows[ends[-2] + 1 : ends[-1] + 1]
    total = sum(r[4] for r in step)
    by = collections.defaultdict(lambda: [0, 0.0])
    for _, name, grid, block, ns in step:
        by[(name, grid, block)][0] += 1
        by[(name, grid, block)][1] += ns
    print("last decode step: %d kernels, %.1f us of kernel time (%d kernels profiled)"
          % (len(step), total / 1e3, len(rows)))
    print("%-34s %-14s %-12s %6s %10s %8s %6s" % ("kernel", "grid", "block", "count",
                                                  "total us", "mean us", "share"))
    for (name, grid, block), (count, ns) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print("%-34s %-14s %-12s %6d %10.1f %8.2f %5.1f%%" % (name[:34], grid, block, count,
                                                          ns / 1e3, ns / count / 1e3,
                                                          100 * ns / total))


if __name__ == "__main__":
    main()
