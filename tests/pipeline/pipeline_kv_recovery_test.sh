#!/usr/bin/env bash
# Integration, restore from the last KV handoff instead of recomputing: with
# --send-kv on every stage, stage 0 keeps each later stage's KV block per request, and when a
# stage is killed mid-request and comes back, the replay restores every stage's KV from those
# copies and recomputes only the rows after them (runtime/stage/stage_recovery_kv.c). Tokens
# and --out (every logit) must equal an undisturbed run's all the same.
#   1. 3 stages, stage 1 killed and restarted, --kv-recovery restore: 4 requests (2 greedy,
#      2 sampled at temperature 0.8 with a seed) on two clients; stage 0 logs the replays as
#      from KV copies and the new stage 1 logs the restores; tokens as undisturbed.
#   2. 2 stages, the last stage killed under one request with --out (its copy lives at stage
#      0), the default rule (auto): tokens and --out byte-identical to one stage's.
#   3. Fallback: 3 stages with the copies but stage 0 --kv-recovery replay: replayed in
#      full (no copy restored), tokens as undisturbed.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

case=qwen3_deep8
model=$(pl_golden "$case")
g=$(pl_golden_prompt "$case")
p0="$g,$g,$g,$g" # 64 tokens: the copies spare 63 prefill rows per request
p1=$(echo "$g,$g" | tr ',' '\n' | sed -n '2,30p' | paste -sd,)
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
greedy=(--prompt "$p0" --prompt "$p1" --max-tokens 120)
sampled=(--prompt "$p1" --prompt "$p0" --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7)

# The undisturbed reference: one stage (one.greedy, one.sampled, one.single, ref.safetensors).
pl_reference_run "$model" "$p0" greedy sampled "${opts[@]}"

# start TAG S STAGE0_OPTS...: a pipeline with --send-kv everywhere, extra options on stage 0.
start() {
    local tag=$1 S=$2 r
    shift 2
    pl_start_stage "$tag" "$S" 0 "$model" "${opts[@]}" --send-kv --step-delay-ms 10 "$@"
    for ((r = 1; r < S; r++)); do
        pl_start_stage "$tag" "$S" "$r" "$model" "${opts[@]}" --send-kv --step-delay-ms 10 \
            --out "$PL_WORK/$tag.safetensors"
    done
    pl_wait_ready "$tag" "$S"
}

# kill_and_restart TAG S R: kills stage R once the clients are mid-request and restarts it.
kill_and_restart() {
    pl_kill_and_restart "$1" "$2" "$3" "$model" 1.5 "${opts[@]}" --send-kv --step-delay-ms 10 \
        --out "$PL_WORK/$1.safetensors"
}

# 1. Three stages, stage 1 killed, restore forced: every request restored from its copies.
start a 3 --kv-recovery restore
pl_client a "${greedy[@]}" >"$PL_WORK/a.greedy" 2>&1 &
ca=$!
pl_client a "${sampled[@]}" >"$PL_WORK/a.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
kill_and_restart a 3 1
wait $ca || pl_fail "a: greedy client failed: $(cat "$PL_WORK/a.greedy")"
wait $cb || pl_fail "a: sampled client failed: $(cat "$PL_WORK/a.sampled")"
line=$(grep -m1 "ring re-formed: replaying" "$PL_WORK/a.0.log") || pl_fail "a: stage 0 did not replay"
n=$(echo "$line" | sed -n 's/.*replaying \([0-9]*\) request(s), \([0-9]*\) from KV copies.*/\1 \2/p')
[ -n "$n" ] && [ "${n% *}" -ge 1 ] && [ "${n% *}" = "${n#* }" ] ||
    pl_fail "a: not every replay restored its KV copies: $line"
grep -q "restored [1-9][0-9]* request(s) from their KV copies" "$PL_WORK/a.1.log" ||
    pl_fail "a: the new stage 1 restored no KV copy"
grep -q "restored [1-9][0-9]* request(s) from their KV copies" "$PL_WORK/a.2.log" ||
    pl_fail "a: the surviving stage 2 restored no KV copy"
pl_check_same a
echo "a: ${line#*\] }"
pl_stop_pipeline a 3

# 2. Two stages, the last stage killed under a request with --out; the default rule.
start b 2
pl_client b --prompt "$p0" --max-tokens 150 >"$PL_WORK/b.single" 2>&1 &
ca=$!
PL_PIDS="$PL_PIDS $ca"
kill_and_restart b 2 1
wait $ca || pl_fail "b: client failed: $(cat "$PL_WORK/b.single")"
[ "$(pl_tokens_of "$PL_WORK/b.single" 0)" = "$(pl_tokens_of "$PL_WORK/one.single" 0)" ] ||
    pl_fail "b: tokens after the last stage's restart differ"
pl_wait_file "$PL_WORK/b.safetensors" 5 || pl_fail "b: no --out file"
cmp -s "$PL_WORK/b.safetensors" "$PL_WORK/ref.safetensors" ||
    pl_fail "b: --out (tokens + logits) after the recovery differs from the single stage"
line=$(grep -m1 "ring re-formed: replaying" "$PL_WORK/b.0.log") || pl_fail "b: stage 0 did not replay"
echo "b: last stage killed and restarted: tokens and --out byte-identical to one stage (${line#*\] })"
pl_stop_pipeline b 2

# 3. The fallback: copies kept, but stage 0 told to replay in full.
start c 3 --kv-recovery replay
pl_client c "${greedy[@]}" >"$PL_WORK/c.greedy" 2>&1 &
ca=$!
pl_client c "${sampled[@]}" >"$PL_WORK/c.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
kill_and_restart c 3 1
wait $ca || pl_fail "c: greedy client failed: $(cat "$PL_WORK/c.greedy")"
wait $cb || pl_fail "c: sampled client failed: $(cat "$PL_WORK/c.sampled")"
grep -q "ring re-formed: replaying [1-9][0-9]* request(s), 0 from KV copies" "$PL_WORK/c.0.log" ||
    pl_fail "c: the forced full replay restored copies: $(grep "re-formed" "$PL_WORK/c.0.log")"
grep -q "from their KV copies" "$PL_WORK/c.1.log" "$PL_WORK/c.2.log" &&
    pl_fail "c: a stage restored a KV copy under --kv-recovery replay"
pl_check_same c
pl_stop_pipeline c 3
echo "PASS"
