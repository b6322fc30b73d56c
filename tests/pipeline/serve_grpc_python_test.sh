#!/usr/bin/env bash
# Integration, optional: the official Python gRPC client (grpcio, stubs generated from the
# committed runtime/serve/strata.proto by grpc_tools.protoc; serve_grpc_python_client.py)
# against strata-serve --grpc-port, doing what the openai / curl tests do over HTTP:
# 1. before a 2-stage pipeline on a golden case: Generate with its prompt ids streams
#    transformers' ids, their text equals strata-grpc-client's; Chat (whose template tokens
#    this 1000-token model lacks) is INVALID_ARGUMENT; Health and Info answer, Info listing the
#    two stages' layer ranges, roles and devices as they describe themselves;
# 2. before a 2-stage pipeline (--max-batch 16) on a tiny random checkpoint with the real
#    Qwen3 vocabulary: Chat's streamed text == the HTTP front's non-streamed text == the
#    detokenised ids of a direct strata-client run (the same ids, the same usage); 16
#    concurrent streams == their solo runs; a stream cancelled, and a channel closed,
#    mid-stream: every stage's KV slots in use (Info's describe) back to 0 and the stages log
#    the cancel; malformed requests get INVALID_ARGUMENT / UNIMPLEMENTED with a message, and
#    the server keeps serving.
# Runs only when a Python with grpcio and grpcio-tools exists ($STRATA_GRPC_PYTHON, else the
# venv at ${STRATA_VENV:-$HOME/.cache/strata/venv}; tools/requirements-grpc.txt pins them);
# otherwise prints "skipped: <reason>" and passes. Never installs anything.
set -u
py="${STRATA_GRPC_PYTHON:-${STRATA_VENV:-${HOME:-/nonexistent}/.cache/strata/venv}/bin/python}"
if ! [ -x "$py" ]; then
    echo "skipped: no Python at $py (set STRATA_GRPC_PYTHON to one with grpcio and grpcio-tools)"
    exit 0
fi
if ! "$py" -c 'import grpc, grpc_tools.protoc' 2>/dev/null; then
    echo "skipped: $py has no grpcio / grpcio-tools (tools/requirements-grpc.txt)"
    exit 0
fi
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
client_py="$(dirname "$0")/serve_grpc_python_client.py"
TOKDIR="$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer"
mkdir -p "$PL_WORK/stubs"
"$py" -m grpc_tools.protoc -I "$PL_ROOT/runtime/serve" --python_out="$PL_WORK/stubs" \
    --grpc_python_out="$PL_WORK/stubs" "$PL_ROOT/runtime/serve/strata.proto" ||
    pl_fail "grpc_tools.protoc failed on strata.proto"

# start_serve TAG MODEL [options]: strata-serve before pipeline TAG; sets ADDR and SERVE_PID.
start_serve() {
    local tag=$1 model=$2
    shift 2
    # shellcheck disable=SC2046
    "$PL_BIN/strata-serve" --model "$model" --stage0-port-file "$PL_WORK/$tag.0.port" --max-seq 256 \
        --grpc-port-file "$PL_WORK/$tag.grpc.port" "$@" $(pl_security_default) 2>>"$PL_WORK/$tag.serve.log" &
    SERVE_PID=$!
    PL_PIDS="$PL_PIDS $SERVE_PID"
    pl_wait_file "$PL_WORK/$tag.grpc.port" 20 || pl_fail "strata-serve $tag did not start"
    ADDR="127.0.0.1:$(cat "$PL_WORK/$tag.grpc.port")"
}

# 1. Golden ids.
case=qwen3_long_prompt
golden="$PL_WORK/golden"
cp -r "$(pl_golden "$case")" "$golden" && cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$golden/" ||
    pl_fail "cannot copy the golden model and the tokenizer"
pl_start_pipeline g 2 "$golden" --max-seq 256 --step-delay-ms 2 # tokens arrive one by one
start_serve g "$golden" --no-http
"$PL_BIN/strata-grpc-client" --addr "$ADDR" --prompt "$(pl_golden_prompt "$case")" --ignore-eos \
    --max-tokens "$(pl_golden_steps "$case")" --temperature 0 >"$PL_WORK/c.out" 2>"$PL_WORK/c.err" ||
    pl_fail "strata-grpc-client failed: $(cat "$PL_WORK/c.err")"
STRATA_ADDR="$ADDR" STRATA_PROMPT="$(pl_golden_prompt "$case")" STRATA_WANT="$(pl_golden_generated "$case")" \
    STRATA_C_TEXT="$(cat "$PL_WORK/c.out")" PYTHONPATH="$PL_WORK/stubs" "$py" "$client_py" golden ||
    pl_fail "grpcio client checks (golden) failed"
kill "$SERVE_PID"
wait "$SERVE_PID" || pl_fail "strata-serve exited with $? after SIGTERM"
pl_stop_pipeline g 2

# 2. Text on the real vocabulary. --step-delay-ms: each step takes >= 2 ms per stage, so a
# 200-token answer lasts >= 0.8 s and the cancels land mid-stream however fast the machine.
model="$PL_WORK/model"
"$PL_BIN/strata-stage-bench" make-model --out "$model" --vocab 151936 --hidden 64 --layers 2 \
    --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 11 >"$PL_WORK/make.log" 2>&1 ||
    pl_fail "make-model failed: $(cat "$PL_WORK/make.log")"
cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$model/" || pl_fail "cannot copy the tokenizer"
pl_start_pipeline t 2 "$model" --max-seq 256 --max-batch 16 --step-delay-ms 2
start_serve t "$model" --port-file "$PL_WORK/t.http.port"
pl_wait_file "$PL_WORK/t.http.port" 20 || pl_fail "strata-serve t did not start HTTP"
# The direct run: strata-client straight to stage 0, the same chat turn and sampling.
pl_client t --model "$model" --chat Hello --max-tokens 24 --temperature 1.0 --top-k 0 --seed 777 \
    --print-ids >"$PL_WORK/direct.out" 2>"$PL_WORK/direct.err" ||
    pl_fail "strata-client --chat failed: $(cat "$PL_WORK/direct.err")"
STRATA_ADDR="$ADDR" STRATA_URL="http://127.0.0.1:$(cat "$PL_WORK/t.http.port")" \
    STRATA_DIRECT_PROMPT="$(sed -n 's/^prompt ids: //p' "$PL_WORK/direct.err")" \
    STRATA_DIRECT_IDS="$(sed -n 's/^generated ids: //p' "$PL_WORK/direct.err")" \
    STRATA_DIRECT_TEXT="$(cat "$PL_WORK/direct.out")" STRATA_TOKENIZE="$PL_BIN/strata-tokenize" \
    STRATA_MODEL="$model" PYTHONPATH="$PL_WORK/stubs" "$py" "$client_py" text ||
    pl_fail "grpcio client checks (text) failed"
for r in 0 1; do
    pl_wait_log "$PL_WORK/t.$r.log" "cancelled: request cancelled by the client" 2 10 ||
        pl_fail "stage $r did not cancel both streams the Python client gave up"
done
echo "PASS"
