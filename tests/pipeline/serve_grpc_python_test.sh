#!/usr/bin/env bash
# Integration, optional: the official Python gRPC client (grpcio, stubs generated from the
# committed runtime/serve/strata.proto by grpc_tools.protoc) against strata-serve --grpc-port
# before a 2-stage pipeline: Generate with a golden case's prompt ids streams transformers'
# ids, and their streamed text equals strata-grpc-client's; Chat (whose template tokens this
# 1000-token model lacks) and a bad value are INVALID_ARGUMENT;
# cancelling a stream cancels the request on every stage; Health and Info answer, Info listing
# the two stages' layer ranges, roles and devices as they describe themselves.
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
TOKDIR="$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer"
case=qwen3_long_prompt
model="$PL_WORK/model"
cp -r "$(pl_golden "$case")" "$model" && cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$model/" ||
    pl_fail "cannot copy the golden model and the tokenizer"
mkdir -p "$PL_WORK/stubs"
"$py" -m grpc_tools.protoc -I "$PL_ROOT/runtime/serve" --python_out="$PL_WORK/stubs" \
    --grpc_python_out="$PL_WORK/stubs" "$PL_ROOT/runtime/serve/strata.proto" ||
    pl_fail "grpc_tools.protoc failed on strata.proto"
pl_start_pipeline p 2 "$model" --max-seq 256 --step-delay-ms 2 # the cancel lands mid-stream
# shellcheck disable=SC2046
"$PL_BIN/strata-serve" --model "$model" --stage0-port-file "$PL_WORK/p.0.port" --max-seq 256 \
    --no-http --grpc-port-file "$PL_WORK/grpc.port" $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/grpc.port" 20 || pl_fail "strata-serve did not start"
addr="127.0.0.1:$(cat "$PL_WORK/grpc.port")"
"$PL_BIN/strata-grpc-client" --addr "$addr" --prompt "$(pl_golden_prompt "$case")" --ignore-eos \
    --max-tokens "$(pl_golden_steps "$case")" --temperature 0 >"$PL_WORK/c.out" 2>"$PL_WORK/c.err" ||
    pl_fail "strata-grpc-client failed: $(cat "$PL_WORK/c.err")"
STRATA_ADDR="$addr" STRATA_PROMPT="$(pl_golden_prompt "$case")" STRATA_WANT="$(pl_golden_generated "$case")" \
    STRATA_C_TEXT="$(cat "$PL_WORK/c.out")" PYTHONPATH="$PL_WORK/stubs" "$py" - <<'PY' || pl_fail "grpcio client checks failed"
import os
import grpc
import strata_pb2 as pb
import strata_pb2_grpc as pbg

ch = grpc.insecure_channel(os.environ["STRATA_ADDR"])
stub = pbg.StrataStub(ch)
prompt = [int(x) for x in os.environ["STRATA_PROMPT"].split(",")]
want = [int(x) for x in os.environ["STRATA_WANT"].split(",")]
params = pb.GenerationParams(max_tokens=len(want), temperature=0.0, ignore_eos=True)
msgs = list(stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=params)))
got = [t for m in msgs for t in m.token_ids]
assert got == want, (got, want)
assert len(msgs) >= 2, len(msgs)
assert msgs[-1].finish_reason == pb.FINISH_REASON_LENGTH
assert msgs[-1].usage.prompt_tokens == len(prompt) and msgs[-1].usage.completion_tokens == len(want)
text = "".join(m.text for m in msgs)
assert text == os.environ["STRATA_C_TEXT"], (text, os.environ["STRATA_C_TEXT"])
print(f"Generate: golden ids in {len(msgs)} messages, text equals strata-grpc-client's")

chat = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="Hello")],
                      params=pb.GenerationParams(max_tokens=16, temperature=0.0))
try:
    list(stub.Chat(chat))
    raise SystemExit("Chat with template ids past the model's vocabulary was accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "vocabulary" in e.details(), e
    print("Chat past the model's vocabulary: INVALID_ARGUMENT:", e.details())

try:
    list(stub.Generate(pb.GenerateRequest(text="hi", params=pb.GenerationParams(temperature=3.0))))
    raise SystemExit("temperature 3 was accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in e.details(), e
    print("bad temperature: INVALID_ARGUMENT:", e.details())

stream = stub.Generate(pb.GenerateRequest(
    token_ids=pb.TokenIds(ids=prompt),
    params=pb.GenerationParams(max_tokens=200, temperature=0.0, ignore_eos=True)))
next(stream)
stream.cancel()
try:
    list(stream)
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.CANCELLED, e
print("cancelled mid-stream")

assert stub.Health(pb.HealthRequest()).status == pb.HealthResponse.SERVING
info = stub.Info(pb.InfoRequest())
assert info.model == "model" and info.max_seq == 256 and info.chat_template, info
# The stages as they describe themselves round the ring: the even split of 4 layers.
assert info.stages_error == "" and len(info.stages) == 2, info
for i, (a, b) in enumerate([(0, 2), (2, 4)]):
    s = info.stages[i]
    assert (s.stage_index, s.num_stages, s.layer_start, s.layer_end) == (i, 2, a, b), s
    assert (s.embed, s.head, s.vision) == (i == 0, i == 1, False), s
    assert s.device.startswith("cpu, ") and s.tp == 1 and s.kvp == 1 and s.threads >= 1, s
    assert s.weights_dtype == "bf16" and s.version == "strata " + info.strata_version, s
    # The load as the describe passed (the cancelled stream may still hold its slot).
    assert s.max_seq == 256 and 0 <= s.kv_slots_in_use <= s.max_batch and s.queue_depth >= 0, s
print("Health SERVING; Info:", info.model, info.max_seq, info.vocab_size, "stages",
      [(s.layer_start, s.layer_end, s.device) for s in info.stages])
PY
for r in 0 1; do
    pl_wait_log "$PL_WORK/p.$r.log" "cancelled: request cancelled by the client" 1 10 ||
        pl_fail "stage $r did not cancel the stream the Python client cancelled"
done
echo "PASS"
