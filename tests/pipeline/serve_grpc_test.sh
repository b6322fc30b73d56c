#!/usr/bin/env bash
# Integration: strata-serve's gRPC service (--grpc-port, runtime/serve/strata.proto) before
# real 2-stage pipelines, driven by strata-grpc-client (gRPC core C API + protobuf-c):
# 1. Generate with a golden case's prompt ids (greedy, ignore_eos) streams transformers'
#    generated ids, one message per token or so, finish "length" and the usage;
# 2. on a tiny random checkpoint with the real Qwen3 vocabulary: Chat's text equals the HTTP
#    front's and strata-client --chat's for the same seed, Generate from text equals
#    /v1/completions, a stop string cuts it; 4 concurrent streams equal their solo runs;
# 3. a client that cancels, or whose deadline passes, mid-stream has its request cancelled on
#    every stage and nothing stays in flight;
# 4. malformed protobuf, unknown model, bad sampling values, empty / over-long prompts, ids
#    outside the vocabulary and unknown methods get INVALID_ARGUMENT / UNIMPLEMENTED with a
#    message, and the server keeps serving;
# 5. Health (and grpc.health.v1's Check), Info; stage 0 gone: NOT_SERVING and UNAVAILABLE;
# 6. Info's stages (a describe round the ring), GET /v1/stages and strata-client --describe
#    list exactly the ranges 3 stages were started with; a killed stage is a clear error.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
SERVE="$PL_BIN/strata-serve"
GC="$PL_BIN/strata-grpc-client"
[ -x "$GC" ] || pl_fail "strata-grpc-client not found at $GC"
TOKDIR="$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer"

# start_serve TAG MODEL: strata-serve (HTTP and gRPC) before pipeline TAG; sets GPORT, URL.
start_serve() {
    local tag=$1 model=$2
    # shellcheck disable=SC2046
    "$SERVE" --model "$model" --stage0-port-file "$PL_WORK/$tag.0.port" --max-seq 256 \
        --port-file "$PL_WORK/$tag.http.port" --grpc-port-file "$PL_WORK/$tag.grpc.port" \
        $(pl_security_default) 2>>"$PL_WORK/$tag.serve.log" &
    PL_PIDS="$PL_PIDS $!"
    SERVE_PID=$!
    pl_wait_file "$PL_WORK/$tag.grpc.port" 20 || pl_fail "strata-serve $tag did not start"
    pl_wait_file "$PL_WORK/$tag.http.port" 20 || pl_fail "strata-serve $tag did not start"
    GPORT="$PL_WORK/$tag.grpc.port"
    URL="http://127.0.0.1:$(cat "$PL_WORK/$tag.http.port")"
}
gc() { "$GC" --port-file "$GPORT" "$@"; }
# status_of FILE: the "status: N NAME: message" line's NAME
status_of() { sed -n 's/^status: [0-9]* \([A-Z_]*\):.*/\1/p' "$1"; }
field_of() { sed -n "s/^$2: //p" "$1"; }

# 1. Golden ids through the pipeline, streamed.
case=qwen3_long_prompt
golden="$PL_WORK/golden"
cp -r "$(pl_golden "$case")" "$golden" && cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$golden/" ||
    pl_fail "cannot copy the golden model and the tokenizer"
# --step-delay-ms: each step takes >= 2 ms per stage, so a 200-token answer lasts >= 0.8 s and
# the cancel / deadline checks below land mid-stream however fast the machine.
pl_start_pipeline g 2 "$golden" --max-seq 256 --step-delay-ms 2
start_serve g "$golden"
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
gc --prompt "$prompt" --max-tokens "$steps" --temperature 0 --ignore-eos --chunks \
    >"$PL_WORK/golden.out" 2>"$PL_WORK/golden.err" || pl_fail "Generate: $(cat "$PL_WORK/golden.err")"
[ "$(field_of "$PL_WORK/golden.err" tokens)" = "$want" ] ||
    pl_fail "Generate tokens $(field_of "$PL_WORK/golden.err" tokens), golden $want"
chunk_ids=$(sed -n 's/^chunk [0-9]*: ids=\([0-9,]*\) .*/\1/p' "$PL_WORK/golden.out" | paste -sd, -)
[ "$chunk_ids" = "$want" ] || pl_fail "the chunks' ids $chunk_ids != golden $want"
n_chunks=$(grep -c '^chunk ' "$PL_WORK/golden.out")
[ "$(field_of "$PL_WORK/golden.err" finish)" = length ] || pl_fail "finish is not length"
n_prompt=$(echo "$prompt" | tr ',' '\n' | grep -c .)
[ "$(field_of "$PL_WORK/golden.err" usage)" = "prompt $n_prompt completion $steps" ] ||
    pl_fail "usage: $(field_of "$PL_WORK/golden.err" usage)"
tail -n 1 "$PL_WORK/golden.out" | grep -q 'finish=2$' || pl_fail "the last message has no finish"
echo "golden $case: Generate streams transformers' $steps ids in $n_chunks messages, usage ok"

# Greedy through the gRPC front == strata-client straight to stage 0 (the same path).
pl_client g --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/golden.client" ||
    pl_fail "strata-client failed"
[ "$(pl_tokens_of "$PL_WORK/golden.client" 0)" = "$want" ] || pl_fail "strata-client != golden"

# 4 (golden model). Malformed requests: INVALID_ARGUMENT / UNIMPLEMENTED, the server goes on.
expect_status() { # NAME PATTERN client-args...
    local name=$1 pattern=$2
    shift 2
    gc "$@" >"$PL_WORK/bad.out" 2>"$PL_WORK/bad.err" && pl_fail "$* succeeded"
    [ "$(status_of "$PL_WORK/bad.err")" = "$name" ] ||
        pl_fail "$*: $(tail -n 1 "$PL_WORK/bad.err"), want $name"
    grep -q "^status: .*$pattern" "$PL_WORK/bad.err" ||
        pl_fail "$*: message '$(tail -n 1 "$PL_WORK/bad.err")' lacks '$pattern'"
}
printf '\377\377\377\377' >"$PL_WORK/garbage.bin"
: >"$PL_WORK/empty.bin"
printf '\x0a\x05ab' >"$PL_WORK/truncated.bin" # field 1, length 5, 2 bytes
expect_status INVALID_ARGUMENT "not a valid strata.v1.GenerateRequest" \
    --method /strata.v1.Strata/Generate --raw-request "$PL_WORK/garbage.bin"
expect_status INVALID_ARGUMENT "not a valid strata.v1.ChatRequest" \
    --method /strata.v1.Strata/Chat --raw-request "$PL_WORK/truncated.bin"
expect_status INVALID_ARGUMENT "'text' or 'token_ids' is required" \
    --method /strata.v1.Strata/Generate --raw-request "$PL_WORK/empty.bin"
expect_status INVALID_ARGUMENT "'messages' must not be empty" \
    --method /strata.v1.Strata/Chat --raw-request "$PL_WORK/empty.bin"
expect_status UNIMPLEMENTED "unknown method /strata.v1.Strata/Nope" \
    --method /strata.v1.Strata/Nope --raw-request "$PL_WORK/empty.bin"
expect_status INVALID_ARGUMENT "the model 'gpt-4' does not exist" --prompt 1,2 --model gpt-4
expect_status INVALID_ARGUMENT "'temperature' is 3" --prompt 1,2 --temperature 3
expect_status INVALID_ARGUMENT "'temperature' is -0.5" --prompt 1,2 --temperature -0.5
expect_status INVALID_ARGUMENT "'top_p' is 0" --prompt 1,2 --top-p 0
expect_status INVALID_ARGUMENT "'top_p' is 1.5" --prompt 1,2 --top-p 1.5
expect_status INVALID_ARGUMENT "'max_tokens' is 100000" --prompt 1,2 --max-tokens 100000
expect_status INVALID_ARGUMENT "exceed the pipeline's 256" --prompt 1,2 --max-tokens 255
expect_status INVALID_ARGUMENT "'text' must not be empty" --text ""
expect_status INVALID_ARGUMENT "outside the vocabulary \[0, 151669)" --prompt 1,151669
expect_status INVALID_ARGUMENT "outside the vocabulary" --prompt 1,-3
# In the tokenizer's vocabulary but not this model's (1000): stage 0 refuses it.
expect_status INVALID_ARGUMENT "refused the request.*outside the vocabulary \[0, 1000)" --prompt 1,5000
long=$(seq -s, 1 300)
expect_status INVALID_ARGUMENT "the prompt has 300 tokens" --prompt "$long"
# Hand-encoded messages: GenerateRequest{token_ids: [1, 2], params: {stop: a b c d e}} and
# ChatRequest{messages: [{role: "robot", content: "hi"}]}.
printf '\x1a\x04\x0a\x02\x01\x02\x22\x0f\x32\x01a\x32\x01b\x32\x01c\x32\x01d\x32\x01e' >"$PL_WORK/stops.bin"
expect_status INVALID_ARGUMENT "at most 4 stop strings" \
    --method /strata.v1.Strata/Generate --raw-request "$PL_WORK/stops.bin"
printf '\x12\x0b\x0a\x05robot\x12\x02hi' >"$PL_WORK/robot.bin"
expect_status INVALID_ARGUMENT "robot" --method /strata.v1.Strata/Chat --raw-request "$PL_WORK/robot.bin"
gc --prompt "$prompt" --max-tokens 3 --temperature 0 >/dev/null 2>"$PL_WORK/after.err" ||
    pl_fail "no answer after the malformed requests: $(cat "$PL_WORK/after.err")"
echo "malformed requests: INVALID_ARGUMENT / UNIMPLEMENTED with messages; still serving"

# 3 (golden model). A long answer streams in many messages; cancel and a deadline mid-stream
# cancel the request on every stage.
t0=$(date +%s%N)
gc --prompt "$prompt" --max-tokens 200 --ignore-eos --temperature 0 >/dev/null 2>"$PL_WORK/long.err" ||
    pl_fail "a 200-token answer failed: $(cat "$PL_WORK/long.err")"
long_ms=$((($(date +%s%N) - t0) / 1000000))
n_long=$(field_of "$PL_WORK/long.err" messages)
[ "$n_long" -ge 4 ] || pl_fail "200 tokens came in $n_long message(s): not streamed"
echo "200 tokens streamed in $n_long messages in $long_ms ms"
gc --prompt "$prompt" --max-tokens 200 --ignore-eos --temperature 0 --cancel-after 1 \
    >/dev/null 2>"$PL_WORK/cancel.err" && pl_fail "a cancelled call succeeded"
[ "$(status_of "$PL_WORK/cancel.err")" = CANCELLED ] || pl_fail "cancel: $(tail -n 1 "$PL_WORK/cancel.err")"
pl_wait_log "$PL_WORK/g.serve.log" "abandoned after .* tokens: cancelled" 1 10 ||
    pl_fail "the cancelled call's request was not cancelled"
for r in 0 1; do
    pl_wait_log "$PL_WORK/g.$r.log" "cancelled: request cancelled by the client" 1 10 ||
        pl_fail "stage $r did not cancel the cancelled call's request"
done
gc --prompt "$prompt" --max-tokens 200 --ignore-eos --temperature 0 --deadline-ms 250 \
    >/dev/null 2>"$PL_WORK/deadline.err" && pl_fail "a call past its deadline succeeded"
[ "$(status_of "$PL_WORK/deadline.err")" = DEADLINE_EXCEEDED ] ||
    pl_fail "deadline: $(tail -n 1 "$PL_WORK/deadline.err")"
pl_wait_log "$PL_WORK/g.serve.log" "abandoned after .* tokens: cancelled" 2 10 ||
    pl_fail "the request past its deadline was not cancelled"
for r in 0 1; do
    pl_wait_log "$PL_WORK/g.$r.log" "cancelled: request cancelled by the client" 2 10 ||
        pl_fail "stage $r did not cancel the request past its deadline"
done
for ((k = 0; k < 100; k++)); do
    curl -sS "$URL/metrics" | grep -q '^strata_serve_requests_in_flight 0$' && break
    sleep 0.05
done
[ "$k" -lt 100 ] || pl_fail "a request stays in flight after the cancels"
gc --prompt "$prompt" --max-tokens "$steps" --temperature 0 --ignore-eos >/dev/null 2>"$PL_WORK/again.err" ||
    pl_fail "no answer after the cancels"
[ "$(field_of "$PL_WORK/again.err" tokens)" = "$want" ] || pl_fail "tokens after the cancels != golden"
curl -sS "$URL/metrics" >"$PL_WORK/metrics.txt"
for code in OK INVALID_ARGUMENT UNIMPLEMENTED CANCELLED; do
    grep -q "^strata_serve_grpc_requests_total{code=\"$code\"} [1-9]" "$PL_WORK/metrics.txt" ||
        pl_fail "/metrics lacks gRPC calls with status $code"
done
echo "cancel and deadline mid-stream: cancelled on every stage, nothing in flight, next call served"

# 5. Health, Info; then stage 0 gone.
gc --health >"$PL_WORK/health.out" 2>&1 || pl_fail "Health: $(cat "$PL_WORK/health.out")"
grep -qx 'health: SERVING' "$PL_WORK/health.out" || pl_fail "Health: $(cat "$PL_WORK/health.out")"
gc --method /grpc.health.v1.Health/Check --raw-request "$PL_WORK/empty.bin" >"$PL_WORK/hv1.out" 2>&1 ||
    pl_fail "grpc.health.v1 Check: $(cat "$PL_WORK/hv1.out")"
grep -q '^message: 2 bytes' "$PL_WORK/hv1.out" || pl_fail "grpc.health.v1: $(cat "$PL_WORK/hv1.out")"
gc --info >"$PL_WORK/info.out" 2>&1 || pl_fail "Info: $(cat "$PL_WORK/info.out")"
for l in 'model: golden' 'max_seq: 256' 'vocab_size: 151669' 'chat_template: yes' 'wire_version: 1.1' \
    'stage 0 layers \[0,2) roles embed grid 1x1 threads 1 weights bf16 version strata .* device cpu, 1 thread' \
    'stage 1 layers \[2,4) roles head grid 1x1 threads 1 weights bf16 version strata .* device cpu, 1 thread'; do
    grep -qx "$l" "$PL_WORK/info.out" || pl_fail "Info lacks '$l': $(cat "$PL_WORK/info.out")"
done
[ "$(grep -c '^stage ' "$PL_WORK/info.out")" -eq 2 ] || pl_fail "Info: not 2 stages: $(cat "$PL_WORK/info.out")"
! grep -q '^stages_error' "$PL_WORK/info.out" || pl_fail "Info: $(cat "$PL_WORK/info.out")"
pl_stop_pipeline g 2
gc --health >"$PL_WORK/health.out" 2>&1 || pl_fail "Health with stage 0 gone failed"
grep -q '^health: NOT_SERVING: stage 0 does not answer' "$PL_WORK/health.out" ||
    pl_fail "Health with stage 0 gone: $(cat "$PL_WORK/health.out")"
expect_status UNAVAILABLE "stage 0 cannot be reached" --prompt 1,2 --max-tokens 2
kill "$SERVE_PID"
wait "$SERVE_PID" || pl_fail "strata-serve exited with $? after SIGTERM"
echo "Health, grpc.health.v1 Check, Info; stage 0 down: NOT_SERVING, UNAVAILABLE; SIGTERM: clean exit"

# 6. The stages as they describe themselves round the ring, 3 stages started with uneven ranges:
# gRPC Info, GET /v1/stages and strata-client --describe list exactly those ranges; a dead
# stage is a clear error from each, at once, never a hang.
pl_start_stage d 3 0 "$golden" --max-seq 128 --layer-start 0 --layer-end 1 --threads 2
pl_start_stage d 3 1 "$golden" --max-seq 128 --layer-start 1 --layer-end 3
pl_start_stage d 3 2 "$golden" --max-seq 128 --layer-start 3 --layer-end 4
pl_wait_ready d 3
start_serve d "$golden"
gc --info >"$PL_WORK/info3.out" 2>&1 || pl_fail "Info: $(cat "$PL_WORK/info3.out")"
sed -n 's/ version .* device / device /p' "$PL_WORK/info3.out" >"$PL_WORK/info3.stages"
printf '%s\n' 'stage 0 layers [0,1) roles embed grid 1x1 threads 2 weights bf16 device cpu, 2 threads' \
    'stage 1 layers [1,3) roles - grid 1x1 threads 1 weights bf16 device cpu, 1 thread' \
    'stage 2 layers [3,4) roles head grid 1x1 threads 1 weights bf16 device cpu, 1 thread' >"$PL_WORK/info3.want"
cmp -s "$PL_WORK/info3.stages" "$PL_WORK/info3.want" || pl_fail "Info's stages: $(cat "$PL_WORK/info3.out")"
curl -sS "$URL/v1/stages" >"$PL_WORK/stages.json" || pl_fail "GET /v1/stages failed"
python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))["data"]
got = [(s["stage"], s["num_stages"], s["layers"], s["roles"], s["device"], s["tp"], s["kvp"], s["max_seq"]) for s in d]
want = [(0, 3, [0, 1], ["embed"], "cpu, 2 threads", 1, 1, 128), (1, 3, [1, 3], [], "cpu, 1 thread", 1, 1, 128),
        (2, 3, [3, 4], ["head"], "cpu, 1 thread", 1, 1, 128)]
assert got == want, got' "$PL_WORK/stages.json" || pl_fail "/v1/stages: $(cat "$PL_WORK/stages.json")"
pl_client d --describe >"$PL_WORK/describe.out" 2>"$PL_WORK/describe.err" ||
    pl_fail "strata-client --describe: $(cat "$PL_WORK/describe.err")"
awk 'NR > 1 {print $1, $2, $3, $4}' "$PL_WORK/describe.out" | paste -sd';' - >"$PL_WORK/describe.cols"
[ "$(cat "$PL_WORK/describe.cols")" = '0 [0,1) embed 1x1;1 [1,3) - 1x1;2 [3,4) head 1x1' ] ||
    pl_fail "strata-client --describe: $(cat "$PL_WORK/describe.out")"
echo "describe, 3 stages: Info, /v1/stages and strata-client --describe list [0,1) [1,3) [3,4)"
kill -9 "$(pl_pid d 1)"
sleep 0.3
start=$(date +%s%N)
gc --info >"$PL_WORK/info3dead.out" 2>&1 || pl_fail "Info with a dead stage failed: $(cat "$PL_WORK/info3dead.out")"
grep -q '^stages_error: EPEER: stage 0: cannot describe the pipeline: the link to stage 1 is down' \
    "$PL_WORK/info3dead.out" || pl_fail "Info with stage 1 dead: $(cat "$PL_WORK/info3dead.out")"
! grep -q '^stage ' "$PL_WORK/info3dead.out" || pl_fail "Info listed stages of a broken ring"
code=$(curl -sS -o "$PL_WORK/stages.dead" -w '%{http_code}' "$URL/v1/stages")
[ "$code" = 503 ] && grep -q 'link to stage 1 is down' "$PL_WORK/stages.dead" ||
    pl_fail "/v1/stages with stage 1 dead: $code $(cat "$PL_WORK/stages.dead")"
pl_client d --describe >"$PL_WORK/describe.dead" 2>&1 && pl_fail "--describe with stage 1 dead exited 0"
grep -q 'describe: stage 0: cannot describe the pipeline: the link to stage 1 is down' "$PL_WORK/describe.dead" ||
    pl_fail "--describe with stage 1 dead: $(cat "$PL_WORK/describe.dead")"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$ms" -lt 5000 ] || pl_fail "the three describes of a broken ring took $ms ms"
echo "describe, stage 1 killed: Info stages_error, /v1/stages 503, --describe exit 1, all in $ms ms"
kill "$SERVE_PID"
wait "$SERVE_PID" || pl_fail "strata-serve exited with $? after SIGTERM"
for r in 0 2; do kill "$(pl_pid d "$r")"; done

# 2. Text: the real Qwen3 vocabulary on a tiny random checkpoint.
model="$PL_WORK/model"
"$PL_BIN/strata-stage-bench" make-model --out "$model" --vocab 151936 --hidden 64 --layers 2 \
    --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 11 >"$PL_WORK/make.log" 2>&1 ||
    pl_fail "make-model failed: $(cat "$PL_WORK/make.log")"
cp "$TOKDIR/tokenizer.json" "$TOKDIR/tokenizer_config.json" "$model/" || pl_fail "cannot copy the tokenizer"
pl_start_pipeline t 2 "$model" --max-seq 256
start_serve t "$model"
gc --chat Hello --max-tokens 24 --temperature 1.0 --seed 777 >"$PL_WORK/chat.out" 2>"$PL_WORK/chat.err" ||
    pl_fail "Chat: $(cat "$PL_WORK/chat.err")"
pl_client t --model "$model" --chat Hello --max-tokens 24 --temperature 1.0 --top-k 0 --seed 777 \
    >"$PL_WORK/cli.out" 2>"$PL_WORK/cli.err" || pl_fail "strata-client --chat failed"
curl -sS -H 'Content-Type: application/json' --data-binary \
    '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 24, "temperature": 1.0, "seed": 777}' \
    "$URL/v1/chat/completions" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' \
    >"$PL_WORK/http.out" || pl_fail "HTTP chat failed"
cmp -s "$PL_WORK/chat.out" "$PL_WORK/http.out" || pl_fail "gRPC Chat '$(cat "$PL_WORK/chat.out")' != HTTP '$(cat "$PL_WORK/http.out")'"
[ "$(cat "$PL_WORK/cli.out")" = "$(cat "$PL_WORK/chat.out")" ] ||
    pl_fail "gRPC Chat '$(cat "$PL_WORK/chat.out")' != strata-client '$(cat "$PL_WORK/cli.out")'"
echo "Chat: gRPC text == HTTP text == strata-client --chat ($(wc -c <"$PL_WORK/chat.out") bytes)"
gc --text "Once upon" --max-tokens 16 --seed 5 >"$PL_WORK/gen.out" 2>"$PL_WORK/gen.err" ||
    pl_fail "Generate text: $(cat "$PL_WORK/gen.err")"
curl -sS -H 'Content-Type: application/json' --data-binary '{"prompt": "Once upon", "max_tokens": 16, "seed": 5}' \
    "$URL/v1/completions" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' \
    >"$PL_WORK/gen.http" || pl_fail "HTTP completion failed"
cmp -s "$PL_WORK/gen.out" "$PL_WORK/gen.http" || pl_fail "Generate text != /v1/completions"
whole=$(cat "$PL_WORK/chat.out")
stop=${whole:3:2}
if [ -n "$stop" ]; then
    gc --chat Hello --max-tokens 24 --temperature 1.0 --seed 777 --stop "$stop" \
        >"$PL_WORK/stop.out" 2>"$PL_WORK/stop.err" || pl_fail "Chat with a stop string failed"
    [ "$(cat "$PL_WORK/stop.out")" = "${whole%%"$stop"*}" ] && [ "$(field_of "$PL_WORK/stop.err" finish)" = stop ] ||
        pl_fail "stop '$stop': got '$(cat "$PL_WORK/stop.out")', want '${whole%%"$stop"*}'"
    echo "stop string: cut to ${#stop}-byte stop, finish stop"
fi
# 4 concurrent streams == their solo runs.
for i in 1 2 3 4; do
    gc --chat Hello --max-tokens 32 --seed "$i" >"$PL_WORK/solo.$i" 2>/dev/null || pl_fail "solo $i failed"
done
pids=""
for i in 1 2 3 4; do
    gc --chat Hello --max-tokens 32 --seed "$i" >"$PL_WORK/conc.$i" 2>/dev/null &
    pids="$pids $!"
done
for p in $pids; do wait "$p" || pl_fail "a concurrent call failed"; done
for i in 1 2 3 4; do
    cmp -s "$PL_WORK/solo.$i" "$PL_WORK/conc.$i" || pl_fail "concurrent stream $i != its solo run"
done
echo "4 concurrent gRPC streams == their solo runs"
echo "PASS"
