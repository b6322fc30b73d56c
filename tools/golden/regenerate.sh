#!/usr/bin/env bash
# Regenerates every golden fixture in tests/golden (deterministic): sets up the pinned venv via
# tools/venv.sh, then runs the generators. Extra arguments go to generate.py (e.g. --only qwen3_moe);
# the tokenizer and chat-template goldens (tests/runtime/text/testdata/*_golden.jsonl) are
# rewritten every time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$("$root/tools/venv.sh" | tail -1)"
"$py" "$root/tools/golden/generate.py" --out "$root/tests/golden" "$@"
"$py" "$root/tools/golden/vl_image_golden.py" --golden "$root/tests/golden"
# video files are written once with Debian's ffmpeg command line (kept when present)
"$py" "$root/tools/golden/vl_video_golden.py" --golden "$root/tests/golden"
"$py" "$root/tools/golden/chat_template_golden.py" \
    --tokenizer "$root/tests/runtime/text/testdata/qwen3-tokenizer" \
    --vl-template "$root/tests/runtime/text/testdata/qwen3-vl-chat-template/chat_template.json" \
    --out "$root/tests/runtime/text/testdata/chat_template_golden.jsonl"
exec "$py" "$root/tools/golden/tokenizer_golden.py" \
    --tokenizer "$root/tests/runtime/text/testdata/qwen3-tokenizer" \
    --out "$root/tests/runtime/text/testdata/tokenizer_golden.jsonl"
