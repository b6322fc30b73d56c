#!/usr/bin/env bash
# strata-generate end to end: greedy ids equal transformers' golden ids (at 1 and 2 threads),
# bad input exits with the documented codes (2 usage, 3 bad input/model), and --weights-dtype q8
# reports its bytes and keeps ids independent of the thread count; load progress goes to stderr
# (STRATA_PROGRESS=1), never stdout, and not at all for a quick load by default.
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

# Load progress (stderr only): STRATA_PROGRESS=1 prints it and leaves stdout as it was; by
# default a load of milliseconds with stderr not a terminal (a test, a log) prints none; =0 none.
run_progress() {
    local mode=$1; shift
    env ${mode:+STRATA_PROGRESS=$mode} "$gen" --model "$dir" --prompt-ids "$prompt" --max-tokens 4 \
        --ignore-eos "$@" >"$TEST_TMPDIR/p.out" 2>"$TEST_TMPDIR/p.err" || fail "run failed: $(cat "$TEST_TMPDIR/p.err")"
    head -1 "$TEST_TMPDIR/p.out" # the ids (speeds differ between runs)
}
plain=$(run_progress "")
grep -q "^loading weights" "$TEST_TMPDIR/p.err" && fail "progress printed on a quick load: $(cat "$TEST_TMPDIR/p.err")"
for dtype in bf16 q8; do
    forced=$(run_progress 1 --weights-dtype "$dtype")
    [ "$dtype" = q8 ] || [ "$forced" = "$plain" ] || fail "STRATA_PROGRESS=1 changed stdout: '$forced' vs '$plain'"
    grep -q "loading" "$TEST_TMPDIR/p.out" && fail "progress on stdout: $(cat "$TEST_TMPDIR/p.out")"
    [ "$(wc -l < "$TEST_TMPDIR/p.out")" = 4 ] || fail "stdout is not 4 lines: $(cat "$TEST_TMPDIR/p.out")"
    phase=$([ "$dtype" = q8 ] && echo "quantising to q8" || echo "copying to huge pages")
    grep -q "^loading weights: 0% (0.0 / 0.5 MB) 0.0 s, reading tensors$" "$TEST_TMPDIR/p.err" \
        || fail "$dtype: no first progress line: $(cat "$TEST_TMPDIR/p.err")"
    grep -q "^loading weights: 100% (0.5 / 0.5 MB) [0-9.]* s, $phase$" "$TEST_TMPDIR/p.err" \
        || fail "$dtype: no 100% line: $(cat "$TEST_TMPDIR/p.err")"
    grep -q "^loading weights: done, 0.5 MB in [0-9.]* s ([0-9.]* GB/s)$" "$TEST_TMPDIR/p.err" \
        || fail "$dtype: no final line: $(cat "$TEST_TMPDIR/p.err")"
done
run_progress 0 >/dev/null
grep -q "^loading weights" "$TEST_TMPDIR/p.err" && fail "STRATA_PROGRESS=0 printed progress"
"$gen" --help | grep -q "STRATA_PROGRESS=1" || fail "--help does not name STRATA_PROGRESS"
echo "ok: load progress on stderr with STRATA_PROGRESS=1, none on stdout, none by default"
