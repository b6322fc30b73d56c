#!/usr/bin/env bash
# strata-generate end to end: greedy ids equal transformers' golden ids (at 1 and 2 threads),
# bad input exits with the documented codes (2 usage, 3 bad input/model), and --weights-dtype q8
# reports its bytes and keeps ids independent of the thread count.
set -euo pipefail
gen="$1"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/golden"
fail() { echo "FAIL: $*"; exit 1; }

for case in qwen3_moe qwen3_mha_untied; do
    dir="$root/$case"
    prompt=$(tr -d '[] \n' < "$dir/prompt_ids.json")
    want=$(tr -d '\n ' < "$dir/golden.json" | sed 's/.*"generated_ids":\[\([0-9,]*\)\].*/\1/' | tr ',' ' ')
    steps=$(echo "$want" | wc -w)
    for threads in 1 2; do
        out=$("$gen" --model "$dir" --prompt-ids "$prompt" --max-tokens "$steps" --threads "$threads" --ignore-eos 2>/dev/null)
        got=${out%%$'\n'*} # first line (no pipe: head would SIGPIPE the writer under pipefail)
        [ "$got" = "$want" ] || fail "$case threads $threads: got '$got', want '$want'"
        grep -q "^decode: .* tokens/s" <<<"$out" || fail "$case: no decode speed line"
    done
    echo "ok: $case ids identical to transformers ($steps steps, 1 and 2 threads)"
done

# Seeded sampling replays exactly (at any thread count); stop ids end generation early.
dir="$root/qwen3_moe"
sample() {
    local out
    out=$("$gen" --model "$dir" --prompt-ids 5,6,7 --max-tokens 20 --temperature 0.9 --top-k 50 \
        --top-p 0.95 --ignore-eos "$@" 2>/dev/null)
    echo "${out%%$'\n'*}"
}
a=$(sample --seed 11 --threads 1); b=$(sample --seed 11 --threads 2)
[ "$a" = "$b" ] || fail "seeded sampling differs: '$a' vs '$b'"
[ "$(echo "$a" | wc -w)" = 20 ] || fail "expected 20 sampled ids, got '$a'"
first=$(echo "$a" | cut -d' ' -f3)
stopped=$(sample --seed 11 --stop-ids "$first")
[ "$(echo "$stopped" | wc -w)" -le 3 ] || fail "stop id $first did not stop: '$stopped'"
echo "ok: seeded sampling replays; stop ids stop"

expect_rc() {
    local want_rc=$1; shift
    set +e; "$gen" "$@" >/dev/null 2>&1; local rc=$?; set -e
    [ "$rc" = "$want_rc" ] || fail "exit $rc, want $want_rc for: $*"
}
expect_rc 0 --help
expect_rc 2 --model "$root/qwen3_moe" --prompt-ids 1,2
expect_rc 2 --model "$root/qwen3_moe" --prompt-ids 1,x --max-tokens 2
expect_rc 2 --bogus-flag
expect_rc 3 --model "$root/qwen3_moe" --prompt-ids "" --max-tokens 2
expect_rc 3 --model "$root/qwen3_moe" --prompt-ids 1,512 --max-tokens 2
expect_rc 3 --model "$root/does_not_exist" --prompt-ids 1 --max-tokens 2
expect_rc 2 --model "$root/qwen3_moe" --prompt-ids 1 --max-tokens 2 --top-p 0
expect_rc 2 --model "$root/qwen3_moe" --prompt-ids 1 --max-tokens 0
expect_rc 2 --model "$root/qwen3_moe" --prompt-ids 1 --max-tokens 2 --weights-dtype q4
echo "ok: exit codes"

# --weights-dtype q8: the load line reports the q8 bytes; 1 and 2 threads give the same ids.
dir="$root/qwen3_moe"
prompt=$(tr -d '[] \n' < "$dir/prompt_ids.json")
q8() { "$gen" --model "$dir" --prompt-ids "$prompt" --max-tokens 12 --ignore-eos --weights-dtype q8 "$@"; }
q8 --threads 1 >"$TEST_TMPDIR/q8.1" 2>"$TEST_TMPDIR/q8.err" || fail "q8 run failed: $(cat "$TEST_TMPDIR/q8.err")"
q8 --threads 2 >"$TEST_TMPDIR/q8.2" 2>/dev/null || fail "q8 run (2 threads) failed"
grep -q "^weights: q8, .* of 8-bit copies in place of" "$TEST_TMPDIR/q8.err" || fail "no q8 load line"
[ "$(head -1 "$TEST_TMPDIR/q8.1")" = "$(head -1 "$TEST_TMPDIR/q8.2")" ] || fail "q8 ids depend on threads"
[ "$(head -1 "$TEST_TMPDIR/q8.1" | wc -w)" = 12 ] || fail "q8: expected 12 ids"
echo "ok: --weights-dtype q8 ($(head -1 "$TEST_TMPDIR/q8.1"))"
