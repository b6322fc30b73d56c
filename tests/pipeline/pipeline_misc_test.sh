#!/usr/bin/env bash
# Integration: strata-stage's startup checks and options — --help, refusal of an empty or
# out-of-range shard (exit 2) and of weights missing tensors (exit 3, all names listed),
# an unavailable device, pre-shared-key authentication, q8 weights (refused across a mixed
# pipeline, split-equal), and KV handoff (--send-kv -> --recv-kv --kv-out -> --kv-restore
# only into an equal layer range), --stage-stats' lines, and a draft model on stage 0
# (--draft-model: greedy golden ids, sampled tokens as without drafts, its refusals), and
# --cpus (every thread pinned; malformed lists, CPUs it may not use and more threads than
# CPUs refused).
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
tied=$(pl_golden qwen3_gqa_tied)
moe=$(pl_golden qwen3_moe)
prompt=$(pl_golden_prompt qwen3_gqa_tied)

expect_exit() { # expect_exit CODE PATTERN command...
    local want=$1 pattern=$2 rc
    shift 2
    "$@" >"$PL_WORK/cmd.out" 2>&1
    rc=$?
    [ "$rc" -eq "$want" ] || pl_fail "exit $rc (want $want) from: $* -> $(cat "$PL_WORK/cmd.out")"
    grep -q -- "$pattern" "$PL_WORK/cmd.out" || pl_fail "no '$pattern' in output of $*: $(cat "$PL_WORK/cmd.out")"
}

expect_exit 0 "usage: strata-stage" "$PL_STAGE" --help
expect_exit 0 "usage: strata-client" "$PL_CLIENT" --help
expect_exit 0 "Exit codes: 0 every request finished" "$PL_CLIENT" --help
expect_exit 0 "Exit codes: 0 ok" "$PL_STAGE" --help
expect_exit 2 "not both" "$PL_STAGE" --model "$tied" --hf-config "$moe/config.json" \
    --weights "$moe/model.safetensors"
expect_exit 2 "usage" "$PL_STAGE" --bogus
expect_exit 2 "--listen needs an integer" "$PL_STAGE" --model "$tied" --num-stages 1 --listen 127.0.0.1:x
expect_exit 2 "empty or out of range" "$PL_STAGE" --model "$tied" --num-stages 2 --stage-idx 1 \
    --layer-start 2 --layer-end 2 --next-port 1
expect_exit 2 "empty or out of range" "$PL_STAGE" --model "$tied" --num-stages 5 --stage-idx 4 --next-port 1
expect_exit 2 "empty or out of range" "$PL_STAGE" --model "$tied" --num-stages 2 --stage-idx 1 \
    --layer-start 1 --layer-end 9 --next-port 1
expect_exit 3 "missing" "$PL_STAGE" --hf-config "$moe/config.json" --weights "$tied/model.safetensors"
listed=$(grep -c -e "^missing " -e "^wrong shape " "$PL_WORK/cmd.out")
[ "$listed" -eq 49 ] || pl_fail "expected all 49 missing/mis-shaped tensors listed, got $listed"
expect_exit 3 "config.json" "$PL_STAGE" --model "$PL_WORK/no-such-model"
expect_exit 1 "not available" "$PL_STAGE" --model "$tied" --device cuda:0
expect_exit 2 "--cpus needs a CPU list" "$PL_STAGE" --model "$tied" --num-stages 1 --cpus 3-1
expect_exit 2 "2 threads on 1 CPU" "$PL_STAGE" --model "$tied" --num-stages 1 --cpus 0 --threads 2
expect_exit 2 "CPU 1023 is not one this process may run on" "$PL_STAGE" --model "$tied" \
    --num-stages 1 --cpus 1023
expect_exit 2 "2 threads on 1 CPU" "$PL_STAGE" --calibrate --cpus 0 --threads 2
expect_exit 2 "--cpus needs a CPU list" "$PL_STAGE" --role vision --model "$tied" --next-port 1 \
    --cpus x
echo "startup checks: ok"

# --cpus: the stage and every thread it starts run on the CPU named (the last this test may
# use), its summary says so, and it serves.
last_cpu=$(taskset -pc $$ | sed 's/.*: //' | tr ',' '\n' | sed 's/.*-//' | sort -n | tail -1)
pl_start_pipeline pin 1 "$tied" --cpus "$last_cpu"
grep -q "^cpus: $last_cpu (1, pinned by --cpus)$" "$PL_WORK/pin.0.out" ||
    pl_fail "no pinned cpus line in the summary: $(grep '^cpus' "$PL_WORK/pin.0.out")"
for t in /proc/"$(pl_pid pin 0)"/task/*; do
    got=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$t/status")
    [ "$got" = "$last_cpu" ] || pl_fail "--cpus $last_cpu: thread ${t##*/} may run on $got"
done
pl_client pin --prompt "$prompt" --max-tokens 2 >"$PL_WORK/pin.ok" || pl_fail "pinned: $(cat "$PL_WORK/pin.ok")"
pl_stop_pipeline pin 1
echo "--cpus $last_cpu: every thread pinned, request served"

# Authentication: stages and a client sharing a key work; a client without it is refused.
printf 'a-pre-shared-key-of-enough-bytes\n' >"$PL_WORK/key"
printf 'another-key-that-does-not-match!\n' >"$PL_WORK/wrong"
pl_start_pipeline auth 2 "$tied" --auth-key-file "$PL_WORK/key" --stage-stats
# 8 prompt rows: --stage-stats counts the prompt's microbatch apart (a one-row prompt is priced
# and counted as a decode step)
long_prompt="$prompt,11,12,13,14,15,16,17"
pl_client auth --auth-key-file "$PL_WORK/key" --prompt "$long_prompt" --max-tokens 4 >"$PL_WORK/auth.ok" ||
    pl_fail "client with the key failed: $(cat "$PL_WORK/auth.ok")"
# --stage-stats: 0.5 s after the request, each stage logs its burst of work: 2 prompt
# microbatches (8 rows on 2 stages: chunks of 4) and 3 decode ones (the 4th token is sampled
# at the last stage and not sent on).
for r in 0 1; do
    pl_wait_log "$PL_WORK/auth.$r.log" "stage stats: 5 microbatches in" 1 5 ||
        pl_fail "stage $r logged no --stage-stats line: $(grep 'stage stats' "$PL_WORK/auth.$r.log")"
done
grep -q "per microbatch: compute [0-9]* us, send [0-9]* us, wait for the next frame [0-9]* us" \
    "$PL_WORK/auth.0.log" || pl_fail "a --stage-stats line without its times"
# ... and the prompt's microbatches apart from the decode ones, each half the prompt's rows
rows=$(($(echo "$long_prompt" | tr ',' '\n' | grep -c .) / 2))
for r in 0 1; do
    grep -q "with prompt rows 2 ($rows rows, [0-9]* us each), decode only 3 ([0-9]* us each)" \
        "$PL_WORK/auth.$r.log" || pl_fail "stage $r: no prompt / decode split of 2 x $rows rows:" \
        "$(grep 'stage stats' "$PL_WORK/auth.$r.log")"
done
pl_client auth --auth-key-file "$PL_WORK/wrong" --prompt "$prompt" --max-tokens 4 >"$PL_WORK/auth.bad" 2>&1 &&
    pl_fail "a client with the wrong key was served"
pl_wait_log "$PL_WORK/auth.0.log" "refused connection" 1 5 || pl_fail "stage 0 did not log the refusal"
env -u STRATA_AUTH_KEY "$PL_CLIENT" --port-file "$PL_WORK/auth.0.port" --prompt "$prompt" \
    --insecure --max-tokens 4 >"$PL_WORK/auth.none" 2>&1 && pl_fail "a client without a key was served"
pl_stop_pipeline auth 2
echo "auth: key accepted, wrong key and no key refused ($(grep -m1 -o 'refused connection.*' "$PL_WORK/auth.0.log"))"

# Stages of different models refuse each other (Hello model fingerprint).
pl_start_stage fp 2 0 "$tied"
pl_start_stage fp 2 1 "$(pl_golden qwen3_mha_untied)"
pl_wait_log "$PL_WORK/fp.0.log" "refused connection.*fingerprint" 1 10 ||
    pl_fail "stage 0 accepted a stage of another model"
pl_wait_log "$PL_WORK/fp.1.log" "refused connection.*fingerprint" 1 10 ||
    pl_fail "stage 1 accepted a stage of another model"
pl_stop_pipeline fp 2
echo "model fingerprint: stages of different models refuse each other"

# q8 weights (--weights-dtype q8): a stage refuses a neighbour with other weights (the dtype
# is in the model fingerprint); a 2-stage q8 pipeline gives the tokens of 1 q8 stage.
expect_exit 2 "bf16 or q8" "$PL_STAGE" --model "$tied" --num-stages 1 --weights-dtype q4
expect_exit 2 "cpu device only" "$PL_STAGE" --model "$tied" --num-stages 1 --weights-dtype q8 \
    --device cuda:0
pl_start_stage wd 2 0 "$tied" --weights-dtype q8
pl_start_stage wd 2 1 "$tied"
pl_wait_log "$PL_WORK/wd.0.log" "refused connection.*fingerprint" 1 10 ||
    pl_fail "a q8 stage accepted a bf16 neighbour"
pl_stop_pipeline wd 2
pl_start_pipeline q1 1 "$tied" --weights-dtype q8
grep -q "q8: .* bytes of 8-bit copies" "$PL_WORK/q1.0.out" ||
    pl_fail "no q8 bytes in the startup summary: $(cat "$PL_WORK/q1.0.out")"
pl_client q1 --prompt "$prompt" --max-tokens 8 >"$PL_WORK/q1.client" || pl_fail "q8 run failed"
pl_stop_pipeline q1 1
pl_start_pipeline q2 2 "$tied" --weights-dtype q8
pl_client q2 --prompt "$prompt" --max-tokens 8 >"$PL_WORK/q2.client" || pl_fail "q8 2-stage run failed"
pl_stop_pipeline q2 2
q1=$(pl_tokens_of "$PL_WORK/q1.client" 0)
[ -n "$q1" ] && [ "$q1" = "$(pl_tokens_of "$PL_WORK/q2.client" 0)" ] ||
    pl_fail "q8: 1 stage gave '$q1', 2 stages '$(pl_tokens_of "$PL_WORK/q2.client" 0)'"
echo "q8 weights: mixed dtypes refused (fingerprint), 2 stages = 1 stage ($q1)"

# Overlapping explicit shards refuse each other, and both sides log why.
pl_start_stage ov 2 0 "$tied" --layer-start 0 --layer-end 3
pl_start_stage ov 2 1 "$tied" --layer-start 2 --layer-end 4
pl_wait_log "$PL_WORK/ov.1.log" "expects upstream stage 0 ending at layer 2" 1 10 ||
    pl_fail "stage 1 accepted an overlapping upstream shard"
pl_wait_log "$PL_WORK/ov.0.log" "next hop is stage 1 with layers \[2, 4), expected stage 1 starting at layer 3" 1 10 ||
    pl_fail "stage 0 did not log why the next hop refused it"
pl_stop_pipeline ov 2
echo "overlapping shards: refused, reason logged on both stages"

# KV handoff: stage 0 sends its KV after the prefill activation; stage 1 writes it.
pl_start_stage kv 2 0 "$tied" --send-kv
pl_start_stage kv 2 1 "$tied" --recv-kv --kv-out "$PL_WORK/kv.block"
pl_wait_ready kv 2
pl_client kv --prompt "$prompt" --max-tokens 4 >"$PL_WORK/kv.client" || pl_fail "kv run failed"
pl_wait_file "$PL_WORK/kv.block" 5 || pl_fail "stage 1 wrote no --kv-out file"
pl_stop_pipeline kv 2
pl_start_stage restore 2 0 "$tied" --kv-restore "$PL_WORK/kv.block"
pl_wait_log "$PL_WORK/restore.0.out" "kv restore: request .* 1 positions, layers \[0, 2)" 1 10 ||
    pl_fail "restore into the equal range failed: $(cat "$PL_WORK/restore.0.log")"
kill "$(pl_pid restore 0)"
expect_exit 3 "equal layer range" "$PL_STAGE" --model "$tied" --num-stages 4 --stage-idx 0 \
    --next-port 1 --kv-restore "$PL_WORK/kv.block"
echo "kv handoff: sent, written, restored into [0, 2), refused for [0, 1)"

# A draft model on stage 0 (the golden's first 4 of 8 layers, made by strata-stage-bench
# make-draft: a smaller model whose guesses are sometimes wrong): the golden ids, and sampled
# tokens equal to those of the same request without drafts.
deep8=$(pl_golden qwen3_deep8)
p8=$(pl_golden_prompt qwen3_deep8)
"$PL_BIN/strata-stage-bench" make-draft --from "$deep8" --layers 4 --out "$PL_WORK/draft4" \
    >/dev/null || pl_fail "make-draft failed"
grep -q '"num_hidden_layers":.4,' "$PL_WORK/draft4/config.json" ||
    pl_fail "the draft's config does not say 4 layers: $(cat "$PL_WORK/draft4/config.json")"
expect_exit 2 "--speculate draft needs --draft-model" "$PL_STAGE" --model "$deep8" \
    --num-stages 1 --speculate draft
expect_exit 3 "draft model's vocabulary has 640 ids, the model's 512" "$PL_STAGE" \
    --model "$deep8" --num-stages 1 --draft-model "$(pl_golden qwen3_mha_untied)"
pl_start_pipeline dr 2 "$deep8" --draft-model "$PL_WORK/draft4" --speculate-k 5
grep -q "speculation: draft model .*4 layers.* drafts by default, up to 5" "$PL_WORK/dr.0.out" ||
    pl_fail "no draft model in stage 0's summary: $(cat "$PL_WORK/dr.0.out")"
pl_client dr --prompt "$p8" --max-tokens "$(pl_golden_steps qwen3_deep8)" >"$PL_WORK/dr.greedy" ||
    pl_fail "draft run failed: $(cat "$PL_WORK/dr.greedy")"
[ "$(pl_tokens_of "$PL_WORK/dr.greedy" 0)" = "$(pl_golden_generated qwen3_deep8)" ] ||
    pl_fail "draft-model tokens differ from the golden"
sampled=(--prompt "$p8" --max-tokens 40 --temperature 0.8 --seed 4)
pl_client dr "${sampled[@]}" >"$PL_WORK/dr.sampled" || pl_fail "sampled draft run failed"
pl_client dr "${sampled[@]}" --speculate off >"$PL_WORK/dr.plain" || pl_fail "sampled run failed"
[ "$(pl_tokens_of "$PL_WORK/dr.sampled" 0)" = "$(pl_tokens_of "$PL_WORK/dr.plain" 0)" ] ||
    pl_fail "sampled tokens with draft-model drafts differ from those without"
grep -Eq "finished .*[1-9][0-9]* of [0-9]+ draft tokens accepted" "$PL_WORK/dr.0.log" ||
    pl_fail "no draft accepted: $(grep finished "$PL_WORK/dr.0.log")"
pl_stop_pipeline dr 2
pl_start_pipeline nd 1 "$deep8"
pl_client nd --prompt "$p8" --max-tokens 4 --speculate draft >"$PL_WORK/nd.client" 2>&1 &&
    pl_fail "a draft request to a stage without a draft model succeeded"
grep -q "this pipeline has none" "$PL_WORK/nd.client" ||
    pl_fail "no clear refusal: $(cat "$PL_WORK/nd.client")"
pl_stop_pipeline nd 1
echo "draft model: golden ids, sampled as without drafts ($(grep -m1 -o '[0-9]* of [0-9]* draft tokens accepted' "$PL_WORK/dr.0.log")), refusals clear"
echo "PASS"
