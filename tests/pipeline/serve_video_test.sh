#!/usr/bin/env bash
# Integration: strata-serve in front of the vision stage and two language stages on the Qwen3-VL
# golden checkpoint, with the video golden (tests/golden/qwen3_vl/video: clip0.mp4 and the text
# transformers answered): a chat whose user message is a video_url data URI (vLLM's part for
# Qwen3-VL video) then the golden's text answers 200, greedy, with transformers' 16 ids — the
# same ids strata-client --chat --video prints — and usage counts the prompt as HF's expanded
# input_ids (timestamps and frame blocks included). The answer streamed equals the whole one.
# gRPC Chat with a video part (ChatPart.video) streams to OK. Malformed video parts (an http
# URL, a wrong media type, bytes that are no video, a video over --max-video-bytes, more than
# --max-videos) get their 400 / 413 OpenAI errors and the next request is served; a body over
# --max-body-bytes is 413.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
SERVE="$PL_BIN/strata-serve"
golden=$(pl_golden qwen3_vl)
vd="$golden/video"
text_data="$PL_ROOT/tests/runtime/text/testdata"

# The serving model directory: the real Qwen3-VL chat template and the golden's tokenizer (the
# 512-id byte-level one transformers tokenized the golden's text with).
vl="$PL_WORK/vlvideo"
mkdir -p "$vl"
cp "$text_data/qwen3-vl-chat-template/chat_template.json" "$vd/tokenizer.json" \
    "$vd/tokenizer_config.json" "$vl/" || pl_fail "cannot make the serving directory"
golden_text=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; print(t.split("<|vision_end|>")[1].split("<|im_end|>")[0])' "$vd/video.json")
want=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$vd/video.json")
n_expanded=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["expanded_ids"]))' "$vd/video.json")

pl_start_pipeline vv 2 "$golden" --max-seq 256
pl_start_vision vv "$golden" --tokenizer "$vd"
rm -f "$PL_WORK/http.port"
# shellcheck disable=SC2046
"$SERVE" --model "$vl" --served-model-name vl --stage0-port-file "$PL_WORK/vv.v.port" \
    --port-file "$PL_WORK/http.port" --max-seq 256 --max-video-bytes 60000 --max-videos 1 \
    --grpc-port-file "$PL_WORK/grpc.port" $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/http.port" 20 || pl_fail "strata-serve did not start"
pl_wait_file "$PL_WORK/grpc.port" 20 || pl_fail "no gRPC port"
URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")"

post() { # BODY-FILE -> body on stdout; the status goes to $PL_WORK/status
    curl -sS -o - -w '%{stderr}%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "@$1" "$URL/v1/chat/completions" 2>"$PL_WORK/status"
}
# body FILE EXTRA-JSON PART-JSON...: a greedy chat body, the parts then the golden's text.
body() {
    local file=$1 extra=$2
    shift 2
    python3 - "$golden_text" "$extra" "$@" >"$file" <<'PY'
import json, sys
text, extra, parts = sys.argv[1], sys.argv[2], [json.loads(p) for p in sys.argv[3:]]
b = {"model": "vl", "messages": [{"role": "user", "content": parts + [{"type": "text", "text": text}]}],
     "max_tokens": 16, "temperature": 0}
b.update(json.loads("{" + extra + "}"))
json.dump(b, sys.stdout)
PY
}
vpart() { printf '{"type": "video_url", "video_url": {"url": "data:%s;base64,%s"}}' "$1" "$(base64 -w0 "$2")"; }
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# 1. strata-client --chat --video through the same vision stage: the golden's ids.
pl_vclient vv --model "$vl" --chat "$golden_text" --video "$vd/clip0.mp4" --max-tokens 16 \
    --print-ids >"$PL_WORK/cli.out" 2>"$PL_WORK/cli.err" || pl_fail "strata-client --chat --video: $(cat "$PL_WORK/cli.err")"
cli_gen=$(sed -n 's/^generated ids: //p' "$PL_WORK/cli.err")
[ "$cli_gen" = "$want" ] || pl_fail "strata-client --chat --video generated $cli_gen, transformers $want"
echo "strata-client --chat --video: transformers' ids ($want)"

# 2. The HTTP API: the same text, usage = HF's expanded prompt; streamed == whole.
body "$PL_WORK/v.json" '' "$(vpart video/mp4 "$vd/clip0.mp4")"
post "$PL_WORK/v.json" >"$PL_WORK/v.out"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "video chat: $(cat "$PL_WORK/status") $(cat "$PL_WORK/v.out")"
whole=$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/v.out")
usage=$(jq_py '"%d,%d" % (d["usage"]["prompt_tokens"], d["usage"]["completion_tokens"])' <"$PL_WORK/v.out")
[ "$whole" = "$(cat "$PL_WORK/cli.out")" ] || pl_fail "video chat: '$whole' != strata-client '$(cat "$PL_WORK/cli.out")'"
[ "$usage" = "$n_expanded,16" ] || pl_fail "video chat usage $usage, want $n_expanded,16 (HF's expanded prompt)"
body "$PL_WORK/vs.json" '"stream": true' "$(vpart video/mp4 "$vd/clip0.mp4")"
post "$PL_WORK/vs.json" >"$PL_WORK/v.sse"
streamed=$(python3 -c '
import json, sys
out = []
for line in sys.stdin.read().split("\n\n"):
    if not line.startswith("data: ") or line == "data: [DONE]": continue
    for ch in json.loads(line[6:]).get("choices", []):
        out.append(ch.get("delta", {}).get("content") or "")
sys.stdout.write("".join(out))' <"$PL_WORK/v.sse")
[ "$whole" = "$streamed" ] || pl_fail "video chat: whole '$whole' != streamed '$streamed'"
echo "video_url chat: 200, = strata-client, usage $usage (HF's $n_expanded expanded ids), streamed == whole"

# 3. gRPC Chat with a video part (ChatPart.video = 3).
python3 - "$PL_WORK/g.bin" "$golden_text" "$vd/clip0.mp4" <<'PY'
import sys
out, text, video = sys.argv[1], sys.argv[2], sys.argv[3]
def varint(n):
    b = b""
    while True:
        b += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n: return b
def field(num, data): return varint(num << 3 | 2) + varint(len(data)) + data
msg = field(1, b"user") + field(3, field(3, open(video, "rb").read())) + field(3, field(1, text.encode()))
params = varint(1 << 3) + varint(16)
open(out, "wb").write(field(1, b"vl") + field(2, msg) + field(3, params))
PY
"$PL_BIN/strata-grpc-client" --port-file "$PL_WORK/grpc.port" --method /strata.v1.Strata/Chat \
    --raw-request "$PL_WORK/g.bin" >"$PL_WORK/g.out" 2>&1 || pl_fail "gRPC Chat with a video: $(cat "$PL_WORK/g.out")"
grep -q "^status: 0 OK" "$PL_WORK/g.out" || pl_fail "gRPC Chat with a video: $(cat "$PL_WORK/g.out")"
echo "gRPC Chat with a video part: OK"

# 4. Malformed video parts: OpenAI errors; the server keeps serving.
printf 'GIF89a not a video' >"$PL_WORK/fake.mp4"
head -c 70000 /dev/zero | tr '\0' 'x' >"$PL_WORK/big.bin"
printf '\000\000\000\030ftypisom' | cat - "$PL_WORK/big.bin" >"$PL_WORK/big.mp4"
expect() { # WHAT STATUS CODE PART...
    local what=$1 status=$2 code=$3
    shift 3
    body "$PL_WORK/bad.json" '' "$@"
    post "$PL_WORK/bad.json" >"$PL_WORK/bad.out"
    [ "$(cat "$PL_WORK/status")" = "$status" ] && grep -q "\"code\":\"$code\"" "$PL_WORK/bad.out" ||
        pl_fail "$what: $(cat "$PL_WORK/status") $(cat "$PL_WORK/bad.out")"
    echo "$what: $status $code"
}
expect "an http video URL" 400 unsupported_url '{"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}'
expect "video/avi" 400 unsupported_video_format "$(vpart video/avi "$vd/clip0.mp4")"
expect "bytes that are no video" 400 unsupported_video_format "$(vpart video/mp4 "$PL_WORK/fake.mp4")"
expect "a video over --max-video-bytes" 413 video_too_large "$(vpart video/mp4 "$PL_WORK/big.mp4")"
expect "two videos (--max-videos 1)" 413 too_many_videos "$(vpart video/mp4 "$vd/clip0.mp4")" "$(vpart video/mp4 "$vd/clip0.mp4")"
head -c 30000 "$vd/clip0.mp4" >"$PL_WORK/cut.mp4"
expect "a truncated MP4" 400 invalid_media "$(vpart video/mp4 "$PL_WORK/cut.mp4")"
post "$PL_WORK/v.json" >"$PL_WORK/v2.out"
[ "$(cat "$PL_WORK/status")" = 200 ] && [ "$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/v2.out")" = "$whole" ] ||
    pl_fail "no answer after the refusals: $(cat "$PL_WORK/v2.out")"
echo "after the refusals: the video chat answers again, identically"

# --max-body-bytes: a body over it is 413 request_too_large (the video URI here is ~70 KB).
rm -f "$PL_WORK/small.port"
# shellcheck disable=SC2046
"$SERVE" --model "$vl" --served-model-name vl --stage0-port-file "$PL_WORK/vv.v.port" \
    --port-file "$PL_WORK/small.port" --max-seq 256 --max-body-bytes 4096 $(pl_security_default) \
    2>>"$PL_WORK/serve_small.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/small.port" 20 || pl_fail "strata-serve --max-body-bytes did not start"
code=$(curl -sS -o "$PL_WORK/small.out" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "@$PL_WORK/v.json" "http://127.0.0.1:$(cat "$PL_WORK/small.port")/v1/chat/completions")
[ "$code" = 413 ] && grep -q "over 4096 bytes" "$PL_WORK/small.out" ||
    pl_fail "--max-body-bytes 4096: $code $(cat "$PL_WORK/small.out")"
echo "--max-body-bytes 4096: the video chat body is 413 request_too_large"
echo "PASS"
