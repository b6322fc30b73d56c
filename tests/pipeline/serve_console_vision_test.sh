#!/usr/bin/env bash
# Integration: an image turn in strata-serve's chat page, in headless Chromium
# (serve_console_browser.py image), before the vision stage and two language stages of the
# Qwen3-VL golden checkpoint: e2e/image0.png attached with the file picker shows as a
# thumbnail in the turn, and the greedy answer equals strata-client --chat --image with the
# same message; the pipeline page draws the vision stage in front of the two stages; the video
# golden's clip attached the same way shows as a <video> thumbnail and the answer equals
# strata-client --chat --video's. The tokenizer is vl_chat_tokenizer.py's, with the real Qwen3-VL chat template
# (as serve_vision_test). Without a Chromium that starts the driver prints "skipped: ...".
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$PL_WORK/outputs}"
golden=$(pl_golden qwen3_vl)
text_data="$PL_ROOT/tests/runtime/text/testdata"
vl="$PL_WORK/vlchat"
mkdir -p "$vl"
cp "$text_data/qwen3-vl-chat-template/chat_template.json" "$vl/" || pl_fail "no VL chat template"
python3 "$PL_ROOT/tests/pipeline/vl_chat_tokenizer.py" "$text_data/qwen3-tokenizer/tokenizer.json" \
    "$vl" || pl_fail "cannot make the test tokenizer"

pl_start_pipeline cv 2 "$golden" --max-seq 256
pl_start_vision cv "$golden" --tokenizer "$vl" # the tokenizer writes videos' timestamps
"$PL_BIN/strata-serve" --model "$vl" --served-model-name vl --stage0-port-file "$PL_WORK/cv.v.port" \
    --port-file "$PL_WORK/http.port" --max-seq 256 $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/http.port" 20 || pl_fail "strata-serve did not start"
URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")"

msg="What is in this picture?"
image="$golden/e2e/image0.png"
pl_vclient cv --model "$vl" --chat "$msg" --image "$image" --max-tokens 16 --temperature 0 \
    >"$PL_WORK/cli.out" 2>"$PL_WORK/cli.err" ||
    pl_fail "strata-client --chat --image failed: $(cat "$PL_WORK/cli.err")"
[ -s "$PL_WORK/cli.out" ] || pl_fail "strata-client --chat --image answered nothing"
python3 "$PL_ROOT/tests/pipeline/serve_console_browser.py" image "$URL" "$out" "$image" "$msg" \
    "$PL_WORK/cli.out"
rc=$?
[ "$rc" = 77 ] && exit 0 # the driver printed "skipped: <why>" (no Chromium here)
[ "$rc" = 0 ] || pl_fail "the image turn in the chat page failed"

# A video turn: the video golden's clip (its tokenizer is vl_chat_tokenizer.py's too).
clip="$golden/video/clip0.mp4"
vmsg="What happens in this video?"
pl_vclient cv --model "$vl" --chat "$vmsg" --video "$clip" --max-tokens 16 --temperature 0 \
    >"$PL_WORK/cli_video.out" 2>"$PL_WORK/cli_video.err" ||
    pl_fail "strata-client --chat --video failed: $(cat "$PL_WORK/cli_video.err")"
python3 "$PL_ROOT/tests/pipeline/serve_console_browser.py" video "$URL" "$out" "$clip" "$vmsg" \
    "$PL_WORK/cli_video.out" || pl_fail "the video turn in the chat page failed"
echo "PASS"
