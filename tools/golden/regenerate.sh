#!/usr/bin/env bash
# Regenerates every golden fixture in tests/golden (deterministic): sets up the pinned venv via
# tools/venv.sh, then runs the generators. Extra arguments go to generate.py (e.g. --only qwen3_moe);
# the tokenizer golden (tests/runtime/text/testdata/tokenizer_golden.jsonl) is rewritten every time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$("$root/tools/venv.sh" | tail -1)"
"$py" "$root/tools/golden/generate.py" --out "$root/tests/golden" "$@"
exec "$py" "$root/tools/golden/tokenizer_golden.py" \
    --tokenizer "$root/tests/runtime/text/testdata/qwen3-tokenizer" \
    --out "$root/tests/runtime/text/testdata/tokenizer_golden.jsonl"
