#!/bin/bash
# Runs strata-transport-check on loopback: a clean run must pass, and a run where a relay
# corrupts one frame must be caught (exit 1), so the checker itself is shown to work.
set -u
check="$1"
if ! "$check" --hops 3 --frames 60 --max-tokens 16 --hidden 256; then
    echo "clean run failed"; exit 1
fi
"$check" --hops 2 --frames 10 --max-tokens 8 --hidden 64 --corrupt-frame 4
rc=$?
if [ "$rc" -ne 1 ]; then
    echo "corrupted run should exit 1, got $rc"; exit 1
fi
"$check" --hops 0 >/dev/null 2>&1
rc=$?
if [ "$rc" -ne 2 ]; then
    echo "bad usage should exit 2, got $rc"; exit 1
fi
echo "transport check: clean run OK, corruption detected, usage error exit 2"
