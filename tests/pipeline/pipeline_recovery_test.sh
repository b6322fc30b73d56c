#!/usr/bin/env bash
# Integration, recovery with identical tokens: a stage killed (SIGKILL) mid-request
# and started again (as its supervisor would); every request in flight completes with the
# tokens of an undisturbed run, and the last stage's --out (tokens + every logit) is
# byte-identical to one stage's. Stage 0 holds the requests and replays each one as a
# prefill of prompt + the tokens so far (runtime/stage/stage_recovery.c).
#   1. 3 stages, stage 1 killed: 4 requests (2 greedy, 2 at temperature 0.8 with a seed) on
#      two clients, --out on the last stage (the replayed rows' logits are recomputed and
#      their samples checked against stage 0's tokens).
#   2. 4 stages, stage 2 killed: the same 4 requests without --out (the last stage's sampler
#      is fast-forwarded to the resumed step), then one request whose --out is compared
#      byte for byte (the last stage itself killed).
#   3. No replacement: the requests fail with an error naming --recovery-timeout-ms within
#      the timeout (1.5 s), and nothing hangs.
#   4. Stage 0 killed and restarted: strata-client --reconnect-timeout-ms resubmits each
#      request with the tokens it received; the same 4 requests end with the same tokens.
#   5. A standby stage 1 (--standby, same port) takes over from the killed primary.
#   6. Speculative decoding (stage 0 --speculate ngram, 3 decode steps in flight): 3 stages,
#      stage 1 killed while steps with drafts are in flight; the 4 requests end with the undisturbed tokens (decoded
#      without drafts), and the last stage's --out of a single request equals one stage's.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

case=qwen3_deep8
model=$(pl_golden "$case")
p0=$(pl_golden_prompt "$case")
p1=$(echo "$p0" | tr ',' '\n' | sed -n '2,6p' | paste -sd,)
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
greedy=(--prompt "$p0" --prompt "$p1" --max-tokens 120)
sampled=(--prompt "$p1" --prompt "$p0" --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7)

# The undisturbed reference: one stage (one.greedy, one.sampled, one.single, ref.safetensors).
pl_reference_run "$model" "$p0" greedy sampled "${opts[@]}"

# 1. Three stages, stage 1 killed, --out on the last stage.
pl_start_pipeline a 3 "$model" "${opts[@]}" --step-delay-ms 10 --out "$PL_WORK/a.safetensors"
pl_client a "${greedy[@]}" >"$PL_WORK/a.greedy" 2>&1 &
ca=$!
pl_client a "${sampled[@]}" >"$PL_WORK/a.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
pl_kill_and_restart a 3 1 "$model" 1 "${opts[@]}" --step-delay-ms 10 --out "$PL_WORK/a.safetensors"
wait $ca || pl_fail "a: greedy client failed: $(cat "$PL_WORK/a.greedy")"
wait $cb || pl_fail "a: sampled client failed: $(cat "$PL_WORK/a.sampled")"
grep -q "ring re-formed: replaying" "$PL_WORK/a.0.log" || pl_fail "a: stage 0 did not replay"
pl_check_same a
pl_stop_pipeline a 3

# 2. Four stages, stage 2 killed (no --out: the sampler is fast-forwarded), then the last
#    stage killed under a request whose --out must equal one stage's.
pl_start_pipeline b 4 "$model" "${opts[@]}" --step-delay-ms 10
pl_client b "${greedy[@]}" >"$PL_WORK/b.greedy" 2>&1 &
ca=$!
pl_client b "${sampled[@]}" >"$PL_WORK/b.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
pl_kill_and_restart b 4 2 "$model" 1 "${opts[@]}" --step-delay-ms 10
wait $ca || pl_fail "b: greedy client failed: $(cat "$PL_WORK/b.greedy")"
wait $cb || pl_fail "b: sampled client failed: $(cat "$PL_WORK/b.sampled")"
pl_check_same b
pl_stop_pipeline b 4

pl_start_pipeline c 4 "$model" "${opts[@]}" --step-delay-ms 10 --out "$PL_WORK/c.safetensors"
pl_client c --prompt "$p0" --max-tokens 150 >"$PL_WORK/c.single" 2>&1 &
ca=$!
PL_PIDS="$PL_PIDS $ca"
pl_kill_and_restart c 4 3 "$model" 1 "${opts[@]}" --step-delay-ms 10 --out "$PL_WORK/c.safetensors"
wait $ca || pl_fail "c: client failed: $(cat "$PL_WORK/c.single")"
[ "$(pl_tokens_of "$PL_WORK/c.single" 0)" = "$(pl_tokens_of "$PL_WORK/one.single" 0)" ] ||
    pl_fail "c: tokens after the last stage's restart differ"
pl_wait_file "$PL_WORK/c.safetensors" 5 || pl_fail "c: no --out file"
cmp -s "$PL_WORK/c.safetensors" "$PL_WORK/ref.safetensors" ||
    pl_fail "c: --out (tokens + logits) after the recovery differs from the single stage"
echo "c: last stage killed and restarted: tokens and --out byte-identical to one stage"
pl_stop_pipeline c 4

# 4. Stage 0 killed and restarted: the clients (--reconnect-timeout-ms) reconnect to the new
#    stage 0 and resubmit each request with the tokens they have; it resumes there.
pl_start_pipeline e 3 "$model" "${opts[@]}" --step-delay-ms 10
pl_client e "${greedy[@]}" --reconnect-timeout-ms 10000 >"$PL_WORK/e.greedy" 2>"$PL_WORK/e.greedy.err" &
ca=$!
pl_client e "${sampled[@]}" --reconnect-timeout-ms 10000 >"$PL_WORK/e.sampled" 2>"$PL_WORK/e.sampled.err" &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
sleep 1
killed_at=$(date +%s.%N) # before the kill: never under-reports
pl_kill_stage e 0
: >"$PL_WORK/e.0.log"
pl_start_stage e 3 0 "$model" "${opts[@]}" --step-delay-ms 10
wait $ca || pl_fail "e: greedy client failed: $(cat "$PL_WORK/e.greedy" "$PL_WORK/e.greedy.err")"
wait $cb || pl_fail "e: sampled client failed: $(cat "$PL_WORK/e.sampled" "$PL_WORK/e.sampled.err")"
grep -q "resubmitted after [1-9][0-9]* tokens" "$PL_WORK/e.greedy.err" ||
    pl_fail "e: the greedy client did not resubmit mid-request: $(cat "$PL_WORK/e.greedy.err")"
at=$(pl_log_secs "$PL_WORK/e.0.log" "recovered: ")
[ -n "$at" ] || pl_fail "e: the new stage 0 logged no recovered request"
pl_check_same e
echo "e: stage 0 killed and restarted; the clients resubmitted ($(grep -m1 resubmitted "$PL_WORK/e.greedy.err" | cut -d: -f2-)); first token $(pl_secs_between "$killed_at" "$at") s after the kill"
pl_stop_pipeline e 3

# 5. A standby for stage 1 (weights loaded, waiting for the primary's port): the primary is
#    killed, the standby takes the port over and the ring re-forms without a cold start.
pl_start_pipeline f 3 "$model" "${opts[@]}" --step-delay-ms 10
port1=$(cat "$PL_WORK/f.1.port")
"$PL_STAGE" --model "$model" --num-stages 3 --stage-idx 1 --listen "127.0.0.1:$port1" --standby \
    --port-file "$PL_WORK/f.1.port" --next-port-file "$PL_WORK/f.2.port" \
    --auth-key-file "$PL_WORK/key" "${opts[@]}" --step-delay-ms 10 \
    >"$PL_WORK/f.standby.out" 2>"$PL_WORK/f.standby.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_log "$PL_WORK/f.standby.log" "standby: port $port1 is taken" 1 20 || pl_fail "f: standby did not start"
pl_client f "${greedy[@]}" >"$PL_WORK/f.greedy" 2>&1 &
ca=$!
pl_client f "${sampled[@]}" >"$PL_WORK/f.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
sleep 1
killed_at=$(date +%s.%N) # before the kill: never under-reports
pl_kill_stage f 1
pl_wait_log "$PL_WORK/f.0.log" "recovered: " 1 20 || pl_fail "f: no recovery logged"
at=$(pl_log_secs "$PL_WORK/f.0.log" "recovered: ")
wait $ca || pl_fail "f: greedy client failed: $(cat "$PL_WORK/f.greedy")"
wait $cb || pl_fail "f: sampled client failed: $(cat "$PL_WORK/f.sampled")"
grep -q "standby: took over port $port1" "$PL_WORK/f.standby.log" || pl_fail "f: the standby did not take over"
pl_check_same f
echo "f: stage 1's standby took over; first token after the replay $(pl_secs_between "$killed_at" "$at") s after the kill"

# 6. Speculation mid-recovery: drafts in flight when stage 1 dies; the replay and the steps
#    after it speculate again; every token and logit as without drafts.
pl_start_pipeline g 3 "$model" "${opts[@]}" --step-delay-ms 10 --speculate ngram --speculate-k 6 \
    --speculate-waves 3
pl_client g "${greedy[@]}" >"$PL_WORK/g.greedy" 2>&1 &
ca=$!
pl_client g "${sampled[@]}" >"$PL_WORK/g.sampled" 2>&1 &
cb=$!
PL_PIDS="$PL_PIDS $ca $cb"
pl_kill_and_restart g 3 1 "$model" 1 "${opts[@]}" --step-delay-ms 10
wait $ca || pl_fail "g: greedy client failed: $(cat "$PL_WORK/g.greedy")"
wait $cb || pl_fail "g: sampled client failed: $(cat "$PL_WORK/g.sampled")"
grep -q "ring re-formed: replaying" "$PL_WORK/g.0.log" || pl_fail "g: stage 0 did not replay"
grep -Eq "finished .*[1-9][0-9]* of [0-9]+ draft tokens accepted" "$PL_WORK/g.0.log" ||
    pl_fail "g: no request had a draft accepted: $(grep finished "$PL_WORK/g.0.log")"
pl_check_same g
pl_stop_pipeline g 3
pl_start_pipeline h 3 "$model" "${opts[@]}" --speculate ngram --out "$PL_WORK/h.safetensors"
pl_client h --prompt "$p0" --max-tokens 150 >"$PL_WORK/h.single" 2>&1 ||
    pl_fail "h: client failed: $(cat "$PL_WORK/h.single")"
pl_wait_file "$PL_WORK/h.safetensors" 5 || pl_fail "h: no --out file"
cmp -s "$PL_WORK/h.safetensors" "$PL_WORK/ref.safetensors" ||
    pl_fail "h: --out (tokens + logits) with drafts differs from one stage without"
echo "g, h: speculation: $(grep -m1 -o '[0-9]* of [0-9]* draft tokens accepted' "$PL_WORK/h.0.log"); tokens and --out as without drafts"
pl_stop_pipeline h 3

# 3. No replacement within --recovery-timeout-ms: a clear error, no hang.
pl_start_pipeline d 3 "$model" "${opts[@]}" --step-delay-ms 10 --recovery-timeout-ms 1500
pl_client d "${greedy[@]}" >"$PL_WORK/d.greedy" 2>&1 &
ca=$!
PL_PIDS="$PL_PIDS $ca"
sleep 1
killed_at=$(date +%s.%N) # before the kill: never under-reports
pl_kill_stage d 1
for i in $(seq 1 60); do
    kill -0 "$ca" 2>/dev/null || break
    sleep 0.05
done
kill -0 "$ca" 2>/dev/null && pl_fail "d: client still waiting 3 s after the kill (timeout 1.5 s)"
done_at=$(date +%s.%N)
wait $ca && pl_fail "d: the client reported success without a replacement stage"
grep -q "error ETIMEOUT.*--recovery-timeout-ms 1500" "$PL_WORK/d.greedy" ||
    pl_fail "d: no clear error: $(cat "$PL_WORK/d.greedy")"
echo "d: no replacement: $(grep -m1 error "$PL_WORK/d.greedy" | cut -c1-160)... after" \
    "$(pl_secs_between "$killed_at" "$done_at") s"
echo "PASS"
