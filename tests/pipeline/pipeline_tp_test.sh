#!/usr/bin/env bash
# Integration: tensor and KV parallelism in real strata-stage processes on
# loopback.
#   - PP 2 x TP 2 (4 processes) gives the golden ids on a dense and an MoE golden (both MoE
#     modes); the --out files (tokens + every step's logits) of two identical runs are
#     byte-identical, also when the second runs its TP groups over the TCP ring instead of
#     shared memory, and PP 1 x TP 2 gives the same bytes as PP 2 x TP 2 (pipeline splits
#     change no bit at a fixed TP degree);
#   - PP 2 x TP 2 x KVP 2 (8 processes) gives the golden ids, byte-identical on a rerun, and
#     PP 2 x KVP 4 with 16 KV positions per rank decodes a 64-token context (no rank holds
#     it) with the golden ids;
#   - every grid's --out file is byte-identical to plain PP 2 stages' (one rank each): TP
#     and KVP change no bit of the logits (reference/ops.h, split-invariant sums);
#   - a leader stopped by SIGTERM stops its followers (all exit 0);
#   - greedy without --out: golden ids, and the last stage all-gathers one (value, id) pair per
#     row instead of the logits (the vocab-parallel argmax);
#   - a TP rank or a KVP rank killed (kill -9) mid-request (PP 2 x TP 2 x KVP 2) fails that
#     request with a clear error within seconds, the dead rank's group-mates exit 1, the
#     other stage's followers exit 0 with their leader (nothing left waiting);
#   - a TP rank killed (kill -9) fails the next request with a clear error, no hang (over
#     shared memory and over TCP); a killed leader's follower exits 1 within 5 s;
#   - ranks that disagree on the grid (here the MoE mode) or the model are refused at the
#     group's Hello.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

# KVP degree of the tp_* helpers below (the TP degree is their argument).
K=1

# tp_start_stage TAG S T R MODEL [options...]: the T x K ranks of stage R (group rank
# g = kvp_rank * T + tp_rank; rank 0 through pl_start_stage, so it serves the stage; the
# others follow it).
tp_start_stage() {
    local tag=$1 S=$2 T=$3 r=$4 model=$5 g peers=""
    shift 5
    for ((g = 0; g < T * K; g++)); do
        rm -f "$PL_WORK/$tag.$r.tp$g.port"
        peers="$peers${peers:+,}127.0.0.1:@$PL_WORK/$tag.$r.tp$g.port"
    done
    pl_start_stage "$tag" "$S" "$r" "$model" --tp "$T" --tp-rank 0 --kvp "$K" --kvp-rank 0 \
        --tp-peers "$peers" "$@"
    for ((g = 1; g < T * K; g++)); do
        # shellcheck disable=SC2046
        "$PL_STAGE" --model "$model" --num-stages "$S" --stage-idx "$r" --tp "$T" \
            --tp-rank $((g % T)) --kvp "$K" --kvp-rank $((g / T)) --tp-peers "$peers" \
            $(pl_security_default "$@") "$@" \
            >>"$PL_WORK/$tag.$r.tp$g.out" 2>>"$PL_WORK/$tag.$r.tp$g.log" &
        PL_PIDS="$PL_PIDS $!"
        eval "PL_PID_${tag}_${r}_tp$g=$!"
    done
}

# tp_start TAG S T MODEL [options...]: every stage's ranks, then waits for the ring.
tp_start() {
    local tag=$1 S=$2 T=$3 model=$4 r
    shift 4
    for ((r = 0; r < S; r++)); do
        tp_start_stage "$tag" "$S" "$T" "$r" "$model" "$@"
    done
    pl_wait_ready "$tag" "$S"
}

# tp_stop TAG S T: SIGTERM to the leaders (pl_stop_pipeline: exit 0 within 5 s); each
# follower must then exit 0 on its own (the leader's STOP).
tp_stop() {
    local tag=$1 S=$2 T=$3 r t pid i
    pl_stop_pipeline "$tag" "$S"
    for ((r = 0; r < S; r++)); do
        for ((t = 1; t < T * K; t++)); do
            pid=$(eval "echo \$PL_PID_${tag}_${r}_tp$t")
            for ((i = 0; i < 100; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.05
            done
            kill -0 "$pid" 2>/dev/null && pl_fail "$tag: TP rank $t of stage $r did not stop"
            wait "$pid" || pl_fail "$tag: TP rank $t of stage $r exited with status $?"
        done
    done
}

# run_case TAG CASE S T [options...]: one request; tokens must equal the golden.
run_case() {
    local tag=$1 case=$2 S=$3 T=$4 model prompt want steps got
    shift 4
    model=$(pl_golden "$case")
    prompt=$(pl_golden_prompt "$case")
    want=$(pl_golden_generated "$case")
    steps=$(pl_golden_steps "$case")
    tp_start "$tag" "$S" "$T" "$model" --max-seq 256 --max-batch 4 --chunk-size 8 \
        --out "$PL_WORK/$tag.safetensors" "$@"
    grep -q "grid: stage 0 of $S, tp rank 0 of $T, kvp rank 0 of $K.*(leader" "$PL_WORK/$tag.0.out" ||
        pl_fail "$tag: the summary does not name the grid"
    pl_client "$tag" --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
        pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$want" ] || pl_fail "$tag: tokens $got, golden $want"
    # The ring describe names each stage's grid (column "tp x kvp").
    pl_client "$tag" --describe >"$PL_WORK/$tag.describe" 2>"$PL_WORK/$tag.describe.err" ||
        pl_fail "$tag: --describe failed: $(cat "$PL_WORK/$tag.describe.err")"
    [ "$(awk 'NR > 1 {print $1 ":" $4}' "$PL_WORK/$tag.describe" | paste -sd' ' -)" = \
        "$(for ((r = 0; r < S; r++)); do printf '%s ' "$r:${T}x$K"; done | sed 's/ $//')" ] ||
        pl_fail "$tag: --describe: $(cat "$PL_WORK/$tag.describe")"
    pl_wait_file "$PL_WORK/$tag.safetensors" 5 || pl_fail "$tag: no --out file"
    tp_stop "$tag" "$S" "$T"
}

same_bytes() {
    cmp -s "$PL_WORK/$1.safetensors" "$PL_WORK/$2.safetensors" ||
        pl_fail "$1 and $2: tokens/logits differ"
}

# run_one TAG CASE [options...]: the same request on two plain stages (no TP, no KVP): the
# one-rank bytes every grid must reproduce.
run_one() {
    local tag=$1 case=$2 model r steps
    shift 2
    model=$(pl_golden "$case")
    steps=$(pl_golden_steps "$case")
    for ((r = 0; r < 2; r++)); do
        pl_start_stage "$tag" 2 "$r" "$model" --max-seq 256 --max-batch 4 --chunk-size 8 \
            --out "$PL_WORK/$tag.safetensors" "$@"
    done
    pl_wait_ready "$tag" 2
    pl_client "$tag" --prompt "$(pl_golden_prompt "$case")" --max-tokens "$steps" \
        >"$PL_WORK/$tag.client" || pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    pl_wait_file "$PL_WORK/$tag.safetensors" 5 || pl_fail "$tag: no --out file"
    pl_stop_pipeline "$tag" 2
}

for case in qwen3_gqa_tied qwen3_moe qwen3_long_prompt; do
    run_one "${case}_one" "$case"
done

for case in qwen3_gqa_tied qwen3_moe; do
    run_case "${case}_a" "$case" 2 2
    run_case "${case}_b" "$case" 2 2 --tp-tcp
    same_bytes "${case}_a" "${case}_b"
    run_case "${case}_p1" "$case" 1 2
    same_bytes "${case}_a" "${case}_p1"
    same_bytes "${case}_a" "${case}_one"
    echo "$case: PP 2 x TP 2 golden ids; two runs (shm, tcp), PP 1 x TP 2 and one rank per stage byte-identical"
done
run_case moe_split qwen3_moe 2 2 --moe split
same_bytes moe_split qwen3_moe_one
echo "qwen3_moe: PP 2 x TP 2 with --moe split: golden ids, byte-identical to one rank per stage"

# KV parallelism: each KVP rank holds a token range of every request's KV.
K=2
for case in qwen3_gqa_tied qwen3_moe; do
    run_case "${case}_kvp_a" "$case" 2 2 --max-seq 64
    run_case "${case}_kvp_b" "$case" 2 2 --max-seq 64
    same_bytes "${case}_kvp_a" "${case}_kvp_b"
    same_bytes "${case}_kvp_a" "${case}_one"
    echo "$case: PP 2 x TP 2 x KVP 2 (8 processes, 32 KV positions per rank): golden ids, rerun and one rank per stage byte-identical"
done
K=4
run_case long_kvp4 qwen3_long_prompt 2 1 --max-seq 64 --kvp-tokens 16
grep -q "KV positions \[48, 64) of 64" "$PL_WORK/long_kvp4.1.tp3.out" ||
    pl_fail "long_kvp4: the last KVP rank does not report its token range"
same_bytes long_kvp4 qwen3_long_prompt_one
echo "qwen3_long_prompt: PP 2 x KVP 4, 16 KV positions per rank, 64-token context: golden ids, byte-identical to one rank per stage"
K=1

# Greedy without --out: the last stage's ranks pick the ids without assembling the logits
# (reference_logits_argmax): each all-gather of its leader carries one (value, id) pair per
# row, 2 floats, instead of V / T logits; the ids are still the golden's.
tp_start greedy 2 2 "$(pl_golden qwen3_gqa_tied)" --max-seq 256 --max-batch 4 --chunk-size 8
pl_client greedy --prompt "$(pl_golden_prompt qwen3_gqa_tied)" \
    --max-tokens "$(pl_golden_steps qwen3_gqa_tied)" >"$PL_WORK/greedy.client" ||
    pl_fail "greedy: client failed: $(cat "$PL_WORK/greedy.client")"
[ "$(pl_tokens_of "$PL_WORK/greedy.client" 0)" = "$(pl_golden_generated qwen3_gqa_tied)" ] ||
    pl_fail "greedy: tokens differ from the golden"
pl_wait_log "$PL_WORK/greedy.1.log" "group collectives:" 1 5 || pl_fail "greedy: no collective counters"
read -r ag_calls ag_floats <<<"$(grep "group collectives:" "$PL_WORK/greedy.1.log" | tail -1 |
    sed 's/.*all-gather \([0-9]*\) calls \([0-9]*\) floats.*/\1 \2/')"
[ "$ag_calls" -gt 0 ] && [ "$ag_floats" -eq $((2 * ag_calls)) ] ||
    pl_fail "greedy: the last stage all-gathered $ag_floats floats in $ag_calls calls (want 2 per call)"
tp_stop greedy 2 2
echo "PP 2 x TP 2 greedy without --out: golden ids, $ag_calls argmax all-gathers of 2 floats (no logits gathered)"

# Weight options reach every rank, not only the leader: with --weights-dtype q8 each follower
# holds q8 copies, and with --weights-in-file none moves its matrices (its startup summary).
tp_start wopt 1 2 "$(pl_golden qwen3_gqa_tied)" --weights-dtype q8
grep -q "q8: .* bytes of 8-bit copies" "$PL_WORK/wopt.0.tp1.out" ||
    pl_fail "q8 under TP: the follower did not quantise: $(cat "$PL_WORK/wopt.0.tp1.out")"
pl_client wopt --prompt "$(pl_golden_prompt qwen3_gqa_tied)" --max-tokens 4 >/dev/null ||
    pl_fail "q8 under TP: client failed"
tp_stop wopt 1 2
tp_start wfile 1 2 "$(pl_golden qwen3_gqa_tied)" --weights-in-file
for f in "$PL_WORK/wfile.0.out" "$PL_WORK/wfile.0.tp1.out"; do
    grep -q "; 0 bytes of streamed matrices moved" "$f" ||
        pl_fail "--weights-in-file under TP: $(basename "$f") moved its matrices: $(cat "$f")"
done
tp_stop wfile 1 2
echo "TP 2: --weights-dtype q8 and --weights-in-file reach the follower"

# A TP or KVP rank killed mid-request (PP 2 x TP 2 x KVP 2, 8 processes; each microbatch
# delayed 20 ms so the request runs for seconds): the request fails with the group's error,
# promptly; the dead rank's group-mates exit 1 on their own (no process left waiting), the
# other stage's followers stop with their leader, and the leaders still stop on SIGTERM.
K=2
for victim in 1 2; do # group rank 1: TP rank 1 of KVP rank 0; 2: TP rank 0 of KVP rank 1
    tag="mid$victim"
    what=$([ "$victim" = 1 ] && echo "TP rank 1" || echo "KVP rank 1")
    tp_start "$tag" 2 2 "$(pl_golden qwen3_gqa_tied)" --max-seq 512 --step-delay-ms 20
    start=$(date +%s.%N)
    timeout 60 "$PL_CLIENT" --port-file "$PL_WORK/$tag.0.port" --timeout-ms 20000 --insecure \
        --prompt 38 --max-tokens 400 >"$PL_WORK/$tag.client" 2>&1 &
    client=$!
    PL_PIDS="$PL_PIDS $client"
    sleep 1
    kill -0 "$client" 2>/dev/null || pl_fail "$tag: the request ended before the kill: $(cat "$PL_WORK/$tag.client")"
    kill -9 "$(eval "echo \$PL_PID_${tag}_1_tp$victim")"
    killed=$(date +%s.%N)
    if wait "$client"; then pl_fail "$tag: the request succeeded with $what of stage 1 dead"; fi
    secs=$(pl_secs_between "$killed" "$(date +%s.%N)")
    grep -q "error.*collective group .*rank" "$PL_WORK/$tag.client" ||
        pl_fail "$tag: unclear error: $(cat "$PL_WORK/$tag.client")"
    awk -v s="$secs" 'BEGIN { exit !(s < 15) }' || pl_fail "$tag: the request failed only after $secs s"
    for ((g = 1; g < 4; g++)); do # stage 1's surviving followers: exit 1 within 5 s
        [ "$g" = "$victim" ] && continue
        pid=$(eval "echo \$PL_PID_${tag}_1_tp$g")
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && pl_fail "$tag: group rank $g of stage 1 still runs 5 s after the kill"
        wait "$pid"
        rc=$?
        [ "$rc" -eq 1 ] || pl_fail "$tag: group rank $g of stage 1 exited $rc, want 1"
    done
    pl_stop_pipeline "$tag" 2 # both leaders exit 0 on SIGTERM
    for ((g = 1; g < 4; g++)); do # stage 0's followers: STOP from their leader, exit 0
        pid=$(eval "echo \$PL_PID_${tag}_0_tp$g")
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && pl_fail "$tag: group rank $g of stage 0 outlived its leader"
        wait "$pid" || pl_fail "$tag: group rank $g of stage 0 exited $?"
    done
    echo "$what of stage 1 killed mid-request: client error ${secs}s after the kill" \
        "($(grep -m1 -o 'collective group.*' "$PL_WORK/$tag.client" | cut -c1-120)); its group-mates exited 1"
    pl_cleanup
done
K=1

# A killed TP rank: the next request fails clearly and promptly.
for transport in shm tcp; do
    tag="kill_$transport"
    extra=""
    [ "$transport" = tcp ] && extra="--tp-tcp"
    # shellcheck disable=SC2086
    tp_start "$tag" 2 2 "$(pl_golden qwen3_gqa_tied)" --max-seq 64 $extra
    pl_client "$tag" --prompt 38 --max-tokens 4 >"$PL_WORK/$tag.first" ||
        pl_fail "$tag: first request failed"
    kill -9 "$(eval "echo \$PL_PID_${tag}_1_tp1")"
    start=$(date +%s.%N)
    if timeout 30 "$PL_CLIENT" --port-file "$PL_WORK/$tag.0.port" --timeout-ms 20000 --insecure \
        --prompt 38 --max-tokens 4 >"$PL_WORK/$tag.client" 2>&1; then
        pl_fail "$tag: a request succeeded with a TP rank dead"
    fi
    secs=$(pl_secs_between "$start" "$(date +%s.%N)")
    grep -q "error.*collective group .*rank 1" "$PL_WORK/$tag.client" ||
        pl_fail "$tag: unclear error: $(cat "$PL_WORK/$tag.client")"
    echo "$transport: killed TP rank -> client error in ${secs}s: $(grep -m1 error "$PL_WORK/$tag.client")"
    # A killed leader: its follower notices and exits 1 (no orphan waiting forever).
    follower=$(eval "echo \$PL_PID_${tag}_0_tp1")
    kill -9 "$(pl_pid "$tag" 0)"
    for ((i = 0; i < 100; i++)); do
        kill -0 "$follower" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$follower" 2>/dev/null && pl_fail "$tag: the follower outlived its leader by 5 s"
    wait "$follower"
    rc=$?
    [ "$rc" -eq 1 ] || pl_fail "$tag: the follower of a killed leader exited $rc, want 1"
    echo "$transport: killed leader -> its follower exited 1: $(grep -m1 'group failed' "$PL_WORK/$tag.0.tp1.log")"
    pl_cleanup
done

# Ranks that disagree on the grid are refused at the group's Hello (both exit 1).
peers="127.0.0.1:@$PL_WORK/mm.0,127.0.0.1:@$PL_WORK/mm.1"
model=$(pl_golden qwen3_moe)
"$PL_STAGE" --model "$model" --tp 2 --tp-rank 0 --tp-peers "$peers" --insecure \
    --tp-timeout-ms 3000 >"$PL_WORK/mm.0.out" 2>"$PL_WORK/mm.0.log" &
p0=$!
"$PL_STAGE" --model "$model" --tp 2 --tp-rank 1 --tp-peers "$peers" --insecure --moe split \
    --tp-timeout-ms 3000 >"$PL_WORK/mm.1.out" 2>"$PL_WORK/mm.1.log" &
p1=$!
PL_PIDS="$PL_PIDS $p0 $p1"
wait "$p0"
rc0=$?
wait "$p1"
rc1=$?
[ "$rc0" -eq 1 ] && [ "$rc1" -eq 1 ] || pl_fail "mismatched ranks exited $rc0 / $rc1, want 1 / 1"
grep -q "not a rank of group" "$PL_WORK/mm.0.log" "$PL_WORK/mm.1.log" ||
    pl_fail "mismatched ranks: no Hello refusal in the logs"
echo "mismatched MoE mode: refused at Hello ($(grep -h -m1 'not a rank' "$PL_WORK"/mm.*.log | head -1))"
# Ranks of another model are refused at the Hello too (the model fingerprint).
peers="127.0.0.1:@$PL_WORK/fp.0,127.0.0.1:@$PL_WORK/fp.1"
"$PL_STAGE" --model "$(pl_golden qwen3_gqa_tied)" --tp 2 --tp-rank 0 --tp-peers "$peers" \
    --insecure --tp-timeout-ms 3000 >"$PL_WORK/fp.0.out" 2>"$PL_WORK/fp.0.log" &
p0=$!
"$PL_STAGE" --model "$(pl_golden qwen3_moe)" --tp 2 --tp-rank 1 --tp-peers "$peers" --insecure \
    --tp-timeout-ms 3000 >"$PL_WORK/fp.1.out" 2>"$PL_WORK/fp.1.log" &
p1=$!
PL_PIDS="$PL_PIDS $p0 $p1"
wait "$p0"
rc0=$?
wait "$p1"
rc1=$?
[ "$rc0" -eq 1 ] && [ "$rc1" -eq 1 ] || pl_fail "ranks of two models exited $rc0 / $rc1, want 1 / 1"
grep -q "model fingerprint differs" "$PL_WORK/fp.0.log" "$PL_WORK/fp.1.log" ||
    pl_fail "ranks of two models: no fingerprint refusal in the logs"
echo "another model: refused at Hello (model fingerprint differs)"
echo "PASS"
