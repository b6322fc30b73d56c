#!/usr/bin/env bash
# Creates, once, the small pinned venv of the real-client tests (tools/requirements-clients.txt:
# openai, grpcio, grpcio-tools, protobuf) and prints its python on the last line of stdout.
# pip runs only when the pinned versions are not already installed. Location:
# ${STRATA_CLIENTS_VENV:-$HOME/.cache/strata/venv-clients}. Exit status 1 (with pip's words on
# stderr) when it cannot be made, e.g. without a route to PyPI: the tests then say "skipped".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${STRATA_CLIENTS_VENV:-$HOME/.cache/strata/venv-clients}"
req="$here/requirements-clients.txt"
py="$venv/bin/python"

pinned_ok() {
    [ -x "$py" ] || return 1
    "$py" - "$req" <<'PYEOF' >/dev/null 2>&1
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        if md.version(name) != version:
            raise SystemExit(1)
import openai, grpc, grpc_tools.protoc  # noqa: F401  (importable, not just listed)
PYEOF
}

if ! pinned_ok; then
    if [ ! -x "$py" ]; then
        echo "venv_clients.sh: creating $venv" >&2
        python3 -m venv "$venv" >&2
    fi
    echo "venv_clients.sh: installing $req" >&2
    "$py" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
    pinned_ok || { echo "venv_clients.sh: $venv lacks the pinned packages after pip" >&2; exit 1; }
fi
echo "$py"
