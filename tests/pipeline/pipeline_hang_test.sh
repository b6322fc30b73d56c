#!/usr/bin/env bash
# Integration: stage 2 of 4 stops answering without closing its sockets (SIGSTOP). With
# --peer-timeout-ms 1000 its neighbours declare it dead, so the in-flight request fails with
# a clear error on the client and on every other stage within 2 s of the stop. After SIGCONT
# the stale connections are replaced and a new request is served with the golden tokens.
# Every link runs TLS 1.3 (the run's key as PSK). --recovery-timeout-ms 0: fail fast (no
# replay; pipeline_recovery_test.sh covers that).
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

case=qwen3_gqa_tied
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 512 --max-batch 4 --step-delay-ms 20 --peer-timeout-ms 1000 --recovery-timeout-ms 0)
# A key of this run only (see pipeline_kill_test.sh).
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
pl_start_pipeline h 4 "$model" "${opts[@]}"
grep -q "links: TLS 1.3 with a pre-shared key" "$PL_WORK/h.0.log" ||
    pl_fail "the ring does not run on TLS (the key gives TLS 1.3 PSK on every link)"

pl_client h --prompt "$prompt" --max-tokens 400 >"$PL_WORK/victim" 2>&1 &
client=$!
PL_PIDS="$PL_PIDS $client"
sleep 1
kill -0 "$client" 2>/dev/null || pl_fail "the request ended before the stop: $(cat "$PL_WORK/victim")"
stopped_at=$(date +%s.%N)
kill -STOP "$(pl_pid h 2)"
for i in $(seq 1 40); do
    kill -0 "$client" 2>/dev/null || break
    sleep 0.05
done
kill -0 "$client" 2>/dev/null && { kill -CONT "$(pl_pid h 2)"; pl_fail "client still waiting 2 s after stage 2 hung"; }
wait "$client" && pl_fail "client reported success although stage 2 hung"
echo "client: $(grep -m1 error "$PL_WORK/victim") (after $(pl_secs_between "$stopped_at" "$(date +%s.%N)") s)"
for r in 0 1 3; do
    pl_wait_log "$PL_WORK/h.$r.log" "request .* failed" 1 3
    line=$(grep -m1 "request .* failed" "$PL_WORK/h.$r.log") || pl_fail "stage $r did not report the failure"
    at=$(echo "$line" | sed -n 's/^\[stage [0-9]* \([0-9.]*\)\].*/\1/p')
    took=$(pl_secs_between "$stopped_at" "$at")
    awk -v t="$took" 'BEGIN { exit !(t <= 2.0) }' || pl_fail "stage $r reported the failure after $took s"
    echo "stage $r: failed the request after $took s"
done
grep -q "hung or unreachable" "$PL_WORK/h.1.log" "$PL_WORK/h.3.log" || pl_fail "no dead-peer message"

kill -CONT "$(pl_pid h 2)"
pl_wait_log "$PL_WORK/h.1.log" "connected to next stage 2" 2 20 || pl_fail "stage 1 did not reconnect"
pl_wait_log "$PL_WORK/h.3.log" "upstream stage 2 connected" 2 20 || pl_fail "stage 3 did not see stage 2 again"
pl_wait_log "$PL_WORK/h.2.log" "connected to next stage 3" 2 20 || pl_fail "stage 2 did not reconnect to stage 3"
pl_client h --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/after" ||
    pl_fail "request after the resume failed: $(cat "$PL_WORK/after")"
[ "$(pl_tokens_of "$PL_WORK/after" 0)" = "$want" ] || pl_fail "wrong tokens after the resume"
echo "after SIGCONT: links re-established, a new request completed with the golden tokens"
echo "PASS"
