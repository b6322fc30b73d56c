#!/usr/bin/env bash
# Integration: 8 concurrent requests (different prompts, two client connections) through a
# 4-stage pipeline each produce the same tokens as when run alone; a request beyond
# --max-batch waits in stage 0's admission queue and then equals its solo run (refused with an
# error naming the limits under --max-queue 0); a cancelled request frees its slots (the
# pipeline then serves a full batch again).
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

case=qwen3_long_prompt
model=$(pl_golden "$case")
base=$(pl_golden_prompt "$case" | tr ',' ' ')
set -- $base
prompts=()
for i in 0 1 2 3 4 5 6 7; do
    # prompt i: the golden prompt's ids i .. i+4+i (different lengths and contents)
    p=$(echo "$base" | tr ' ' '\n' | sed -n "$((i + 1)),$((i + 5 + i))p" | paste -sd, -)
    prompts+=("$p")
done
# 2 ms per step: the admission checks below need the 8 admitted requests still running when
# the 9th arrives; on a loaded host an unslowed 20-token request could finish first.
pl_start_pipeline p4 4 "$model" --max-seq 128 --max-batch 8 --chunk-size 4 --step-delay-ms 2

# Alone, one after another.
for i in 0 1 2 3 4 5 6 7; do
    pl_client p4 --prompt "${prompts[$i]}" --max-tokens 20 >"$PL_WORK/solo.$i" ||
        pl_fail "solo request $i failed: $(cat "$PL_WORK/solo.$i")"
done
# Together: two clients with four requests each, all in flight at once.
args_a=() args_b=()
for i in 0 1 2 3; do args_a+=(--prompt "${prompts[$i]}"); done
for i in 4 5 6 7; do args_b+=(--prompt "${prompts[$i]}"); done
pl_client p4 "${args_a[@]}" --max-tokens 20 >"$PL_WORK/together.a" &
ca=$!
pl_client p4 "${args_b[@]}" --max-tokens 20 >"$PL_WORK/together.b" ||
    pl_fail "concurrent client b failed: $(cat "$PL_WORK/together.b")"
wait $ca || pl_fail "concurrent client a failed: $(cat "$PL_WORK/together.a")"
for i in 0 1 2 3 4 5 6 7; do
    if [ "$i" -lt 4 ]; then f="$PL_WORK/together.a" k=$i; else f="$PL_WORK/together.b" k=$((i - 4)); fi
    solo=$(pl_tokens_of "$PL_WORK/solo.$i" 0)
    together=$(pl_tokens_of "$f" "$k")
    [ -n "$solo" ] && [ "$solo" = "$together" ] ||
        pl_fail "request $i: alone $solo, concurrent $together"
    echo "request $i: concurrent tokens equal the solo run ($solo)"
done

# Admission queue: 9 requests at --max-batch 8 -> the 9th waits at stage 0 for a slot and
# then gives the same tokens as alone.
nine=()
for i in 0 1 2 3 4 5 6 7 0; do nine+=(--prompt "${prompts[$i]}"); done
pl_client p4 "${nine[@]}" --max-tokens 20 >"$PL_WORK/nine" ||
    pl_fail "9 requests at --max-batch 8 with the admission queue: $(cat "$PL_WORK/nine")"
[ "$(pl_tokens_of "$PL_WORK/nine" 8)" = "$(pl_tokens_of "$PL_WORK/solo.0" 0)" ] ||
    pl_fail "the request that waited differs from its solo run"
echo "admission queue: the 9th request waited for a slot and equals its solo run"

pl_stop_pipeline p4 4

# Cancellation (slowed stages, so 100 tokens take seconds and the cancel surely arrives
# mid-request): request 0 is cancelled after 3 tokens; every stage frees it, so a full
# batch of 8 fits again.
pl_start_pipeline c4 4 "$model" --max-seq 128 --max-batch 8 --chunk-size 4 --step-delay-ms 5 \
    --max-queue 0
pl_client c4 --prompt "${prompts[0]}" --max-tokens 100 --cancel-after 3 >"$PL_WORK/cancel" ||
    pl_fail "cancel run failed: $(cat "$PL_WORK/cancel")"
grep -q "request 0: cancelled" "$PL_WORK/cancel" || pl_fail "request was not cancelled"
for r in 0 1 2 3; do
    pl_wait_log "$PL_WORK/c4.$r.log" "cancelled" 1 5 || pl_fail "stage $r did not free the cancelled request"
done
eight=()
for i in 0 1 2 3 4 5 6 7; do eight+=(--prompt "${prompts[$i]}"); done
pl_client c4 "${eight[@]}" --max-tokens 4 >"$PL_WORK/eight" ||
    pl_fail "a full batch after the cancel failed: $(cat "$PL_WORK/eight")"
echo "cancel: every stage freed the request; a full batch is served afterwards"

# Without a queue (--max-queue 0): 9 requests at --max-batch 8 -> exactly one refused at once,
# naming the limits.
pl_client c4 "${nine[@]}" --max-tokens 20 >"$PL_WORK/nine0" && pl_fail "9 requests at --max-batch 8 and no queue all succeeded"
grep -q "error EBUSY.*--max-batch 8.*--max-queue 0" "$PL_WORK/nine0" || pl_fail "no clear refusal: $(cat "$PL_WORK/nine0")"
[ "$(grep -c ": tokens " "$PL_WORK/nine0")" -eq 8 ] || pl_fail "the 8 admitted requests did not all finish"
echo "no queue: the 9th request was refused: $(grep "error EBUSY" "$PL_WORK/nine0")"
echo "PASS"
