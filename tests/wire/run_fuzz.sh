#!/bin/bash
# Runs the wire libFuzzer target (verifier + readers) for SECONDS (default 60) on a scratch
# copy of the committed seed corpus, so new inputs never land in the repository.
#   tests/wire/run_fuzz.sh [SECONDS] [extra libFuzzer flags...]
# Exit: 0 no crash/leak/out-of-bounds read found, non-zero otherwise (libFuzzer's status;
# the crashing input is written to the scratch directory, whose path is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
    echo "usage: tests/wire/run_fuzz.sh [SECONDS] [libFuzzer flags...]" >&2
    exit 2
fi
bazel build --config=fuzz //tests/wire:wire_fuzz
binary="$(bazel info --config=fuzz bazel-bin)/tests/wire/wire_fuzz"
work="$(mktemp -d /tmp/strata_wire_fuzz.XXXXXX)"
cp tests/wire/fuzz_corpus/* "$work/"
echo "wire fuzz: ${seconds}s, corpus copy and any crash inputs in $work"
cd "$work"
"$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 "$@" "$work"
