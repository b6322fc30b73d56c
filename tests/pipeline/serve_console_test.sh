#!/usr/bin/env bash
# Integration: strata-serve's web console in a real browser (headless Chromium driven over the
# DevTools protocol, serve_console_browser.py) before a 3-stage pipeline on a 6-layer random
# checkpoint with the real Qwen3 tokenizer: the pages are compiled in and served under a strict
# Content-Security-Policy (and gone with --no-console); the chat page's greedy answers equal
# the API's for the same conversation (two turns, regenerate, a system prompt in a new chat)
# with tokens/s and time to first token under each; a refused request shows the server's
# words; Stop ends a long answer mid-stream and the server cancels it; the pipeline page lists
# the stages with their layer ranges, turns a killed stage red with the reason within 2.5 s and
# green again when it is restarted and the ring re-forms. The pages log no error (no exception,
# no CSP refusal). Screenshots are kept in the test's outputs. Without a Chromium that starts
# (Debian package chromium; ./strata test installs it) the driver prints "skipped: ...".
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$PL_WORK/outputs}"
model="$PL_WORK/model"
"$PL_BIN/strata-stage-bench" make-model --out "$model" --vocab 151936 --hidden 64 --layers 6 \
    --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 11 >"$PL_WORK/make.log" 2>&1 ||
    pl_fail "make-model failed"
cp "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json" \
    "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json" "$model/"
# The last stage sleeps 3 ms before each microbatch, so a long answer lasts long enough for
# the page's Stop to land mid-stream on any machine.
for r in 0 1 2; do
    pl_start_stage c 3 "$r" "$model" --max-seq 512 $([ "$r" = 2 ] && echo --step-delay-ms 3)
done
pl_wait_ready c 3

start_serve() { # TAG [options]
    local tag=$1
    shift
    "$PL_BIN/strata-serve" --model "$model" --stage0-port-file "$PL_WORK/c.0.port" \
        --port-file "$PL_WORK/$tag.port" --max-seq 512 $(pl_security_default) "$@" \
        2>>"$PL_WORK/$tag.log" &
    PL_PIDS="$PL_PIDS $!"
    pl_wait_file "$PL_WORK/$tag.port" 20 || pl_fail "strata-serve $tag did not start"
}
start_serve http
URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")"

# The pages and their headers, and --no-console.
for path in / /pipeline /console/chat.js /console/console.css; do
    curl -sS -D "$PL_WORK/h" -o /dev/null "$URL$path" || pl_fail "GET $path failed"
    grep -q '^HTTP/1.1 200' "$PL_WORK/h" || pl_fail "GET $path: $(head -1 "$PL_WORK/h")"
    grep -qi "^content-security-policy: default-src 'none'; script-src 'self'" "$PL_WORK/h" ||
        pl_fail "GET $path has no strict Content-Security-Policy"
done
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/console/index.html")
[ "$code" = 404 ] || pl_fail "a page by its file name answered $code, not 404"
grep -q "web console: chat at $URL/" "$PL_WORK/http.log" || pl_fail "no console URL in the log"
start_serve nocon --no-console
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(cat "$PL_WORK/nocon.port")/")
[ "$code" = 404 ] || pl_fail "--no-console: GET / answered $code, not 404"
echo "pages served under a strict CSP; --no-console answers 404"

driver="$PL_ROOT/tests/pipeline/serve_console_browser.py"
python3 "$driver" chat "$URL" "$out"
rc=$?
[ "$rc" = 77 ] && exit 0 # the driver printed "skipped: <why>" (no Chromium here)
[ "$rc" = 0 ] || pl_fail "the chat page checks failed"

# Stage 1 is killed by the driver (with the page watching) and restarted by this script.
cat >"$PL_WORK/restart1.sh" <<EOS
. "$PL_ROOT/tests/pipeline/pipeline_lib.sh"
PL_WORK="$PL_WORK" PL_STAGE="$PL_STAGE"
pl_start_stage c 3 1 "$model" --max-seq 512
echo \$! >"$PL_WORK/restarted.pid"
EOS
python3 "$driver" pipeline "$URL" "$out" "$(pl_pid c 1)" "$PL_WORK/restart1.sh" \
    "[0, 2);[2, 4);[4, 6)"
rc=$?
[ -f "$PL_WORK/restarted.pid" ] && PL_PIDS="$PL_PIDS $(cat "$PL_WORK/restarted.pid")"
[ "$rc" = 0 ] || pl_fail "the pipeline page checks failed"
ls "$out"/console_*.png >/dev/null 2>&1 || pl_fail "no screenshots in $out"
echo "screenshots: $(cd "$out" && ls console_*.png | tr '\n' ' ')"
echo "PASS"
