#!/usr/bin/env bash
# Recovery benchmark (not a test): how long a pipeline request stalls when a stage
# dies mid-request. For 2 and 4 stages, two requests are in flight when stage 1 is killed
# (SIGKILL); the stage comes back either
#   - restart: the same command started again at once (what systemd Restart=always or a pod
#     restart does, minus the supervisor's own delay), a cold start: load + connect, or
#   - standby: a second strata-stage --standby for the same layers, weights loaded, waiting
#     on the primary's port, takes the port over.
# Printed per case (medians of BENCH_REPEAT rounds, default 3): from the kill to the ring
# re-forming (stage 0 replays) and to the first new token (the replay's compute included);
# every run's tokens are checked against an undisturbed run.
# KV rows (runtime/stage/stage_recovery_kv.c): two prompts of BENCH_KV_PROMPT ids (default
# 256) with --send-kv on every stage, stage 1 killed once stage 0 holds both prompts' KV
# copies (stage 0's --kv-out log says the last stage's blocks arrived, plus 0.2 s) and taken
# over by a standby; stage 0 either
# restores every stage's KV from its copies (--kv-recovery restore) or replays in full
# (--kv-recovery replay). The row says how many replays restored.
# Model: as tools/bench_pipeline.sh (a random-weight Qwen3, H=1024, 8 layers, generated once)
# unless BENCH_MODEL names one. Env: BENCH_MODEL, BENCH_THREADS (default nproc / S),
# BENCH_TOKENS (default: 160, doubled up to 480 until the undisturbed run takes 2 s, so a
# faster CPU still has the requests in flight at the kill), BENCH_KILL_AFTER_S (default: 40%
# of the undisturbed run), BENCH_REPEAT.
set -u
cd "$(dirname "$0")/.."
bazel build ${STRATA_BAZEL_FLAGS:-} //runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench \
    >/dev/null 2>&1 ||
    { bazel build ${STRATA_BAZEL_FLAGS:-} //runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench; exit 1; }
STRATA_BIN_DIR="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
export STRATA_BIN_DIR
. tests/pipeline/pipeline_lib.sh
pl_init
N=${BENCH_TOKENS:-160}
N_MAX=480 # the plain rows' --max-seq 512 less their prompts
model=${BENCH_MODEL:-}
if [ -z "$model" ]; then
    model="${TMPDIR:-/tmp}/strata-bench-model"
    [ -f "$model/model.safetensors" ] ||
        "$STRATA_BIN_DIR/runtime/strata-stage-bench" make-model --out "$model" >/dev/null ||
        pl_fail "cannot generate the benchmark model"
fi
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
prompts=(--prompt 1,2,3,4,5,6,7,8,9,10,11,12 --prompt 21,22,23,24,25,26,27,28)
P_KV=${BENCH_KV_PROMPT:-256}
kv_prompts=(--prompt "$(seq -s, 1 "$P_KV")" --prompt "$(seq -s, 1001 $((1000 + P_KV)))")
stamp() { sed -n 's/^\[stage [0-9]* \([0-9.]*\)\].*/\1/p' | head -n 1; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# one_round TAG S MODE [KV]: sets R_REFORM, R_FIRST (seconds from the kill) and R_KV (the
# replays that restored KV copies). KV: none (default), restore or replay.
one_round() {
    local tag=$1 S=$2 mode=$3 kv=${4:-none} r=1 threads port killed_at reform first t
    threads=${BENCH_THREADS:-$(($(nproc) / S > 0 ? $(nproc) / S : 1))}
    local opts=(--threads "$threads" --max-seq 512 --max-batch 4) first=() ask=("${prompts[@]}")
    if [ "$kv" != none ]; then
        opts=(--threads "$threads" --max-seq 1024 --max-batch 4 --send-kv)
        first=(--kv-recovery "$kv" --recv-kv --kv-out "$PL_WORK/$tag.kvout")
        ask=("${kv_prompts[@]}")
    fi
    pl_start_stage "$tag" "$S" 0 "$model" "${opts[@]}" "${first[@]}"
    for ((t = 1; t < S; t++)); do
        pl_start_stage "$tag" "$S" "$t" "$model" "${opts[@]}"
    done
    pl_wait_ready "$tag" "$S"
    # The undisturbed run, timed: the kill must land mid-request on any CPU, so unless
    # BENCH_TOKENS is given the requests grow until they take at least 2 s (within
    # --max-seq), and unless BENCH_KILL_AFTER_S is given the kill comes 40% of the way in.
    local n=$N t0 dur
    while :; do
        t0=$(date +%s.%N)
        pl_client "$tag" "${ask[@]}" --max-tokens "$n" >"$PL_WORK/$tag.ref" ||
            pl_fail "$tag: undisturbed run failed"
        dur=$(pl_secs_between "$t0" "$(date +%s.%N)")
        [ -z "${BENCH_TOKENS:-}" ] && [ "$kv" = none ] && [ "$n" -lt "$N_MAX" ] &&
            awk -v d="$dur" 'BEGIN { exit !(d < 2.0) }' || break
        n=$((n * 2 > N_MAX ? N_MAX : n * 2))
    done
    local kill_at=${BENCH_KILL_AFTER_S:-$(awk -v d="$dur" 'BEGIN { printf "%.2f", d * 0.4 }')}
    R_TOKENS=$n R_KILL_AT=$kill_at
    if [ "$mode" = standby ]; then
        port=$(cat "$PL_WORK/$tag.$r.port")
        "$PL_STAGE" --model "$model" --num-stages "$S" --stage-idx "$r" --standby \
            --listen "127.0.0.1:$port" --port-file "$PL_WORK/$tag.$r.port" \
            --next-port-file "$PL_WORK/$tag.$(((r + 1) % S)).port" "${opts[@]}" \
            >/dev/null 2>"$PL_WORK/$tag.standby.log" &
        PL_PIDS="$PL_PIDS $!"
        pl_wait_log "$PL_WORK/$tag.standby.log" "standby: port" 1 60 || pl_fail "$tag: no standby"
    fi
    local wrote
    wrote=$(grep -c "wrote a .* KV block" "$PL_WORK/$tag.0.log")
    pl_client "$tag" "${ask[@]}" --max-tokens "$n" >"$PL_WORK/$tag.run" 2>&1 &
    local client=$!
    PL_PIDS="$PL_PIDS $client"
    if [ "$kv" = none ]; then
        sleep "$kill_at"
    else # the last stage's blocks of both prompts at stage 0 (the others come before)
        pl_wait_log "$PL_WORK/$tag.0.log" "wrote a .* KV block" $((wrote + 2)) 120 ||
            pl_fail "$tag: the prompts were not prefilled"
        sleep 0.2
    fi
    kill -0 "$client" 2>/dev/null || pl_fail "$tag: the requests ended before the kill (raise BENCH_TOKENS)"
    killed_at=$(date +%s.%N) # before the kill: never under-reports
    kill -9 "$(pl_pid "$tag" "$r")"
    { wait "$(pl_pid "$tag" "$r")"; } 2>/dev/null
    [ "$mode" = restart ] && pl_start_stage "$tag" "$S" "$r" "$model" "${opts[@]}"
    wait "$client" || pl_fail "$tag: the requests did not survive: $(cat "$PL_WORK/$tag.run")"
    for k in 0 1; do
        [ "$(pl_tokens_of "$PL_WORK/$tag.run" $k)" = "$(pl_tokens_of "$PL_WORK/$tag.ref" $k)" ] ||
            pl_fail "$tag: request $k's tokens after the recovery differ from the undisturbed run"
    done
    reform=$(grep "ring re-formed" "$PL_WORK/$tag.0.log" | stamp)
    R_KV=$(grep -m1 "ring re-formed" "$PL_WORK/$tag.0.log" |
        sed -n 's/.*replaying \([0-9]*\) request(s), \([0-9]*\) from KV copies.*/\2\/\1/p')
    first=$(grep "recovered: " "$PL_WORK/$tag.0.log" | stamp)
    R_REFORM=$(pl_secs_between "$killed_at" "$reform")
    R_FIRST=$(pl_secs_between "$killed_at" "$first")
    pl_cleanup
}

echo "recovery benchmark: $(grep -o '"num_hidden_layers": *[0-9]*' "$model/config.json" | tr -d '"')," \
    "hidden $(sed -n 's/.*"hidden_size": *\([0-9]*\).*/\1/p' "$model/config.json"), 2 requests," \
    "$(nproc) cores; medians of ${BENCH_REPEAT:-3} rounds; tokens checked"
echo "(tokens per request and the kill's time are sized per round from the undisturbed run:" \
    "${BENCH_TOKENS:+fixed at $BENCH_TOKENS}${BENCH_TOKENS:-from $N, doubled up to $N_MAX until it takes 2 s}," \
    "${BENCH_KILL_AFTER_S:+killed at ${BENCH_KILL_AFTER_S} s}${BENCH_KILL_AFTER_S:-killed 40% of the way in})"
printf "%-8s %-8s %22s %28s  %s\n" stages replace "kill -> ring re-formed" "kill -> first token after" \
    "tokens@kill s (per round)"
for S in 2 4; do
    for mode in restart standby; do
        reforms="" firsts="" sizes=""
        for ((rep = 0; rep < ${BENCH_REPEAT:-3}; rep++)); do
            one_round "$mode$S$rep" "$S" "$mode"
            reforms="$reforms $R_REFORM"
            firsts="$firsts $R_FIRST"
            sizes="$sizes $R_TOKENS@$R_KILL_AT"
        done
        printf "%-8s %-8s %20.3f s %26.3f s  %s\n" "$S" "$mode" "$(echo "$reforms" | median)" \
            "$(echo "$firsts" | median)" "$(echo $sizes | tr ' ' ,)"
    done
done
echo "KV copies (--send-kv on every stage, 2 prompts of $P_KV ids, $N tokens each; standby" \
    "takes over; rebuild = stage 0's --kv-recovery):"
printf "%-8s %-8s %22s %28s  %s\n" stages rebuild "kill -> ring re-formed" \
    "kill -> first token after" "restored (per round)"
for S in 2 4; do
    for kv in restore replay; do
        reforms="" firsts="" kvs=""
        for ((rep = 0; rep < ${BENCH_REPEAT:-3}; rep++)); do
            one_round "kv$kv$S$rep" "$S" standby "$kv"
            reforms="$reforms $R_REFORM"
            firsts="$firsts $R_FIRST"
            kvs="$kvs $R_KV"
        done
        printf "%-8s %-8s %20.3f s %26.3f s  %s\n" "$S" "$kv" \
            "$(echo "$reforms" | median)" "$(echo "$firsts" | median)" "$(echo $kvs | tr ' ' ,)"
    done
done
