#!/usr/bin/env bash
# Creates or updates the Python venv used by the golden generator, idempotently, and prints
# its python path on the last line of stdout. pip runs only when the pinned versions in
# tools/requirements.txt are not already importable. Location: ${STRATA_VENV:-$HOME/.cache/strata/venv}.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${STRATA_VENV:-$HOME/.cache/strata/venv}"
req="$here/requirements.txt"
py="$venv/bin/python"

pinned_ok() {
    [ -x "$py" ] || return 1
    "$py" - "$req" <<'PYEOF' >/dev/null 2>&1
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    have = md.version(name)
    if have.split("+")[0] != version:
        raise SystemExit(1)
import torch, torchvision, PIL, transformers, safetensors, numpy  # noqa: F401  (importable, not just listed)
PYEOF
}

if ! pinned_ok; then
    if [ ! -x "$py" ]; then
        echo "venv.sh: creating $venv" >&2
        python3 -m venv "$venv" >&2
    fi
    echo "venv.sh: installing $req (torch is large; this takes a while)" >&2
    "$py" -m pip install --upgrade pip >&2
    # PyPI's torch wheel pulls the CUDA libraries (GBs). Where PyTorch's CPU-only index is
    # reachable, STRATA_TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU
    # build of the same pinned version instead (the golden math runs on the CPU either way).
    if [ -n "${STRATA_TORCH_INDEX:-}" ]; then
        "$py" -m pip install --extra-index-url "$STRATA_TORCH_INDEX" -r "$req" >&2
    else
        "$py" -m pip install -r "$req" >&2
    fi
    pinned_ok || { echo "venv.sh: pinned packages still not importable in $venv" >&2; exit 1; }
fi
echo "$py"
