#!/usr/bin/env bash
# Integration, recovery with identical tokens, across hosts: stage 2 of a 4-stage
# pipeline on 4 hosts (network namespaces, netns_lib.sh) is killed (SIGKILL) mid-request and
# started again on the same host, as its supervisor (systemd Restart=always, a Kubernetes
# pod restart) would. The in-flight request must complete with the golden tokens, and the
# last stage's --out (tokens + logits) must be byte-identical to a single-stage run's.
# Stage 0 holds the request while stage 2 is away and replays it when the ring re-forms
# (runtime/stage/stage_recovery.c; --recovery-timeout-ms, default 10 s).
set -u
. "$(dirname "$0")/netns_lib.sh"
nl_init 4

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"

pl_start_pipeline one 1 "$model" "${opts[@]}" --out "$PL_WORK/one.safetensors"
pl_client one --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/one.client" ||
    pl_fail "single stage: client failed: $(cat "$PL_WORK/one.client")"
pl_wait_file "$PL_WORK/one.safetensors" 5 || pl_fail "single stage: no --out file"
pl_stop_pipeline one 1

# 25 ms per microbatch on every stage: the request takes ~3.5 s, the kill falls inside it.
nl_start_pipeline r 4 "$model" "${opts[@]}" --step-delay-ms 25 --out "$PL_WORK/r.safetensors"
start=$(date +%s.%N)
nl_client --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/r.client" 2>&1 &
client=$!
PL_PIDS="$PL_PIDS $client"
sleep 1
kill -0 "$client" 2>/dev/null || pl_fail "the request ended before the kill: $(cat "$PL_WORK/r.client")"
pl_kill_stage r 2
killed_at=$(date +%s.%N)
nl_start_stage r 4 2 "$model" "${opts[@]}" --step-delay-ms 25 --out "$PL_WORK/r.safetensors"
wait "$client" || pl_fail "the request did not survive stage 2's restart: $(cat "$PL_WORK/r.client")"
done_at=$(date +%s.%N)
[ "$(pl_tokens_of "$PL_WORK/r.client" 0)" = "$want" ] || pl_fail "tokens after the recovery are not golden"
pl_wait_file "$PL_WORK/r.safetensors" 5 || pl_fail "no --out file"
cmp -s "$PL_WORK/r.safetensors" "$PL_WORK/one.safetensors" ||
    pl_fail "tokens/logits after the recovery differ from the single stage"
echo "stage 2 on host 2 killed $(pl_secs_between "$start" "$killed_at") s into the request and" \
    "restarted: the request completed $(pl_secs_between "$killed_at" "$done_at") s later with the" \
    "golden tokens, --out identical to the single stage"
pl_stop_pipeline r 4
echo "PASS"
