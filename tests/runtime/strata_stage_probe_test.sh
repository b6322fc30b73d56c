#!/bin/bash
# strata-stage --probe-links (runtime/strata_stage_probe.c): every stage of a ring, with its
# usual flags, measures its link to the next stage and echoes the stage before it:
#   - 2 stages in plaintext and a 3-stage ring over TLS 1.3 PSK: each writes a link object
#     (latency_us >= 0, gbps > 0, "measured by strata-stage --probe-links: stage i to stage
#     i+1"), says what it measured and how many frames it echoed, and exits 0; no weights are
#     loaded (a model directory without model.safetensors is enough);
#   - refusals: one stage (no link), a next stage that never comes (exit 1 within
#     --peer-timeout-ms, naming the stage), a key the next stage does not share (exit 1).
# usage: strata_stage_probe_test.sh STAGE GOLDEN_DIR
set -u
stage="$1"
golden="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/stage_probe.XXXXXX")"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
fail=0
die() { echo "FAIL: $*"; fail=1; }
model="$work/model" # config.json only: the probe never reads the weights
mkdir "$model"
cp "$golden/config.json" "$model/"

# ring NAME S [FLAGS...]: S stages probing round the ring; exit codes in $work/NAME.<i>.rc
ring() {
    local name=$1 S=$2 i
    shift 2
    for ((i = 0; i < S; i++)); do
        (
            "$stage" --model "$model" --num-stages "$S" --stage-idx "$i" \
                --port-file "$work/$name.$i.port" --next-port-file "$work/$name.$(((i + 1) % S)).port" \
                --probe-links "$work/$name.$i.json" "$@" >"$work/$name.$i.out" 2>&1
            echo $? >"$work/$name.$i.rc"
        ) &
    done
    wait
}
check_ring() { # NAME S WORDS: every stage exited 0 and wrote its link
    local name=$1 S=$2 words=$3 i
    for ((i = 0; i < S; i++)); do
        [ "$(cat "$work/$name.$i.rc")" = 0 ] || { die "$name stage $i: exit $(cat "$work/$name.$i.rc"): $(cat "$work/$name.$i.out")"; continue; }
        grep -Eq '^\{"latency_us": [0-9.]+, "gbps": [0-9.]*[1-9][0-9.]*, "source": "measured by strata-stage --probe-links: stage '"$i to stage $(((i + 1) % S))" "$work/$name.$i.json" ||
            die "$name stage $i: no link object: $(cat "$work/$name.$i.json")"
        grep -q "link to stage $(((i + 1) % S)) .*$words.*latency" "$work/$name.$i.out" ||
            die "$name stage $i: no link line: $(cat "$work/$name.$i.out")"
        grep -q "echoed [1-9][0-9]* frames" "$work/$name.$i.out" ||
            die "$name stage $i: no echo line: $(cat "$work/$name.$i.out")"
    done
}
ring plain 2 --insecure
check_ring plain 2 ""
head -n 2 "$work/plain.0.out" | tail -n 1
printf 'a-pre-shared-key-of-32-bytes-ok!' >"$work/key"
ring psk 3 --auth-key-file "$work/key"
check_ring psk 3 "over TLS 1.3"
grep "link to" "$work/psk.1.out"

"$stage" --model "$model" --num-stages 1 --insecure --probe-links "$work/one.json" >"$work/one.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "one stage has no link" "$work/one.out" || die "one stage: exit $rc: $(cat "$work/one.out")"
start=$(date +%s)
"$stage" --model "$model" --num-stages 2 --stage-idx 0 --insecure --next-port-file "$work/nobody.port" \
    --peer-timeout-ms 1500 --probe-links "$work/alone.json" >"$work/alone.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ $rc -eq 1 ] && grep -q "the link to stage 1" "$work/alone.out" && [ "$took" -lt 20 ] ||
    die "no next stage: exit $rc after ${took}s: $(cat "$work/alone.out")"
printf 'another-key-of-32-bytes-not-it!!' >"$work/wrong"
(
    "$stage" --model "$model" --num-stages 2 --stage-idx 1 --auth-key-file "$work/wrong" \
        --port-file "$work/mix.1.port" --next-port-file "$work/mix.0.port" --peer-timeout-ms 3000 \
        --probe-links "$work/mix.1.json" >"$work/mix.1.out" 2>&1
    echo $? >"$work/mix.1.rc"
) &
"$stage" --model "$model" --num-stages 2 --stage-idx 0 --auth-key-file "$work/key" \
    --port-file "$work/mix.0.port" --next-port-file "$work/mix.1.port" --peer-timeout-ms 3000 \
    --probe-links "$work/mix.0.json" >"$work/mix.0.out" 2>&1
rc=$?
wait
[ $rc -eq 1 ] && [ "$(cat "$work/mix.1.rc")" = 1 ] ||
    die "different keys: exits $rc and $(cat "$work/mix.1.rc"): $(cat "$work/mix.0.out" "$work/mix.1.out")"
[ $fail -eq 0 ] && echo PASS
exit $fail
