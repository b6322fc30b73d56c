#!/bin/sh
# Runs `strata-sim --all-splits` on one golden model (args: binary, model dir, extra flags)
# and fails unless every split of every S from 2 to L ran and was bit-identical to the
# single-stage baseline (strata-sim exits 1 on any difference in tokens or logits).
set -u
bin=$1
model=$2
shift 2
out=$("$bin" --model "$model" --all-splits "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: strata-sim exited with $rc"
    exit 1
fi
layers=$(printf '%s\n' "$out" | sed -n 's/^model: .* L=\([0-9]*\) .*/\1/p')
if [ -z "$layers" ]; then
    echo "FAIL: no layer count in the model line"
    exit 1
fi
# Every S from 2 to L has at least one row whose identical column says yes.
s=2
while [ "$s" -le "$layers" ]; do
    if ! printf '%s\n' "$out" | awk -v s="$s" '$2 == s && $3 == "yes" { found = 1 } END { exit !found }'; then
        echo "FAIL: no bit-identical run with $s stages"
        exit 1
    fi
    s=$((s + 1))
done
if printf '%s\n' "$out" | awk '$3 == "NO" || $3 == "FAILED" || $3 == "ERROR" { bad = 1 } END { exit !bad }'; then
    echo "FAIL: a run differs or failed"
    exit 1
fi
printf '%s\n' "$out" | grep -q '^OK: ' || { echo "FAIL: no OK line"; exit 1; }
# --warm: every run (the baseline's too) says how many prompt tokens its repeats reused.
case " $* " in *" --warm "*)
    runs=$(printf '%s\n' "$out" | grep -Ec '^[0-9]+(-[0-9]+)?(\|[0-9]+-[0-9]+)* +[0-9]+ ')
    warm=$(printf '%s\n' "$out" | grep -c '^    warm repeats: [1-9][0-9]* prompt tokens from the KV cache')
    [ "$warm" -eq "$runs" ] || { echo "FAIL: $warm of $runs runs report reused KV blocks"; exit 1; } ;;
esac
# --speculate: every run but the baseline says how many drafts it sent and how many the last
# stage accepted; each must have accepted some and rejected some (whose rows were dropped).
case " $* " in *" --speculate ngram "* | *" --speculate draft "*)
    runs=$(printf '%s\n' "$out" | grep -Ec '^[0-9]+(-[0-9]+)?(\|[0-9]+-[0-9]+)* +[0-9]+ ')
    spec=$(printf '%s\n' "$out" | awk '/^    speculation: [0-9]+ decode steps carried/ {
        d = $6; a = $8; if (a > 0 && d > a) n++ } END { print n + 0 }')
    [ "$spec" -eq $((runs - 1)) ] || {
        echo "FAIL: $spec of $((runs - 1)) speculating runs both accepted and rejected drafts"; exit 1; } ;;
esac
echo "PASS: all splits of $model bit-identical"
