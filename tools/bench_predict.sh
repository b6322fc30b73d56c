#!/usr/bin/env bash
# Prediction benchmark (not a test): the performance model (runtime/model/perf_model.h) against
# real strata-stage processes on loopback. For each configuration — a random-weight Qwen3
# checkpoint (strata-stage-bench make-model: H 1024 x 8 layers, ~200 MB, and H 1536 x 8, ~430
# MB), 1 or 2 stages (--split even), 1 or 2 threads per stage — it calibrates the box once per
# thread count (strata-stage --calibrate), asks strata-plan --predict --json for decode tokens/s
# and time to first token, runs the same plan (one request: a BENCH_PROMPT_TOKENS-token prompt,
# default 128, then BENCH_TOKENS generated, default 32; the median of BENCH_REPEAT runs,
# default 3) and prints predicted, measured and the error.
# Env: BENCH_PROMPT_TOKENS, BENCH_TOKENS, BENCH_REPEAT, STRATA_BAZEL_FLAGS, STRATA_PREBUILT.
set -u
cd "$(dirname "$0")/.."
. tools/bench_build.sh
bench_build //runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench //runtime:strata-plan
. tests/pipeline/pipeline_lib.sh
pl_init
BENCH="$STRATA_BIN_DIR/runtime/strata-stage-bench"
PLAN="$STRATA_BIN_DIR/runtime/strata-plan"
P=${BENCH_PROMPT_TOKENS:-128}
N=${BENCH_TOKENS:-32}
R=${BENCH_REPEAT:-3}
CHUNK=64 # strata-stage's default --chunk-size
# every run its own prompt: a repeated one would come from the prefix cache, not be prefilled
prompt_for() { seq 1 "$P" | awk -v r="$1" '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + r * 911) % 4000 + 1 }'; }
run=0
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
json_num() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }

models=()
for spec in "1024 2816" "1536 4096"; do
    read -r H I <<<"$spec"
    m="${TMPDIR:-/tmp}/strata-bench-predict-$H"
    [ -f "$m/model.safetensors" ] || "$BENCH" make-model --out "$m" --hidden "$H" --intermediate "$I" \
        --layers 8 --heads 16 --kv-heads 8 >/dev/null || pl_fail "cannot write the $H model"
    models+=("$m")
done
declare -A profile
for T in 1 2; do
    profile[$T]="$PL_WORK/profile.$T.json"
    "$PL_STAGE" --calibrate --threads "$T" --out "${profile[$T]}" 2>/dev/null || pl_fail "calibrate at $T threads"
done
echo "prediction benchmark: $(nproc) cores, prompt $P tokens, $N generated, median of $R; profiles:"
for T in 1 2; do echo "  $T thread(s): $(tr -d '\n' <"${profile[$T]}")"; done
printf "%-22s %-8s %-7s %12s %12s %7s %12s %12s %7s\n" model stages threads "pred tok/s" \
    "meas tok/s" error "pred TTFT ms" "meas TTFT ms" error
worst=0
for m in "${models[@]}"; do
    H=$(sed -n 's/.*"hidden_size": *\([0-9]*\).*/\1/p' "$m/config.json")
    for cfg in "1 1" "1 2" "2 1"; do
        read -r S T <<<"$cfg"
        tag="p${H}s${S}t${T}"
        pl_start_pipeline "$tag" "$S" "$m" --threads "$T" --max-seq 512 --max-batch 4 --split even \
            --chunk-size "$CHUNK" --insecure
        run=$((run + 1))
        pl_client "$tag" --prompt "$(prompt_for "$run")" --max-tokens 4 --quiet --insecure >/dev/null 2>&1 ||
            pl_fail "warm-up of $tag failed"
        rates="" ttfts=""
        for ((r = 0; r < R; r++)); do
            run=$((run + 1))
            pl_client "$tag" --prompt "$(prompt_for "$run")" --max-tokens "$N" --quiet --insecure >"$PL_WORK/run" 2>&1 ||
                pl_fail "$tag: $(cat "$PL_WORK/run")"
            line=$(grep '^request 0: ' "$PL_WORK/run" | tail -1)
            rates="$rates $(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p')"
            ttfts="$ttfts $(echo "$line" | sed -n 's/.*first token \([0-9.]*\) ms.*/\1/p')"
        done
        pl_stop_pipeline "$tag" "$S"
        "$PLAN" --model "$m" --stages "$S" --predict --profile "${profile[$T]}" --prompt-tokens "$P" \
            --chunk "$CHUNK" --kv-bytes 2 --link-latency-us 50 --link-gbps 5 --json >"$PL_WORK/pred" ||
            pl_fail "strata-plan --predict for $tag"
        pt=$(json_num "$PL_WORK/pred" decode_tokens_per_s)
        pf=$(json_num "$PL_WORK/pred" ttft_ms)
        mt=$(echo "$rates" | median)
        mf=$(echo "$ttfts" | median)
        et=$(awk -v p="$pt" -v m="$mt" 'BEGIN { printf "%+.0f%%", 100 * (p - m) / m }')
        ef=$(awk -v p="$pf" -v m="$mf" 'BEGIN { printf "%+.0f%%", 100 * (p - m) / m }')
        worst=$(awk -v w="$worst" -v a="$et" -v b="$ef" 'BEGIN { a += 0; b += 0; if (a < 0) a = -a;
            if (b < 0) b = -b; m = a > b ? a : b; print (m > w ? m : w) }')
        printf "%-22s %-8s %-7s %12.1f %12.1f %7s %12.1f %12.1f %7s\n" "H$H x 8 layers" "$S" "$T" \
            "$pt" "$mt" "$et" "$pf" "$mf" "$ef"
    done
done
echo "worst error: ${worst}% (goal: within 10% on a quiet host)"
