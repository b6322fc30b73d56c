#!/usr/bin/env bash
# `./strata bench gpu`'s pipeline part: what a stage boundary costs on one GPU.
# Decode tokens/s of the Qwen3-0.6B-shaped random bf16 checkpoint on one strata-stage process
# against the same model split into 2 stages (two strata-stage processes on loopback, both on
# the same --device), and the hop's cost per decoded token: the 2-stage per-token time minus
# the 1-stage one. A benchmark, not a test: nothing is asserted beyond the runs succeeding.
#
# With 2 stages a decoded token crosses two hops of the ring (stage 0's hidden state to
# stage 1, stage 1's token back to stage 0), each a device -> host copy, a TCP loopback
# frame and, for the hidden state, a host -> device copy; the compute is the same 28 layers
# split 14 / 14, so the difference of the per-token times is what the boundary adds.
# Both configurations run side by side and are measured interleaved round by round (greedy,
# BENCH_TOKENS tokens per request, strata-client: (n - 1) / (last token - first token));
# each figure is the median of BENCH_REPEAT rounds, as the host may be shared.
# The checkpoint is strata-bench-decode's (hidden 1024, 28 layers, 16 q / 8 kv heads,
# head_dim 128, intermediate 3072, vocab 151936, tied), written once to $PEERS_DIR (default
# ~/.cache/strata/peers-model, as `./strata bench tp` and `bench peers` use).
# --device DEV: cuda:N (default cuda:0) or cpu (the same logic, to try it without a GPU).
# Where the device is not available (strata-stage exits 1 with "device ... is not
# available"), prints "skipped: <reason>" and exits 0, as `./strata bench gpu` does.
# Env: BENCH_REPEAT (3), BENCH_TOKENS (128), BENCH_PROMPT (8 prompt ids), BENCH_THREADS (1:
# matmul threads per stage, for --device cpu), PEERS_DIR, STRATA_BAZEL_FLAGS.
set -u
device=cuda:0
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help)
        echo "usage: tools/bench_gpu_hop.sh [--device cuda:N|cpu]   (other options via the environment)"
        sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    --device)
        [ $# -ge 2 ] || { echo "bench_gpu_hop: --device needs a value (see --help)" >&2; exit 2; }
        device=$2
        shift
        ;;
    --device=*) device=${1#--device=} ;;
    *)
        echo "bench_gpu_hop: unexpected argument '$1' (see --help)" >&2
        exit 2
        ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
targets=(//runtime:strata-stage //runtime:strata-client //reference/tools:strata-bench-decode)
bazel build ${STRATA_BAZEL_FLAGS:-} "${targets[@]}" >/dev/null 2>&1 ||
    { bazel build ${STRATA_BAZEL_FLAGS:-} "${targets[@]}"; exit 1; }
STRATA_BIN_DIR="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
export STRATA_BIN_DIR
. tests/pipeline/pipeline_lib.sh
pl_init
repeat=${BENCH_REPEAT:-3}
N=${BENCH_TOKENS:-128}
plen=${BENCH_PROMPT:-8}
model=${PEERS_DIR:-$HOME/.cache/strata/peers-model}
. tools/bench_model.sh
bench_model "$model" "$STRATA_BIN_DIR" || pl_fail "cannot write the benchmark checkpoint to $model"
prompt=$(awk -v n="$plen" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", (i * 7919 + 13) % 151936 }')
opts=(--device "$device" --threads "${BENCH_THREADS:-1}" --max-seq $((plen + N + 16)) --max-batch 1
    --insecure)

# Both configurations start at once (the checkpoint loads in parallel); s1 is one stage, s2
# two. Each stage must come to "listening on" or have exited: a device that is not there
# is a skip, any other exit a failure.
for S in 1 2; do
    for ((r = 0; r < S; r++)); do pl_start_stage "s$S" "$S" "$r" "$model" "${opts[@]}"; done
done
for S in 1 2; do
    for ((r = 0; r < S; r++)); do
        log="$PL_WORK/s$S.$r.log"
        for ((i = 0; i < 6000; i++)); do # 300 s
            grep -q "listening on" "$log" 2>/dev/null && break
            if ! kill -0 "$(pl_pid "s$S" "$r")" 2>/dev/null; then
                reason=$(grep -m1 "is not available" "$log")
                if [ -n "$reason" ]; then
                    echo "skipped: ${reason#strata-stage: }"
                    exit 0
                fi
                pl_fail "stage $r of $S exited before listening"
            fi
            sleep 0.05
        done
        grep -q "listening on" "$log" || pl_fail "stage $r of $S did not start within 300 s"
    done
done
pl_wait_ready s1 1
pl_wait_ready s2 2

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
for S in 1 2; do
    pl_client "s$S" --prompt "$prompt" --max-tokens 4 --quiet >"$PL_WORK/warm" 2>&1 ||
        pl_fail "warm-up on $S stages failed: $(cat "$PL_WORK/warm")"
done
declare -A rate
for ((rep = 0; rep < repeat; rep++)); do
    for S in 1 2; do
        pl_client "s$S" --prompt "$prompt" --max-tokens "$N" --quiet >"$PL_WORK/one" 2>&1 ||
            pl_fail "request on $S stages failed: $(cat "$PL_WORK/one")"
        r=$(sed -n 's/^request 0: .* \([0-9.]*\) tokens\/s$/\1/p' "$PL_WORK/one")
        [ -n "$r" ] || pl_fail "no tokens/s from strata-client: $(cat "$PL_WORK/one")"
        rate[$S]="${rate[$S]:-} $r"
    done
    echo "bench gpu hop: round $((rep + 1))/$repeat done" >&2
done

r1=$(echo "${rate[1]}" | median)
r2=$(echo "${rate[2]}" | median)
backend=$(grep -m1 "^device: " "$PL_WORK/s1.0.out")
cfg=$(tr -d '\n ' <"$model/config.json" | sed 's/.*"hidden_size":\([0-9]*\).*"num_hidden_layers":\([0-9]*\).*/hidden \1, \2 layers/')
echo "GPU hop benchmark on $device: Qwen3-0.6B-shaped random bf16 checkpoint ($cfg, vocab"
echo "151936, tied) at $model; $plen prompt ids, $N greedy tokens per request, median of $repeat rounds"
[ -n "$backend" ] && echo "$backend"
fmt="%-8s %-12s %-13s %-10s %-15s %-13s\n"
printf "$fmt" stages processes "decode tok/s" "ms/token" "hop ms/token" "vs 1 stage"
printf "$fmt" 1 1 "$r1" "$(awk -v r="$r1" 'BEGIN { printf "%.3f", 1000 / r }')" - 1.00x
printf "$fmt" 2 "2 (loopback)" "$r2" "$(awk -v r="$r2" 'BEGIN { printf "%.3f", 1000 / r }')" \
    "$(awk -v a="$r1" -v b="$r2" 'BEGIN { printf "%.3f", 1000 / b - 1000 / a }')" \
    "$(awk -v a="$r1" -v b="$r2" 'BEGIN { printf "%.2fx", b / a }')"
echo "hop ms/token = 2-stage ms/token - 1-stage ms/token: the two ring hops a token crosses"
echo "($(awk -v a="$r1" -v b="$r2" 'BEGIN { printf "%.1f", (1000 / b - 1000 / a) * 1000 / 2 }') us per hop), device <-> host copies and loopback TCP included."
echo "strata-client prints tok/s to 0.1, and on a shared CPU host the rounds' spread (below) can"
echo "exceed a hop: compare the difference with it. Each round's tok/s:"
echo "  1 stage:${rate[1]}"
echo "  2 stages:${rate[2]}"
