#!/usr/bin/env bash
# Integration, tests across hosts: in a 4-stage pipeline across 4 hosts (network
# namespaces, see netns_lib.sh), host 2's link goes down (`ip link set eth0 down` on that
# host: both of stage 2's links are cut) for 2 s in the middle of a request, shorter than the
# stages' dead-peer timeout (--peer-timeout-ms, default 10 s). When it comes back the same TCP
# connections carry on: the request completes with the golden tokens, the last stage's --out
# (tokens + logits) is byte-identical to a single-stage run's, no stage failed a request or
# reconnected. Every link runs TLS 1.3 with this run's key. Skipped with the reason where
# namespaces cannot be made.
set -u
. "$(dirname "$0")/netns_lib.sh"
nl_init 4

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
down_s=2
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"

pl_start_pipeline one 1 "$model" "${opts[@]}" --out "$PL_WORK/one.safetensors"
pl_client one --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/one.client" ||
    pl_fail "single stage: client failed: $(cat "$PL_WORK/one.client")"
pl_wait_file "$PL_WORK/one.safetensors" 5 || pl_fail "single stage: no --out file"
pl_stop_pipeline one 1

# 25 ms per microbatch on every stage: the 32-token request takes ~3.5 s, so the outage falls
# inside it. The dead-peer timeout is the default one. One undisturbed request first, to
# measure what the outage cost beyond its own length.
nl_start_pipeline d 4 "$model" "${opts[@]}" --step-delay-ms 25 --out "$PL_WORK/d.safetensors"
start=$(date +%s.%N)
nl_client --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/d0.client" 2>&1 ||
    pl_fail "undisturbed request failed: $(cat "$PL_WORK/d0.client")"
[ "$(pl_tokens_of "$PL_WORK/d0.client" 0)" = "$want" ] || pl_fail "undisturbed request: wrong tokens"
plain_s=$(pl_secs_between "$start" "$(date +%s.%N)")
start=$(date +%s.%N)
nl_client --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/d.client" 2>&1 &
client=$!
PL_PIDS="$PL_PIDS $client"
sleep 0.7
kill -0 "$client" 2>/dev/null || pl_fail "the request ended before the outage: $(cat "$PL_WORK/d.client")"
nl_link 2 down
down_at=$(date +%s.%N)
sleep "$down_s"
kill -0 "$client" 2>/dev/null || pl_fail "the request ended during the outage: $(cat "$PL_WORK/d.client")"
nl_link 2 up
up_at=$(date +%s.%N)
wait "$client" || pl_fail "the request failed after host 2's link came back: $(cat "$PL_WORK/d.client")"
done_at=$(date +%s.%N)
got=$(pl_tokens_of "$PL_WORK/d.client" 0)
[ "$got" = "$want" ] || pl_fail "tokens after the outage $got, golden $want"
pl_wait_file "$PL_WORK/d.safetensors" 5 || pl_fail "no --out file"
cmp -s "$PL_WORK/d.safetensors" "$PL_WORK/one.safetensors" ||
    pl_fail "tokens/logits after the outage differ from the single stage"
for r in 0 1 2 3; do
    ! grep -E "failed|lost|hung or unreachable" "$PL_WORK/d.$r.log" | grep -v "client link" ||
        pl_fail "stage $r logged a failure during the outage"
    [ "$(grep -c "connected to next stage" "$PL_WORK/d.$r.log")" = 1 ] ||
        pl_fail "stage $r reconnected: the ring re-formed instead of resuming"
done
took=$(pl_secs_between "$start" "$done_at")
echo "host 2 ($(nl_addr 2)) down $(pl_secs_between "$down_at" "$up_at") s from" \
    "$(pl_secs_between "$start" "$down_at") s into the request: it resumed and finished" \
    "$(pl_secs_between "$up_at" "$done_at") s after the link came back; request $took s" \
    "against $plain_s s undisturbed, so the outage cost" \
    "$(awk -v a="$took" -v b="$plain_s" 'BEGIN { printf "%.3f", a - b }') s (TCP retransmission" \
    "backoff included); tokens golden, --out identical to the single stage, no stage failed" \
    "or reconnected"
pl_stop_pipeline d 4
echo "PASS"
