#!/usr/bin/env bash
# strata-chat (./strata chat) against a 2-stage pipeline on a random checkpoint with the real
# Qwen3 vocabulary: the history is kept (the second turn's prompt holds the first turn and its
# answer), the first answer's text equals strata-client --chat's for the same message (greedy),
# /reset forgets (the same message then gives the same prompt size and answer), a turn the
# stages refuse (longer than --max-seq) is reported and leaves the history as it was, and end
# of input ends the chat with exit 0.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
model="$PL_WORK/model"
"$PL_BIN/strata-stage-bench" make-model --out "$model" --vocab 151936 --hidden 64 --layers 2 \
    --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 5 >"$PL_WORK/make.log" 2>&1 ||
    pl_fail "make-model failed"
cp "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json" \
    "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json" "$model/"
pl_start_pipeline c 2 "$model" --max-seq 160
chat() {
    "$PL_BIN/strata-chat" --model "$model" --port-file "$PL_WORK/c.0.port" --max-tokens 12 \
        --insecure "$@"
}

long=$(printf 'word %.0s' $(seq 1 200))
printf 'Hello there\nTell me more\n/reset\nHello there\n%s\n/bogus\nHello there\n' "$long" |
    chat >"$PL_WORK/chat.out" 2>"$PL_WORK/chat.err" || pl_fail "strata-chat exited $? ($(cat "$PL_WORK/chat.err"))"
grep -v 'warning' "$PL_WORK/chat.err" >&2 || true
mapfile -t usage < <(grep '^\[' "$PL_WORK/chat.err")
[ "${#usage[@]}" = 4 ] || pl_fail "want 4 answered turns, got ${#usage[@]}"
prompt_of() { echo "$1" | sed 's/^\[\([0-9]*\) prompt tokens, \([0-9]*\) generated.*/\1/'; }
gen_of() { echo "$1" | sed 's/^\[\([0-9]*\) prompt tokens, \([0-9]*\) generated.*/\2/'; }
p1=$(prompt_of "${usage[0]}") p2=$(prompt_of "${usage[1]}") p3=$(prompt_of "${usage[2]}")
p4=$(prompt_of "${usage[3]}") g1=$(gen_of "${usage[0]}") g3=$(gen_of "${usage[2]}")
[ "$p2" -gt $((p1 + g1)) ] || pl_fail "turn 2's prompt ($p2) does not hold turn 1 ($p1 + $g1)"
[ "$p3" = "$p1" ] || pl_fail "after /reset the prompt is $p3 tokens, want $p1"
# The refused turn leaves the history as it was: turn 3 and its answer, then the new message.
[ "$p4" -gt $((p3 + g3)) ] && [ "$p4" -lt 200 ] ||
    pl_fail "after the refused turn the prompt is $p4 tokens, want turn 3 ($p3 + $g3) + one message"
grep -q 'max.seq\|max_seq\|too long\|exceed' "$PL_WORK/chat.err" ||
    pl_fail "the over-long turn was not reported: $(cat "$PL_WORK/chat.err")"
grep -q 'unknown command /bogus' "$PL_WORK/chat.err" || pl_fail "/bogus not reported"
mapfile -t answers <"$PL_WORK/chat.out"
[ "${answers[0]}" = "${answers[2]}" ] ||
    pl_fail "the same first message gave different answers: '${answers[0]}' / '${answers[2]}'"
"$PL_BIN/strata-client" --model "$model" --port-file "$PL_WORK/c.0.port" --max-tokens 12 \
    --insecure --chat "Hello there" >"$PL_WORK/client.out" 2>/dev/null || pl_fail "strata-client --chat failed"
[ "$(head -n 1 "$PL_WORK/client.out")" = "${answers[0]}" ] ||
    pl_fail "strata-chat's answer '${answers[0]}' != strata-client --chat's '$(head -n 1 "$PL_WORK/client.out")'"
echo "ok: history kept ($p1 -> $p2 prompt tokens), /reset forgets, refused turn reported, same text as strata-client"
# Messages as arguments are turns in order, like the first two lines of the interactive run.
chat "Hello there" "Tell me more" </dev/null >"$PL_WORK/args.out" 2>"$PL_WORK/args.err" ||
    pl_fail "strata-chat with messages exited $?"
[ "$(sed -n 1,2p "$PL_WORK/args.out")" = "$(printf '%s\n%s' "${answers[0]}" "${answers[1]}")" ] ||
    pl_fail "argument turns differ from the interactive ones: $(cat "$PL_WORK/args.out")"
echo "ok: messages as arguments give the interactive turns' answers"
rc=0
"$PL_BIN/strata-chat" --model "$model" --port 1 --insecure </dev/null >/dev/null 2>&1 || rc=$?
[ "$rc" = 1 ] || pl_fail "no stage 0 on the port: exit $rc, want 1"
rc=0
chat --bogus </dev/null >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || pl_fail "bad option: exit $rc, want 2"
pl_stop_pipeline c 2
echo "ok: exit codes 1 (no pipeline) and 2 (usage)"
