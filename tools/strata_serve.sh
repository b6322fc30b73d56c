#!/usr/bin/env bash
# An OpenAI-compatible HTTP server on a local pipeline: starts an N-stage pipeline of
# strata-stage processes on loopback for a model directory (config.json + safetensors +
# tokenizer.json + chat template) plus strata-serve in front of stage 0, prints the URL, and
# stops everything on Ctrl-C / SIGTERM (or when any of them exits). Binaries:
# $STRATA_BIN_DIR/runtime (./strata serve builds them and sets it), or Bazel runfiles.
# Usage: tools/strata_serve.sh --model DIR [--stages N] [--host H] [--port P] [--port-file F]
#        [--max-seq N] [--threads T] [--max-batch N] [--max-queue N] [--queue-timeout-ms MS]
#        [--kv-memory SIZE|PCT] [--kv-dtype D] [--no-prefix-cache] [--served-model-name NAME]
#        [--grpc-port P] (gRPC beside HTTP) [--no-console] (no web console at / and
#        /pipeline); --max-batch (requests in flight), the admission
#        queue's bounds, the KV pool's budget (per stage) and dtype, and prefix reuse go to
#        every stage, as do its matmul --threads (strata-stage --help)
set -u
. "$(dirname "$0")/../tests/pipeline/pipeline_lib.sh"

serve_usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
}

model="" stages=1 host=127.0.0.1 port=8000 port_file="" max_seq=4096 grpc_port="" no_console=0
PL_GRPC_PORT_FILE="$(mktemp -u "${TMPDIR:-/tmp}/strata-grpc-port.XXXXXX")"
serve_opts=()
stage_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --port-file) port_file=$2; shift 2 ;;
    --max-seq) max_seq=$2; shift 2 ;;
    --max-batch | --max-queue | --queue-timeout-ms | --kv-memory | --kv-dtype | --threads) stage_opts+=("$1" "$2"); shift 2 ;;
    --no-prefix-cache) stage_opts+=("$1"); shift ;;
    --no-console) serve_opts+=("$1"); no_console=1; shift ;;
    --served-model-name) serve_opts+=(--served-model-name "$2"); shift 2 ;;
    --grpc-port) grpc_port=$2; serve_opts+=(--grpc-port "$2" --grpc-port-file "$PL_GRPC_PORT_FILE"); shift 2 ;;
    -h | --help) serve_usage; exit 0 ;;
    *) echo "strata serve: unknown argument $1" >&2; serve_usage >&2; exit 2 ;;
    esac
done
if [ -z "$model" ] || ! [ "$stages" -ge 1 ] 2>/dev/null || ! [ "$port" -ge 0 ] 2>/dev/null; then
    serve_usage >&2
    exit 2
fi
[ -f "$model/config.json" ] || { echo "strata serve: no $model/config.json" >&2; exit 2; }
[ -f "$model/tokenizer.json" ] || { echo "strata serve: no $model/tokenizer.json" >&2; exit 2; }

pl_init
[ -x "$PL_BIN/strata-serve" ] || pl_fail "strata-serve not found at $PL_BIN/strata-serve"
pl_start_pipeline serve "$stages" "$model" --max-seq "$max_seq" "${stage_opts[@]}"
[ -n "$port_file" ] || port_file="$PL_WORK/http.port"
rm -f "$port_file"
"$PL_BIN/strata-serve" --model "$model" --stage0-port-file "$PL_WORK/serve.0.port" \
    --host "$host" --port "$port" --port-file "$port_file" --max-seq "$max_seq" \
    $(pl_security_default) "${serve_opts[@]}" &
serve_pid=$!
PL_PIDS="$PL_PIDS $serve_pid"
pl_wait_file "$port_file" 20 || pl_fail "strata-serve did not start"
echo "strata serve: http://$host:$(cat "$port_file")/v1 (model $(basename "$model"), $stages stage(s)); Ctrl-C stops" >&2
[ "$no_console" = 1 ] || echo "strata serve: web console: chat at http://$host:$(cat "$port_file")/," \
    "the pipeline at http://$host:$(cat "$port_file")/pipeline" >&2
if [ -n "$grpc_port" ]; then
    pl_wait_file "$PL_GRPC_PORT_FILE" 20 || pl_fail "strata-serve did not start gRPC"
    echo "strata serve: gRPC $host:$(cat "$PL_GRPC_PORT_FILE") (strata.v1.Strata, runtime/serve/strata.proto)" >&2
    rm -f "$PL_GRPC_PORT_FILE"
fi
# Ctrl-C reaches the whole process group (the stages and strata-serve too), so a stage may
# already be gone or report the interrupt: stop whatever is left and wait for it, without
# judging exit statuses (pl_cleanup kills anything still there on exit).
stop() {
    trap '' INT TERM
    kill "$serve_pid" 2>/dev/null
    wait "$serve_pid" 2>/dev/null
    for ((r = 0; r < stages; r++)); do
        kill "$(pl_pid serve "$r")" 2>/dev/null
    done
    for ((r = 0; r < stages; r++)); do
        wait "$(pl_pid serve "$r")" 2>/dev/null
    done
    echo "strata serve: stopped" >&2
    exit 0
}
trap stop INT TERM
# Wakes every second (so the traps run promptly) until strata-serve or a stage exits.
while kill -0 "$serve_pid" 2>/dev/null; do
    for ((r = 0; r < stages; r++)); do
        kill -0 "$(pl_pid serve "$r")" 2>/dev/null || pl_fail "stage $r exited"
    done
    sleep 1
done
pl_fail "strata-serve exited"
