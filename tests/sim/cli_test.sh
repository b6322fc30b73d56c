#!/bin/bash
# strata-sim's command line: --help, usage errors (exit 2), a bad model directory (exit 3),
# and a fault scenario that must end with a clear error and exit 1, never hang.
set -u
bin=$1
model=$2
fail() {
    echo "FAIL: $*"
    exit 1
}
expect() { # expect CODE PATTERN ARGS...
    want=$1
    pattern=$2
    shift 2
    out=$("$bin" "$@" 2>&1)
    rc=$?
    printf '%s\n' "--- strata-sim $*" "$out"
    [ "$rc" -eq "$want" ] || fail "exit $rc, expected $want for: $*"
    printf '%s\n' "$out" | grep -q -- "$pattern" || fail "output lacks '$pattern' for: $*"
}
expect 0 "usage: strata-sim" --help
expect 2 "model DIR is required" --all-splits
expect 2 "choose exactly one" --model "$model"
expect 2 "unknown option" --model "$model" --stages 2 --frobnicate 1
expect 2 "unknown option '--frobnicate'" --model "$model" --stages 2 --frobnicate
expect 2 "--stages needs a value" --model "$model" --stages
expect 2 "bad value for --loss" --model "$model" --stages 2 --loss 2
expect 2 "5 stages for 4 layers" --model "$model" --stages 5
expect 2 "does not start" --model "$model" --split "0-1|2-4"
# Option errors that need the model are reported before any simulation runs.
out=$("$bin" --model "$model" --split "0-2|2-2|2-4" 2>&1)
printf '%s\n' "$out" | grep -q "split" || fail "no split error: $out"
printf '%s\n' "$out" | grep -q "baseline" && fail "the baseline ran before the split was checked"
expect 2 "no run has that connection" --model "$model" --stages 2 --conn-link 2:10:1
expect 2 "stage 2 cannot fail" --model "$model" --stages 2 --kill-stage 2@1
expect 2 "stage 4 cannot fail" --model "$model" --all-splits --partition-stage 4@1
expect 3 "strata-sim: " --model /nonexistent/model --stages 2
# The backend is picked as strata-stage picks it: an unknown device is a usage error, a
# device this build cannot run is refused by name before anything runs.
expect 2 "bad value for --device" --model "$model" --stages 2 --device tpu
expect 1 "device 'cuda:0' is not available" --model "$model" --stages 2 --device cuda:0
# A stage's TP / KVP ranks are threads here; on CUDA they would need a GPU each: refused
# before anything runs, with the reason and the way (strata-stage per rank).
expect 2 "CUDA TP / KVP ranks need one GPU each" --model "$model" --stages 2 --tp 2 --device cuda:0
expect 2 "one strata-stage process per rank" --model "$model" --stages 1 --kvp 2 --device cuda
# Faults: a killed stage and a partitioned stage end every request with a clear error.
expect 1 "stage 1 was killed" --model "$model" --stages 3 --max-tokens 8 --compute fixed \
    --row-cost-us 20 --kill-stage 1@0.3
expect 1 "unreachable" --model "$model" --stages 2 --max-tokens 8 --compute fixed \
    --row-cost-us 20 --partition-stage 1@0.3 --peer-timeout-ms 50
expect 1 "connection to stage 0 lost" --model "$model" --stages 2 --max-tokens 8 \
    --compute fixed --kill-stage 0@0.2
# An explicit split runs and matches.
expect 0 "OK: 1 split runs" --model "$model" --split "0-1|1-4" --max-tokens 4 --requests 2
# --compute model: the performance model's step times on a device profile (deterministic:
# two runs print the same virtual times), close to strata-plan --predict's tokens/s for the
# same split with free links (the sim moves the frames and charges attention as the contexts grow;
# the plan prices every decode step at the prompt's context).
prof="${TEST_TMPDIR:-/tmp}/sim_profile.json"
printf '{"name": "slow spec box", "source": "spec", "read_gbps": 1, "gemv_gbps": 0.5, "gemm_gflops": 2}\n' >"$prof"
expect 2 "--compute model and --profile FILE go together" --model "$model" --stages 2 --compute model
run_model() { "$bin" --model "$model" --split "0-2|2-4" --max-tokens 16 --compute model --profile "$prof" \
    --latency-us 0 --bandwidth-gbps 0 2>&1 | grep '^0-2|2-4' | awk '{ print $4, $5 }'; }
a=$(run_model) b=$(run_model)
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL --compute model: not deterministic: '$a' vs '$b'"; exit 1; }
rate=$(echo "$a" | awk '{ print $2 }')
if [ -n "${3:-}" ]; then
    want=$("$3" --model "$model" --ranges 0-2,2-4 --predict --profile "$prof" --link-latency-us 0 \
        --link-gbps 1000000 --kv-bytes 4 --prompt-tokens 1 --json | sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
    awk -v s="$rate" -v p="$want" 'BEGIN { exit !(s >= 0.85 * p && s <= 1.15 * p) }' ||
        { echo "FAIL --compute model: $rate tokens/s, strata-plan --predict says $want"; exit 1; }
    echo "ok   --compute model: $rate tokens/s simulated, strata-plan --predict $want"
    # KVP 2 ranks per stage: both price the all-gathers and the attention's share alike
    kvp_rate=$("$bin" --model "$model" --split "0-2|2-4" --max-tokens 16 --compute model \
        --profile "$prof" --latency-us 0 --bandwidth-gbps 0 --kvp 2 2>&1 | grep '^0-2|2-4' |
        awk '{ print $5 }')
    kvp_want=$("$3" --model "$model" --ranges 0-2,2-4 --predict --profile "$prof" --link-latency-us 0 \
        --link-gbps 1000000 --kv-bytes 4 --prompt-tokens 1 --kvp 2 --json |
        sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
    awk -v s="$kvp_rate" -v p="$kvp_want" -v one="$rate" \
        'BEGIN { exit !(s >= 0.85 * p && s <= 1.15 * p && s != one) }' ||
        { echo "FAIL --compute model --kvp 2: $kvp_rate tokens/s, strata-plan --predict --kvp 2 says $kvp_want"; exit 1; }
    echo "ok   --compute model --kvp 2: $kvp_rate tokens/s simulated, strata-plan --predict $kvp_want"
fi
# --no-weights: the same run on the timing backend (nothing computed) is charged exactly the
# same virtual times, since the model charges rows, and the stage core schedules the same
# rows whatever the tokens are; warm repeats and next turns still reuse the KV pool's cached
# blocks (a 40-token prompt's 2, and the next turn, 42 tokens, 2: its answer's block ends at 48).
same=(--split "0-2|2-4" --max-tokens 16 --prompt-tokens 40 --requests 3 --compute model \
    --profile "$prof" --latency-us 20 --bandwidth-gbps 1)
w=$("$bin" --model "$model" "${same[@]}" 2>&1 | grep '^0-2|2-4' | awk '{ print $4, $5 }')
nw=$("$bin" --model "$model" --no-weights "${same[@]}" 2>&1)
printf '%s\n' "--- strata-sim --no-weights" "$nw"
c=$(printf '%s\n' "$nw" | grep '^0-2|2-4' | awk '{ print $4, $5 }')
[ -n "$w" ] && [ "$c" = "$w" ] || fail "--no-weights: '$c' (TTFT ms, tokens/s), with the weights '$w'"
printf '%s\n' "$nw" | grep -q '^0-2|2-4 .* timing ' || fail "--no-weights: no 'timing' verdict"
printf '%s\n' "$nw" | grep -q "OK: 1 split runs simulated (timing only" || fail "--no-weights: no OK line"
expect 0 "warm repeats: 64 prompt tokens from the KV cache; of them the next turns' 32" \
    --model "$model" --no-weights --stages 2 --warm --prompt-tokens 40 --max-tokens 4 \
    --compute model --profile "$prof"
# A model of which only config.json is here (a 64-layer 32B): timing only, in well under a
# second of wall time for its virtual seconds.
cfgonly="${TEST_TMPDIR:-/tmp}/sim_config_only"
mkdir -p "$cfgonly"
cp "$(dirname "$0")/../../docs/plan_examples/qwen3-32b/config.json" "$cfgonly/"
gpu="${TEST_TMPDIR:-/tmp}/sim_gpu_profile.json"
printf '{"name": "GPU spec", "source": "spec", "device": "cuda", "read_gbps": 3350, "gemv_gbps": 3350, "gemm_gflops": 989000}\n' >"$gpu"
expect 0 "OK: 1 split runs simulated" --model "$cfgonly" --no-weights --stages 4 \
    --prompt-tokens 1024 --max-tokens 8 --requests 2 --compute model --profile "$gpu"
# The simulator and strata-plan --predict price the same plan alike: a 235B MoE's first token
# on 8 GPU-spec stages (prompt cut into 256-row chunks by both, every expert streamed per chunk).
if [ -n "${3:-}" ]; then
    vl="$(dirname "$0")/../../docs/plan_examples/qwen3-vl-235b-a22b"
    sim_ttft=$("$bin" --model "$vl" --no-weights --stages 8 --prompt-tokens 2048 --max-tokens 1 \
        --chunk 512 --kv-dtype f16 --compute model --profile "$gpu" --latency-us 20 \
        --bandwidth-gbps 100 2>&1 | grep '^0-12|' | awk '{ print $4 }')
    plan_ttft=$("$3" --model "$vl" --stages 8 --predict --profile "$gpu" --link-latency-us 20 \
        --link-gbps 12.5 --prompt-tokens 2048 --chunk 512 --kv-bytes 2 --json |
        sed -n 's/.*"ttft_ms": \([0-9.]*\).*/\1/p')
    awk -v s="$sim_ttft" -v p="$plan_ttft" 'BEGIN { exit !(s > 0 && s >= 0.95 * p && s <= 1.05 * p) }' ||
        fail "235B first token: simulated '$sim_ttft' ms, strata-plan --predict '$plan_ttft' ms"
    echo "ok   235B on 8 stages, first token: $sim_ttft ms simulated, strata-plan --predict $plan_ttft ms"
fi
expect 3 "to simulate its timing without the weights: --no-weights" --model "$cfgonly" --stages 2
expect 2 "--no-weights runs --compute model" --model "$cfgonly" --no-weights --stages 2
expect 2 "--no-weights runs --compute model" --model "$cfgonly" --no-weights --stages 2 \
    --compute model --profile "$prof" --tp 2
expect 2 "choose one of --prompt IDS and --prompt-tokens N" --model "$model" --stages 2 \
    --prompt 1,2 --prompt-tokens 4
echo "PASS"
