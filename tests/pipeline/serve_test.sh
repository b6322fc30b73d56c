#!/usr/bin/env bash
# Integration: strata-serve (the OpenAI-compatible HTTP front) before a 2-stage pipeline on a
# tiny random checkpoint with the real Qwen3 vocabulary (made at test time, as
# pipeline_text_test.sh does), driven by curl: the whole answer equals the streamed deltas
# equals strata-client --chat's text; 16 concurrent streams equal their solo runs; a client
# that disconnects mid-stream gets its request cancelled; every malformed request gets its
# 4xx OpenAI error and the server keeps serving; /v1/models, /health, /metrics answer, and
# /v1/stages lists both stages' layer ranges, roles and devices (503 once stage 0 is gone).
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
SERVE="$PL_BIN/strata-serve"
model="$PL_WORK/model"
pl_make_text_model "$model"

pl_start_pipeline s 2 "$model" --max-seq 256 --max-batch 16
# shellcheck disable=SC2046
"$SERVE" --model "$model" --stage0-port-file "$PL_WORK/s.0.port" --port-file "$PL_WORK/http.port" \
    --max-seq 256 $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
SERVE_PID=$!
pl_wait_file "$PL_WORK/http.port" 20 || pl_fail "strata-serve did not start"
URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")"

# post PATH JSON -> body on stdout; the status goes to $PL_WORK/status
post() {
    curl -sS -o - -w '%{stderr}%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$2" "$URL$1" 2>"$PL_WORK/status"
}
# The concatenated delta.content (or text) pieces of an SSE stream on stdin.
deltas() {
    python3 -c '
import json, sys
out = []
for line in sys.stdin.read().split("\n\n"):
    if not line.startswith("data: ") or line == "data: [DONE]": continue
    c = json.loads(line[6:])
    for ch in c.get("choices", []):
        out.append(ch.get("delta", {}).get("content") or ch.get("text") or "")
sys.stdout.write("".join(out))'
}
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
# "P C T": a whole answer's usage (on stdin).
usage_of() { jq_py '"%(prompt_tokens)d %(completion_tokens)d %(total_tokens)d" % d["usage"]'; }
# The usage of an SSE stream on stdin: "final P C T" from the one chunk with a finish_reason
# (the last with choices), then "only P C T" when a usage-only chunk (empty choices) follows.
usages() {
    python3 -c '
import json, sys
ev = [json.loads(l[6:]) for l in sys.stdin.read().split("\n\n") if l.startswith("data: {")]
fin = [i for i, c in enumerate(ev) if any(ch.get("finish_reason") for ch in c.get("choices", []))]
assert len(fin) == 1 and all(c["choices"] for c in ev[:fin[0] + 1]), ev
assert all("usage" not in c for c in ev[:fin[0]]), "usage before the final chunk"
def u(c):
    u = c["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    return "%d %d %d" % (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])
print("final", u(ev[fin[0]]))
for c in ev[fin[0] + 1:]:
    assert c["choices"] == [], c
    print("only", u(c))'
}

# 1. Whole == streamed == strata-client --chat (sampled, seeded).
params='"max_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 777'
msg='"messages": [{"role": "user", "content": "Hello"}]'
post /v1/chat/completions "{\"model\": \"model\", $msg, $params}" >"$PL_WORK/whole.json"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "chat completion: $(cat "$PL_WORK/whole.json")"
whole=$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/whole.json")
jq_py 'd["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]' \
    <"$PL_WORK/whole.json" | grep -q True || pl_fail "bad usage: $(cat "$PL_WORK/whole.json")"
post /v1/chat/completions "{$msg, $params, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
    >"$PL_WORK/stream.sse"
streamed=$(deltas <"$PL_WORK/stream.sse")
tail -c 14 "$PL_WORK/stream.sse" | grep -q 'data: \[DONE\]' || pl_fail "no [DONE]"
grep -q '"delta":{"role":"assistant"' "$PL_WORK/stream.sse" || pl_fail "no role delta"
# The final chunk carries the usage, and include_usage adds the usage-only chunk: both the
# whole answer's numbers.
wusage=$(usage_of <"$PL_WORK/whole.json")
[ "$(usages <"$PL_WORK/stream.sse" | paste -sd';' -)" = "final $wusage;only $wusage" ] ||
    pl_fail "streamed usage '$(usages <"$PL_WORK/stream.sse" | paste -sd';' -)', whole's $wusage"
pl_client s --model "$model" --chat Hello --max-tokens 24 --temperature 1.0 --top-k 0 --seed 777 \
    >"$PL_WORK/cli.out" 2>"$PL_WORK/cli.err" || pl_fail "strata-client --chat failed"
cli=$(cat "$PL_WORK/cli.out")
[ "$whole" = "$streamed" ] || pl_fail "whole '$whole' != streamed '$streamed'"
[ "$whole" = "$cli" ] || pl_fail "whole '$whole' != strata-client '$cli'"
echo "chat: whole == streamed == strata-client (${#whole} chars)"

# /v1/completions, whole and streamed; a stop string cuts the text before it.
post /v1/completions '{"prompt": "Once upon", "max_tokens": 16, "seed": 5}' >"$PL_WORK/c.json"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "completion: $(cat "$PL_WORK/c.json")"
ctext=$(jq_py 'd["choices"][0]["text"]' <"$PL_WORK/c.json")
post /v1/completions '{"prompt": "Once upon", "max_tokens": 16, "seed": 5, "stream": true}' \
    >"$PL_WORK/c.sse"
[ "$ctext" = "$(deltas <"$PL_WORK/c.sse")" ] || pl_fail "completion whole != streamed"
# Without include_usage: the usage in the final chunk only, equal to the whole answer's.
cusage=$(usage_of <"$PL_WORK/c.json")
[ "$(usages <"$PL_WORK/c.sse" | paste -sd';' -)" = "final $cusage" ] ||
    pl_fail "completion streamed usage '$(usages <"$PL_WORK/c.sse" | paste -sd';' -)', whole's $cusage"
stop=${whole:3:2}
if [ -n "$stop" ]; then
    post /v1/chat/completions "{$msg, $params, \"stop\": [$(printf '%s' "$stop" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')]}" >"$PL_WORK/stop.json"
    cut=$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/stop.json")
    reason=$(jq_py 'd["choices"][0]["finish_reason"]' <"$PL_WORK/stop.json")
    [ "$cut" = "${whole%%"$stop"*}" ] && [ "$reason" = stop ] ||
        pl_fail "stop '$stop': got '$cut' ($reason), want '${whole%%"$stop"*}'"
    post /v1/chat/completions "{$msg, $params, \"stream\": true, \"stop\": $(printf '%s' "$stop" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" |
        deltas >"$PL_WORK/stop.sse"
    [ "$(cat "$PL_WORK/stop.sse")" = "$cut" ] || pl_fail "streamed stop: '$(cat "$PL_WORK/stop.sse")', want '$cut'"
    echo "stop string: cut to ${#cut} chars, whole and streamed"
fi

# 2. 16 concurrent streams, each equal to its solo run.
for i in $(seq 1 16); do
    post /v1/chat/completions "{$msg, \"max_tokens\": 32, \"temperature\": 1.0, \"seed\": $i}" |
        jq_py 'd["choices"][0]["message"]["content"]' >"$PL_WORK/solo.$i"
done
curls=""
for i in $(seq 1 16); do
    curl -sS -N -H 'Content-Type: application/json' --data-binary \
        "{$msg, \"max_tokens\": 32, \"temperature\": 1.0, \"seed\": $i, \"stream\": true}" \
        "$URL/v1/chat/completions" >"$PL_WORK/conc.$i.sse" &
    curls="$curls $!"
done
for p in $curls; do wait "$p" || pl_fail "a concurrent curl failed"; done
for i in $(seq 1 16); do
    { deltas <"$PL_WORK/conc.$i.sse"; echo; } | cmp -s - "$PL_WORK/solo.$i" ||
        pl_fail "concurrent stream $i differs from its solo run"
done
echo "16 concurrent streams == their solo runs"

# 3. A client that disconnects mid-stream: its request is cancelled, nothing stays in flight.
curl -sS -N --max-time 0.5 -H 'Content-Type: application/json' --data-binary \
    "{$msg, \"max_tokens\": 200, \"temperature\": 1.0, \"stream\": true}" \
    "$URL/v1/chat/completions" >/dev/null 2>&1
pl_wait_log "$PL_WORK/serve.log" "abandoned after .* tokens: cancelled" 1 10 ||
    pl_fail "the disconnected stream was not cancelled"
# Every stage dropped it (and its KV): the stages log the client's cancel.
for r in 0 1; do
    pl_wait_log "$PL_WORK/s.$r.log" "cancelled: request cancelled by the client" 1 10 ||
        pl_fail "stage $r did not cancel the disconnected request"
done
for ((k = 0; k < 100; k++)); do
    curl -sS "$URL/metrics" | grep -q '^strata_serve_requests_in_flight 0$' && break
    sleep 0.05
done
[ "$k" -lt 100 ] || pl_fail "a request stays in flight after the disconnect"
post /v1/chat/completions "{$msg, \"max_tokens\": 4}" >/dev/null
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "no answer after the disconnect"
# The same for a client that gives up waiting for a whole (non-streamed) answer.
curl -sS --max-time 0.5 -H 'Content-Type: application/json' --data-binary \
    "{$msg, \"max_tokens\": 200, \"temperature\": 1.0}" "$URL/v1/chat/completions" >/dev/null 2>&1
pl_wait_log "$PL_WORK/serve.log" "abandoned after .* tokens: cancelled" 2 10 ||
    pl_fail "the disconnected whole-answer request was not cancelled"
for r in 0 1; do
    pl_wait_log "$PL_WORK/s.$r.log" "cancelled: request cancelled by the client" 2 10 ||
        pl_fail "stage $r did not cancel the disconnected whole-answer request"
done
echo "disconnect (streamed and whole): cancelled on every stage, nothing in flight, next request served"

# 4. Malformed requests: each its 4xx OpenAI error; the server keeps serving.
expect_error() { # STATUS PATH BODY [METHOD]
    local body
    body=$(curl -sS -o - -w '%{stderr}%{http_code}' -X "${4:-POST}" \
        -H 'Content-Type: application/json' --data-binary "$3" "$URL$2" 2>"$PL_WORK/status")
    [ "$(cat "$PL_WORK/status")" = "$1" ] ||
        pl_fail "$2 ${3:0:120}: status $(cat "$PL_WORK/status"), want $1: ${body:0:300}"
    echo "$body" | jq_py 'bool(d["error"]["message"] and d["error"]["type"])' | grep -q True ||
        pl_fail "$2 ${3:0:120}: not an OpenAI error: ${body:0:300}"
}
expect_error 400 /v1/chat/completions '{"messages": [ {"role"'
expect_error 400 /v1/chat/completions "{\"model\": \"gpt-4\", $msg}"
expect_error 400 /v1/chat/completions '{"messages": []}'
expect_error 400 /v1/chat/completions "{$msg, \"temperature\": 3}"
expect_error 400 /v1/chat/completions "{$msg, \"temperature\": -0.5}"
expect_error 400 /v1/chat/completions "{$msg, \"top_p\": 0}"
expect_error 400 /v1/chat/completions "{$msg, \"top_p\": 1.5}"
expect_error 400 /v1/chat/completions "{$msg, \"max_tokens\": 0}"
expect_error 400 /v1/chat/completions "{$msg, \"max_tokens\": 100000}"
expect_error 400 /v1/chat/completions '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}'
expect_error 400 /v1/completions '{"prompt": 7}'
{ printf '{"prompt": "'; head -c 1100000 /dev/zero | tr '\0' a; printf '"}'; } >"$PL_WORK/big.json"
expect_error 413 /v1/completions "@$PL_WORK/big.json"
words=$(printf 'word %.0s' $(seq 1 300))
expect_error 400 /v1/completions "{\"prompt\": \"$words\"}"
expect_error 400 /v1/completions "{\"prompt\": \"Hi\", \"max_tokens\": 256}"
expect_error 404 /v1/nothing '{}'
expect_error 405 /v1/chat/completions '' GET
expect_error 405 /v1/models '{}' POST
echo "malformed requests: 4xx OpenAI errors"

# 5. /v1/models, /health, /metrics.
curl -sS "$URL/v1/models" | jq_py 'd["data"][0]["id"]' | grep -qx model || pl_fail "/v1/models"
[ "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] || pl_fail "/health"
curl -sS "$URL/metrics" >"$PL_WORK/metrics.txt"
for m in 'strata_serve_requests_total{status="200"}' 'strata_serve_requests_total{status="400"}' \
    strata_serve_prompt_tokens_total strata_serve_completion_tokens_total \
    strata_serve_time_to_first_token_seconds_bucket strata_serve_inter_token_latency_seconds_count \
    'strata_serve_stages_up 1' 'strata_stage_kv_slots{stage="0"} 16' 'strata_stage_kv_slots{stage="1"} 16' \
    'strata_stage_kv_slots_in_use{stage="1"} 0' 'strata_stage_queue_depth{stage="0"} 0'; do
    grep -qF "$m" "$PL_WORK/metrics.txt" || pl_fail "/metrics lacks $m"
done
# GET /v1/stages: both stages as they describe themselves round the ring (the even split).
curl -sS "$URL/v1/stages" | jq_py '";".join("%d %d %s %s %s" % (s["stage"], s["num_stages"], s["layers"],
    ",".join(s["roles"]), s["device"]) for s in d["data"])' >"$PL_WORK/stages.txt" || pl_fail "/v1/stages"
[ "$(cat "$PL_WORK/stages.txt")" = "0 2 [0, 1] embed cpu, 1 thread;1 2 [1, 2] head cpu, 1 thread" ] ||
    pl_fail "/v1/stages: $(cat "$PL_WORK/stages.txt")"
expect_error 405 /v1/stages '{}' POST
echo "/v1/models, /health, /metrics, /v1/stages: ok"

# 6. Stage 0 gone: /health and generation answer 503, the server stays up.
pl_stop_pipeline s 2
[ "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/health")" = 503 ] || pl_fail "/health not 503"
expect_error 503 /v1/chat/completions "{$msg, \"max_tokens\": 4}"
[ "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/v1/stages")" = 503 ] || pl_fail "/v1/stages not 503"
curl -sS "$URL/metrics" | grep -qx 'strata_serve_stages_up 0' || pl_fail "/metrics: stages up without stage 0"
curl -sS "$URL/v1/models" | grep -q '"id":"model"' || pl_fail "server gone after 503s"
kill "$SERVE_PID"
wait "$SERVE_PID" || pl_fail "strata-serve exited with $? after SIGTERM"
echo "stage 0 down: 503; SIGTERM: clean exit"

# 7. A pipeline with a pre-shared key (TLS 1.3 PSK): strata-serve with the key is served;
# plaintext (--insecure) it answers 503.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
pl_start_pipeline k 1 "$model" --max-seq 256 --auth-key-file "$PL_WORK/key"
start_serve() { # TAG [options]: strata-serve before pipeline k; URL set to it
    local tag=$1
    shift
    "$SERVE" --model "$model" --stage0-port-file "$PL_WORK/k.0.port" --max-seq 256 \
        --port-file "$PL_WORK/$tag.port" "$@" 2>>"$PL_WORK/$tag.log" &
    PL_PIDS="$PL_PIDS $!"
    pl_wait_file "$PL_WORK/$tag.port" 20 || pl_fail "strata-serve $tag did not start"
    URL="http://127.0.0.1:$(cat "$PL_WORK/$tag.port")"
}
start_serve keyed --auth-key-file "$PL_WORK/key"
post /v1/chat/completions "{$msg, \"max_tokens\": 4}" >"$PL_WORK/keyed.json"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "keyed strata-serve: $(cat "$PL_WORK/keyed.json")"
start_serve keyless --insecure
expect_error 503 /v1/chat/completions "{$msg, \"max_tokens\": 4}"
[ "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/health")" = 503 ] || pl_fail "keyless /health not 503"
echo "pre-shared key: served with it, 503 without"

# 8. ./strata serve's script: its own 1-stage pipeline and server; SIGTERM stops all of it.
STRATA_BIN_DIR="$(dirname "$PL_BIN")" "$PL_ROOT/tools/strata_serve.sh" --model "$model" \
    --stages 1 --port 0 --port-file "$PL_WORK/tool.port" --max-seq 256 \
    >"$PL_WORK/tool.out" 2>"$PL_WORK/tool.log" &
tool_pid=$!
PL_PIDS="$PL_PIDS $tool_pid"
pl_wait_file "$PL_WORK/tool.port" 30 || pl_fail "strata_serve.sh did not start: $(cat "$PL_WORK/tool.log")"
URL="http://127.0.0.1:$(cat "$PL_WORK/tool.port")"
pl_wait_log "$PL_WORK/tool.log" "strata serve: http://127.0.0.1:[0-9]*/v1" 1 10 || pl_fail "no URL printed"
pl_wait_log "$PL_WORK/tool.log" "strata serve: web console: chat at http://127.0.0.1:[0-9]*/," 1 10 ||
    pl_fail "no console URL printed"
post /v1/chat/completions "{$msg, \"max_tokens\": 4}" >"$PL_WORK/tool.json"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "strata_serve.sh: $(cat "$PL_WORK/tool.json")"
kill -TERM "$tool_pid"
for ((k = 0; k < 200; k++)); do
    kill -0 "$tool_pid" 2>/dev/null || break
    sleep 0.05
done
kill -0 "$tool_pid" 2>/dev/null && pl_fail "strata_serve.sh did not stop on SIGTERM"
wait "$tool_pid" || pl_fail "strata_serve.sh exited with $? on SIGTERM"
curl -s -o /dev/null "$URL/health" && pl_fail "the server still answers after SIGTERM"
echo "strata_serve.sh: served, stopped on SIGTERM"
