#!/bin/sh
# all_splits_test.sh at a TP / KVP grid (args: binary, model dir, grid flags): the grid's
# single stage and every split are bit-identical to one rank (no TP / KVP; strata-sim's
# baseline under a grid), and that baseline's tokens equal golden.json's.
set -u
out=$(sh "$(dirname "$0")/all_splits_test.sh" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || exit 1
printf '%s\n' "$out" | grep -q '^grid: every stage is TP.*the baseline is one rank' ||
    { echo "FAIL: no grid line"; exit 1; }
printf '%s\n' "$out" | grep -Eq 'baseline vs golden.json: ([0-9]+)/\1 leading tokens match' ||
    { echo "FAIL: the grid's tokens differ from golden.json"; exit 1; }
echo "PASS: grid $* matches golden.json"
