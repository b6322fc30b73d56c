#!/usr/bin/env bash
# The GPU bundle's second device call (tools/gpu_bundle.sh; the first is gpu_run.sh): the CPU
# benchmarks whose goals need more cores than the 2 of the build machine, or a quiet host, on
# the device's 16, with the bundle's binaries (STRATA_PREBUILT) and the repository's scripts
# (the device run starts in a copy of the working tree). The most wanted first, as a lease
# rarely leaves time for all:
#   1. bench predict: the performance model against real runs on a quiet host (goal: within
#      10% on every configuration; its network-namespace rows where the box has iproute2;
#      every stage pinned to physical cores of its own, which its 16 CPUs allow for every row);
#   2. bench pipeline, prefill load on 2, 4 and 8 stages (S stages with S requests in flight
#      against S x one process);
#   3. bench tp: decode tok/s at TP 1 and 2 (network namespaces where the box has them);
#   4. bench kvp: ms per token at 2k / 8k / 32k context with KVP 1, 2, 4;
#   5. bench pipeline, decode load, 4 threads a stage: one request through 1, 2 and 4 stages
#      with a core for every stage thread (the hop's goal, met there before: >= 0.98 of one
#      process, 0.97 over TLS).
# Each bench prints its rows as it measures them, so one that its limit stops still reports
# what it measured. Usage: .gpu-bundle/gpu_run_cpu.sh [OUT] (default $OUT, else
# /tmp/strata-gpu-run-cpu), run from the repository root. Logs OUT/<bench>.log, one line per
# bench in OUT/summary_cpu.txt; the limits add up to 18 minutes (more than a lease has left
# after gpu_run.sh: the device call's own timeout is the real bound). Exit 0 when none failed.
set -u
B=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-/tmp/strata-gpu-run-cpu}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_PREBUILT="$B/prebuilt"
# The bundle's ip and tc (a bare device image has no iproute2): the namespace hosts' rows.
[ -d "$B/sbin" ] && export PATH="$B/sbin:$PATH"
summary="$OUT/summary_cpu.txt"
: >"$summary"
failed=0
bench() { # bench NAME SECONDS COMMAND...
    local name=$1 limit=$2 rc
    shift 2
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) v=ok ;;
        124 | 137) v=TIMEOUT; failed=1 ;;
        *) v=FAILED; failed=1 ;;
    esac
    printf '%-7s %-16s %s\n' "$v" "$name" "$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-160)" |
        tee -a "$summary"
}
# the lossy row needs ~50 runs' stalls to mean anything (the build machine runs it); each row
# calibrates just before and just after it (~22 calibrations of ~5 s)
bench predict 400 env BENCH_REPEAT=3 BENCH_LOSS_PCT= tools/bench_predict.sh
bench pipeline_prefill 240 env BENCH_LOAD=prefill BENCH_PREFILL_STAGES="2 4 8" BENCH_REPEAT=3 \
    tools/bench_pipeline.sh
bench tp 150 tools/bench_tp.sh
bench kvp 150 env BENCH_STEPS=2 tools/bench_kvp.sh
bench pipeline_decode 150 env BENCH_THREADS=4 BENCH_REPEAT=3 tools/bench_pipeline.sh
echo "summary: $summary"
exit $failed
