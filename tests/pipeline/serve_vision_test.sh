#!/usr/bin/env bash
# Integration: strata-serve in front of the vision stage (strata-stage --role vision) and two
# language stages on the Qwen3-VL golden checkpoint (tests/golden/qwen3_vl), driven by curl:
# a chat with an image_url data URI of e2e/image0.png and text answers 200 with the same text
# and token counts as strata-client --chat --image e2e/image0.png with the same message; the
# streamed answer equals the whole one; two images (PNG + JPEG) work; every malformed image
# part (an http URL, bad base64, an unknown format, an image over --max-image-bytes, too many
# images, a body over the limit) gets its 400/413 OpenAI error and the next request is served;
# a text-only model given an image answers 400.
#
# The golden VL model has a 512-token vocabulary and no tokenizer: vl_chat_tokenizer.py makes
# one inside it from the real Qwen3 tokenizer, paired with the real Qwen3-VL chat template. Both
# sides (strata-serve and strata-client) use the same directory, so the check is that the HTTP
# path renders, tokenizes, attaches the image bytes and decodes exactly as the CLI path does.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
SERVE="$PL_BIN/strata-serve"
golden=$(pl_golden qwen3_vl)
e2e="$golden/e2e"
text_data="$PL_ROOT/tests/runtime/text/testdata"

# The test model directory: the VL chat template and a tokenizer inside the 512-id vocabulary.
vl="$PL_WORK/vlchat"
mkdir -p "$vl"
cp "$text_data/qwen3-vl-chat-template/chat_template.json" "$vl/" || pl_fail "no VL chat template"
python3 "$PL_ROOT/tests/pipeline/vl_chat_tokenizer.py" "$text_data/qwen3-tokenizer/tokenizer.json" "$vl" ||
    pl_fail "cannot make the test tokenizer"

pl_start_pipeline vs 2 "$golden" --max-seq 256
pl_start_vision vs "$golden"
start_serve() { # TAG MODEL [options]: strata-serve before the vision stage
    local tag=$1 model=$2
    shift 2
    rm -f "$PL_WORK/$tag.port"
    # shellcheck disable=SC2046
    "$SERVE" --model "$model" --served-model-name vl --stage0-port-file "$PL_WORK/vs.v.port" \
        --port-file "$PL_WORK/$tag.port" --max-seq 256 $(pl_security_default) "$@" \
        2>>"$PL_WORK/$tag.log" &
    PL_PIDS="$PL_PIDS $!"
    pl_wait_file "$PL_WORK/$tag.port" 20 || pl_fail "strata-serve $tag did not start"
    URL="http://127.0.0.1:$(cat "$PL_WORK/$tag.port")"
}
start_serve http "$vl" --max-image-bytes 4096 --max-images 2 --grpc-port-file "$PL_WORK/grpc.port"
pl_wait_file "$PL_WORK/grpc.port" 20 || pl_fail "no gRPC port"

post() { # PATH BODY-FILE -> body on stdout; the status goes to $PL_WORK/status
    curl -sS -o - -w '%{stderr}%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "@$2" "$URL$1" 2>"$PL_WORK/status"
}
deltas() {
    python3 -c '
import json, sys
out = []
for line in sys.stdin.read().split("\n\n"):
    if not line.startswith("data: ") or line == "data: [DONE]": continue
    c = json.loads(line[6:])
    for ch in c.get("choices", []):
        out.append(ch.get("delta", {}).get("content") or "")
sys.stdout.write("".join(out))'
}
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
# body FILE TEXT EXTRA URL...: a chat body, one user message with the image parts then text.
body() {
    local file=$1 text=$2 extra=$3
    shift 3
    python3 - "$text" "$extra" "$@" >"$file" <<'EOF'
import json, sys
text, extra, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
parts.append({"type": "text", "text": text})
b = {"model": "vl", "messages": [{"role": "user", "content": parts}],
     "max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "seed": 777}
b.update(json.loads("{" + extra + "}"))
json.dump(b, sys.stdout)
EOF
}
uri() { printf 'data:%s;base64,%s' "$1" "$(base64 -w0 "$2")"; }
png=$(uri image/png "$e2e/image0.png")
jpg=$(uri image/jpeg "$e2e/image1.jpg")

# 1. One image + text: whole == streamed == strata-client --chat --image (the same message).
msg="What is in this picture?"
body "$PL_WORK/one.json" "$msg" '' "$png"
post /v1/chat/completions "$PL_WORK/one.json" >"$PL_WORK/one.out"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "image chat: $(cat "$PL_WORK/status") $(cat "$PL_WORK/one.out")"
whole=$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/one.out")
usage=$(jq_py '"%d,%d" % (d["usage"]["prompt_tokens"], d["usage"]["completion_tokens"])' <"$PL_WORK/one.out")
body "$PL_WORK/one_s.json" "$msg" '"stream": true, "stream_options": {"include_usage": true}' "$png"
post /v1/chat/completions "$PL_WORK/one_s.json" >"$PL_WORK/one.sse"
streamed=$(deltas <"$PL_WORK/one.sse")
tail -c 14 "$PL_WORK/one.sse" | grep -q 'data: \[DONE\]' || pl_fail "image chat stream: no [DONE]"
pl_vclient vs --model "$vl" --chat "$msg" --image "$e2e/image0.png" --max-tokens 16 \
    --temperature 1.0 --top-k 0 --seed 777 --print-ids >"$PL_WORK/cli.out" 2>"$PL_WORK/cli.err" ||
    pl_fail "strata-client --chat --image failed: $(cat "$PL_WORK/cli.err")"
cli=$(cat "$PL_WORK/cli.out")
cli_prompt=$(sed -n 's/^prompt ids: //p' "$PL_WORK/cli.err")
cli_gen=$(sed -n 's/^generated ids: //p' "$PL_WORK/cli.err")
case "$cli_prompt" in
*,502,500,503,*) ;;
*) pl_fail "strata-client's prompt has no <|vision_start|><|image_pad|><|vision_end|>: $cli_prompt" ;;
esac
n_prompt=$(echo "$cli_prompt" | tr ',' '\n' | grep -c .)
n_gen=$(echo "$cli_gen" | tr ',' '\n' | grep -c .)
[ -n "$whole" ] || pl_fail "image chat: empty answer"
[ "$whole" = "$streamed" ] || pl_fail "image chat: whole '$whole' != streamed '$streamed'"
[ "$whole" = "$cli" ] || pl_fail "image chat: whole '$whole' != strata-client '$cli'"
# usage counts the prompt as stage 0 ran it: the image's one pad expanded to its rows
img_rows=$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["images"][0]["grid_thw"]; print(g[0]*g[1]*g[2]//4)' "$e2e/e2e.json")
[ -z "$cli_gen" ] || [ "$usage" = "$((n_prompt - 1 + img_rows)),$n_gen" ] ||
    pl_fail "image chat usage $usage, strata-client $n_prompt prompt ids (one image pad for $img_rows rows) + $n_gen generated ids"
echo "image chat: whole == streamed == strata-client --chat --image (${#whole} chars, usage $usage)"

# The ring describe passes through the vision stage (it forwards the client's Control to stage
# 0 and puts its own entry, "front", first in the answer): /v1/stages and strata-client
# --describe list the vision stage, then the language stages.
curl -sS "$URL/v1/stages" | jq_py '";".join("%s %s %s" % ("v" if s["front"] else s["stage"], s["layers"],
    ",".join(s["roles"])) for s in d["data"])' >"$PL_WORK/vstages.txt" || pl_fail "/v1/stages"
[ "$(cat "$PL_WORK/vstages.txt")" = "v [0, 0] vision;0 [0, 2] embed;1 [2, 4] head" ] ||
    pl_fail "/v1/stages: $(cat "$PL_WORK/vstages.txt")"
pl_vclient vs --describe >"$PL_WORK/vdescribe.out" 2>"$PL_WORK/vdescribe.err" ||
    pl_fail "--describe through the vision stage: $(cat "$PL_WORK/vdescribe.err")"
[ "$(awk 'NR > 1 {print $1 $2}' "$PL_WORK/vdescribe.out" | paste -sd' ' -)" = "v[0,0) 0[0,2) 1[2,4)" ] ||
    pl_fail "--describe through the vision stage: $(cat "$PL_WORK/vdescribe.out")"
echo "describe through the vision stage: /v1/stages and --describe list v [0,0) (vision), [0,2), [2,4)"

# 2. Two images (PNG, then JPEG) before the text: 200, equal to strata-client with both.
body "$PL_WORK/two.json" "$msg" '' "$png" "$jpg"
post /v1/chat/completions "$PL_WORK/two.json" >"$PL_WORK/two.out"
[ "$(cat "$PL_WORK/status")" = 200 ] || pl_fail "two images: $(cat "$PL_WORK/status") $(cat "$PL_WORK/two.out")"
pl_vclient vs --model "$vl" --chat "$msg" --image "$e2e/image0.png" --image "$e2e/image1.jpg" \
    --max-tokens 16 --temperature 1.0 --top-k 0 --seed 777 >"$PL_WORK/cli2.out" 2>"$PL_WORK/cli2.err" ||
    pl_fail "strata-client with two images failed: $(cat "$PL_WORK/cli2.err")"
[ "$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/two.out")" = "$(cat "$PL_WORK/cli2.out")" ] ||
    pl_fail "two images: the answer differs from strata-client's"
echo "two images (PNG + JPEG): == strata-client --chat --image x2"

# 3. Malformed image parts: each its 400/413 OpenAI error, and the next request is served.
expect_error() { # STATUS CODE BODY-FILE
    local out
    out=$(post /v1/chat/completions "$3")
    [ "$(cat "$PL_WORK/status")" = "$1" ] || pl_fail "$2: status $(cat "$PL_WORK/status"), want $1: ${out:0:300}"
    echo "$out" | jq_py 'd["error"]["code"] + " " + d["error"]["message"]' >"$PL_WORK/err.txt" ||
        pl_fail "$2: not an OpenAI error: ${out:0:300}"
    grep -q "^$2 " "$PL_WORK/err.txt" || pl_fail "want code $2, got $(cat "$PL_WORK/err.txt")"
    post /v1/chat/completions "$PL_WORK/one.json" >"$PL_WORK/after.out"
    [ "$(cat "$PL_WORK/status")" = 200 ] &&
        [ "$(jq_py 'd["choices"][0]["message"]["content"]' <"$PL_WORK/after.out")" = "$whole" ] ||
        pl_fail "after $2: the next request was not served the same"
}
check() { # STATUS CODE URL...
    local status=$1 code=$2
    shift 2
    body "$PL_WORK/bad.json" "$msg" '' "$@"
    expect_error "$status" "$code" "$PL_WORK/bad.json"
    echo "  $status $code: $(cut -d' ' -f2- "$PL_WORK/err.txt")"
}
check 400 unsupported_url "http://example.com/image0.png"
check 400 invalid_image_url "data:image/png,$(base64 -w0 "$e2e/image0.png")"
check 400 invalid_base64 "${png%?}"
check 400 invalid_base64 "data:image/png;base64,****$(base64 -w0 "$e2e/image0.png")"
check 400 unsupported_image_format "data:image/gif;base64,R0lGODlhAQABAAAAACw="
check 400 unsupported_image_format "$(uri image/png "$golden/config.json")"
head -c 6000 /dev/urandom | cat "$e2e/image0.png" - >"$PL_WORK/big.png"
check 413 image_too_large "$(uri image/png "$PL_WORK/big.png")"
check 413 too_many_images "$png" "$png" "$png"
# A valid-looking PNG that is not one: the vision stage refuses it; still a 400.
head -c 100 "$e2e/image0.png" >"$PL_WORK/trunc.png"
check 400 invalid_image "$(uri image/png "$PL_WORK/trunc.png")"
# A decompression bomb: a real PNG header declaring 60000 x 60000 pixels (3.6 G), refused
# from the header (no pixel buffer) in well under a second.
python3 - "$PL_WORK/bomb.png" <<'EOF' || pl_fail "cannot write the bomb PNG"
import struct, sys, zlib
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
idat = chunk(b"IDAT", zlib.compress(b"\0" * 1024))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + ihdr + idat + chunk(b"IEND", b""))
EOF
bomb_start=$(date +%s.%N)
check 400 invalid_image "$(uri image/png "$PL_WORK/bomb.png")"
echo "  (a 60000 x 60000 PNG data URI refused in $(pl_secs_between "$bomb_start" "$(date +%s.%N)") s, the next request included)"
{ printf '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,'
  head -c 1100000 /dev/zero | tr '\0' A; printf '"}}]}]}'; } >"$PL_WORK/huge.json"
expect_error 413 request_too_large "$PL_WORK/huge.json"
echo "malformed image parts: 400/413 OpenAI errors, the server keeps serving"

# 4. gRPC Chat with image parts (ChatMessage.parts, raw bytes): the image request streams to OK
# (its text is the HTTP path's, which is the same serve_gen; strata-grpc-client --method
# prints only sizes); bytes that are neither PNG nor JPEG are INVALID_ARGUMENT, too many
# images RESOURCE_EXHAUSTED, and the server keeps serving.
# chat_pb OUT TEXT FILE...: a strata.v1.ChatRequest (wire format by hand: field numbers of
# runtime/serve/strata.proto) with one user message of image parts then a text part.
chat_pb() {
    python3 - "$@" <<'EOF'
import struct, sys
out, text, files = sys.argv[1], sys.argv[2], sys.argv[3:]
def varint(n):
    b = b""
    while True:
        b += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n: return b
def field(num, data): return varint(num << 3 | 2) + varint(len(data)) + data
parts = b"".join(field(3, field(2, open(f, "rb").read())) for f in files)
parts += field(3, field(1, text.encode()))
msg = field(1, b"user") + parts
params = varint(1 << 3) + varint(16) + bytes([2 << 3 | 5]) + struct.pack("<f", 1.0) + \
    bytes([3 << 3 | 5]) + struct.pack("<f", 1.0) + varint(5 << 3) + varint(777)
open(out, "wb").write(field(1, b"vl") + field(2, msg) + field(3, params))
EOF
}
GC="$PL_BIN/strata-grpc-client"
gcall() { # OUT REQUEST-FILE
    "$GC" --port-file "$PL_WORK/grpc.port" --method /strata.v1.Strata/Chat --raw-request "$2" >"$1" 2>&1
}
chat_pb "$PL_WORK/g1.bin" "$msg" "$e2e/image0.png"
gcall "$PL_WORK/g1.out" "$PL_WORK/g1.bin" || pl_fail "gRPC Chat with an image: $(cat "$PL_WORK/g1.out")"
grep -q "^status: 0 OK" "$PL_WORK/g1.out" && grep -q "^message: " "$PL_WORK/g1.out" ||
    pl_fail "gRPC Chat with an image: $(cat "$PL_WORK/g1.out")"
chat_pb "$PL_WORK/g2.bin" "$msg" "$golden/config.json"
gcall "$PL_WORK/g2.out" "$PL_WORK/g2.bin" && pl_fail "gRPC Chat took a JSON file as an image"
grep -q "INVALID_ARGUMENT.*neither PNG nor JPEG" "$PL_WORK/g2.out" || pl_fail "gRPC bad image: $(cat "$PL_WORK/g2.out")"
chat_pb "$PL_WORK/g3.bin" "$msg" "$e2e/image0.png" "$e2e/image0.png" "$e2e/image0.png"
gcall "$PL_WORK/g3.out" "$PL_WORK/g3.bin" && pl_fail "gRPC Chat took 3 images (--max-images 2)"
grep -q "RESOURCE_EXHAUSTED.*more than 2 images" "$PL_WORK/g3.out" || pl_fail "gRPC 3 images: $(cat "$PL_WORK/g3.out")"
gcall "$PL_WORK/g4.out" "$PL_WORK/g1.bin" || pl_fail "gRPC: no answer after the refusals: $(cat "$PL_WORK/g4.out")"
echo "gRPC Chat: image parts served; bad image INVALID_ARGUMENT, 3 images RESOURCE_EXHAUSTED"

# 5. A text-only model given an image: 400 (the same pipeline; the check is the front's).
tm="$PL_WORK/textmodel"
mkdir -p "$tm"
cp "$text_data/qwen3-tokenizer/tokenizer.json" "$text_data/qwen3-tokenizer/tokenizer_config.json" "$tm/"
start_serve text "$tm"
out=$(post /v1/chat/completions "$PL_WORK/one.json")
[ "$(cat "$PL_WORK/status")" = 400 ] && echo "$out" | grep -q images_not_supported ||
    pl_fail "text model given an image: $(cat "$PL_WORK/status") $out"
echo "text-only model given an image: 400 images_not_supported"
