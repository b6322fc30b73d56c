#!/usr/bin/env bash
# `./strata bench kvp`: decode latency per token at 2k, 8k and 32k context with KV
# parallelism 1, 2 and 4 on the Qwen3-0.6B-shaped random bf16 checkpoint (the one `./strata
# bench tp` and `peers` use, in $PEERS_DIR, default ~/.cache/strata/peers-model), every KVP
# rank a process with one thread (runtime/bench_kvp.c; its opening comment says how the context is
# filled without a prefill, how the latency is taken and what runs when a context's fp32 KV
# does not fit the memory budget). A benchmark, not a test: nothing is asserted.
# Goal (the issue): latency at 32k with KVP 4 <= 0.4x KVP 1.
# Env: PEERS_DIR, BENCH_CONTEXTS (2048,8192,32768), BENCH_KVP (1,2,4), BENCH_STEPS (4),
# BENCH_TRANSPORT (shm | tcp), BENCH_MEM_FRACTION (0.5), STRATA_BAZEL_FLAGS.
set -eu
case "${1:-}" in
-h | --help)
    echo "usage: ./strata bench kvp   (tools/bench_kvp.sh; options via the environment)"
    sed -n '2,/^set -eu$/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo
    cd "$(dirname "$0")/.."
    if [ -x bazel-bin/runtime/strata-bench-kvp ]; then bazel-bin/runtime/strata-bench-kvp --help; fi
    exit 0
    ;;
"") ;;
*)
    echo "bench kvp: unexpected argument '$1' (see --help)" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
targets=(//runtime:strata-bench-kvp //reference/tools:strata-bench-decode)
. tools/bench_build.sh
bench_build "${targets[@]}"
bin=$STRATA_BIN_DIR
model=${PEERS_DIR:-$HOME/.cache/strata/peers-model}
. tools/bench_model.sh
bench_model "$model" "$bin" || { echo "bench kvp: cannot write the checkpoint to $model" >&2; exit 1; }
echo "1-min load before: $(cut -d' ' -f1 /proc/loadavg)"
"$bin/runtime/strata-bench-kvp" --model "$model" --contexts "${BENCH_CONTEXTS:-2048,8192,32768}" \
    --kvp "${BENCH_KVP:-1,2,4}" --steps "${BENCH_STEPS:-4}" --transport "${BENCH_TRANSPORT:-shm}" \
    --mem-fraction "${BENCH_MEM_FRACTION:-0.5}"
echo "1-min load after: $(cut -d' ' -f1 /proc/loadavg)"
echo "KVP replicates the weights: every rank reads all of them per token (~1.2 GB bf16 here) and"
echo "1/K of the context's KV; with $(nproc) cores, KVP 4 runs 4 processes on $(nproc) cores."
