#!/usr/bin/env bash
# Regenerates every golden fixture in tests/golden (deterministic): sets up the pinned venv via
# tools/venv.sh, then runs the generator. Extra arguments go to generate.py (e.g. --only qwen3_moe).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$("$root/tools/venv.sh" | tail -1)"
exec "$py" "$root/tools/golden/generate.py" --out "$root/tests/golden" "$@"
