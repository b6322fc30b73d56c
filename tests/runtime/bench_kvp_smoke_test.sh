#!/bin/bash
# strata-bench-kvp runs end to end on a tiny golden (KVP 1, 2, 4 at two contexts) and prints a
# row for each: not a timing (nothing about speed is asserted), a guard against the bench
# breaking unnoticed (it once asked for KVP token ranges the block tree refuses), and its
# usage errors.
set -u
bench="$1"
model="$2"
out="$("$bench" --model "$model" --contexts 256,512 --kvp 1,2,4 --steps 2 2>&1)"
rc=$?
[ "$rc" = 0 ] || { echo "FAIL: exit $rc"; echo "$out"; exit 1; }
rows=$(echo "$out" | grep -cE '^(256|512) +[0-9]+ +[124] ')
[ "$rows" = 6 ] || { echo "FAIL: $rows rows, want 6"; echo "$out"; exit 1; }
if echo "$out" | grep -q "failed"; then echo "FAIL: a run failed"; echo "$out"; exit 1; fi
"$bench" --model "$model" --contexts 100 >/dev/null 2>&1
[ $? = 2 ] || { echo "FAIL: a context below the minimum is not a usage error"; exit 1; }
echo "PASS: 6 runs (contexts 256 and 512 x KVP 1, 2, 4)"
