"""Drives strata-serve's web console in headless Chromium (cdp.py) for serve_console_test.sh
and serve_console_vision_test.sh; each check prints one line, the first failure exits 1.

usage:
  serve_console_browser.py chat URL OUTDIR
      the chat page: greedy answers equal the API's for the same conversation (two turns, a
      regeneration, a system prompt in a new chat); a refused request shows the server's words.
  serve_console_browser.py pipeline URL OUTDIR STAGE1_PID RESTART_SCRIPT RANGES
      the pipeline page lists the stages with their layer ranges (RANGES: "[0, 2);[2, 4);...");
      SIGKILL to stage 1 turns it red with the reason within 2.5 s; RESTART_SCRIPT starts it
      again and every stage turns green.
  serve_console_browser.py image URL OUTDIR IMAGE MESSAGE EXPECTED_FILE
      an image attached with the file picker, shown as a thumbnail in the turn, answered (greedy)
      with the text in EXPECTED_FILE (strata-client --chat --image's answer).
Screenshots go to OUTDIR (the test's undeclared outputs: kept as artefacts). Exit 77 after
printing "skipped: <why>" when no Chromium is installed or it cannot start here.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402

MAX_TOKENS = 16


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def model_id(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def api_chat(url, messages, max_tokens=MAX_TOKENS, **extra):
    body = {"model": model_id(url), "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    body.update(extra)
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return 200, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def in_flight(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("strata_serve_requests_in_flight "):
                return int(float(line.split()[1]))
    fail("/metrics has no strata_serve_requests_in_flight")


def no_page_errors(b, page):
    problems = page_problems(b)
    if problems:
        fail("the %s page logged errors: %s" % (page, problems))


def page_problems(b):
    # Chromium logs every non-2xx fetch: the API's own error answers (a 400 the page shows, a
    # 503 from /v1/stages for a broken ring) are the pages' business; anything else (an
    # exception, a CSP refusal, a missing console file) is a fault.
    return [p for p in b.problems
            if not (p.startswith("network:") and ("/v1/" in p or "/metrics" in p))]


def last_answer(b):
    return b.eval("(() => { const m = strataChat.current().messages;"
                  " return m.length ? m[m.length - 1] : null; })()")


def send(b, text):
    n = b.eval("strataChat.current().messages.length")
    b.type_text("#prompt", text)
    b.press_enter()
    b.wait_for("(() => { const m = strataChat.current().messages;"
               f" return m.length === {n + 2} && !m[m.length - 1].streaming; }})()",
               60, "the answer to %r" % text)
    m = last_answer(b)
    if m.get("error"):
        return None, m["error"]
    return m["content"], None


def settings(b, max_tokens, temperature, system=""):
    b.eval("(() => { const s = (id, v) => { const e = document.getElementById(id); e.value = v;"
           " e.dispatchEvent(new Event('change')); };"
           f" s('max-tokens', {max_tokens}); s('temperature', {temperature});"
           f" s('system', {json.dumps(system)}); }})()")


def chat(url, outdir):
    b = cdp.Browser(cdp.find_chromium())
    try:
        b.goto(url + "/")
        b.wait_for("document.getElementById('model').textContent !== ''", 10, "the model id")
        settings(b, MAX_TOKENS, 0)
        history = []
        for turn, text in enumerate(["Hello", "And then what happened?"], 1):
            got, err = send(b, text)
            if err:
                fail("turn %d: the page shows an error: %s" % (turn, err))
            history.append({"role": "user", "content": text})
            code, want = api_chat(url, history)
            if code != 200:
                fail("turn %d: the API answered %d: %s" % (turn, code, want))
            want = want["choices"][0]["message"]["content"]
            if not want or got != want:
                fail("turn %d: page %r != API %r" % (turn, got, want))
            shown = b.eval("document.querySelector('#messages .msg.assistant:last-of-type"
                           " .bubble').textContent")
            if shown.strip() != want.strip():
                fail("turn %d: the bubble shows %r, the answer is %r" % (turn, shown, want))
            history.append({"role": "assistant", "content": want})
            print("chat turn %d: page == API (%d chars)" % (turn, len(want)))
        stats = b.eval("document.querySelector('#messages .msg.assistant:last-of-type"
                       " .stats').textContent")
        if "tokens/s" not in stats or "first token" not in stats:
            fail("no tokens/s and time to first token under the answer: %r" % stats)
        print("stats under the answer: " + stats)
        b.screenshot(os.path.join(outdir, "console_chat.png"))

        b.eval("document.querySelector('#messages .regenerate').click()")
        b.wait_for("(() => { const m = strataChat.current().messages;"
                   " return m.length === 4 && !m[3].streaming; })()", 60, "the regenerated answer")
        if last_answer(b)["content"] != history[-1]["content"]:
            fail("regenerate (greedy) gave %r, not %r" % (last_answer(b)["content"],
                                                          history[-1]["content"]))
        print("regenerate: the same greedy answer")

        b.eval("document.getElementById('new-chat').click()")
        settings(b, MAX_TOKENS, 0, system="You answer in one short sentence.")
        got, err = send(b, "Hi")
        code, want = api_chat(url, [{"role": "system", "content": "You answer in one short sentence."},
                                    {"role": "user", "content": "Hi"}])
        if err or code != 200 or got != want["choices"][0]["message"]["content"]:
            fail("new chat with a system prompt: page %r (%s) != API %r" % (got, err, want))
        n = b.eval("document.querySelectorAll('#convs li').length")
        if n != 2:
            fail("the conversation list has %d entries, not 2" % n)
        print("new chat with a system prompt: page == API; 2 conversations listed")

        settings(b, 100000, 0)
        got, err = send(b, "Too long")
        code, want = api_chat(url, [{"role": "user", "content": "Too long"}], max_tokens=100000)
        if code != 400 or not err or want["error"]["message"] not in err:
            fail("a refused request: page %r, API %d %r" % (err, code, want))
        print("refused request: the page shows the server's words: " + err)
        b.screenshot(os.path.join(outdir, "console_chat_error.png"))

        # Stop: a long answer, stopped once it streams; the server cancels the request.
        settings(b, 400, 0)
        n = b.eval("strataChat.current().messages.length")
        b.type_text("#prompt", "Count to a thousand")
        b.press_enter()
        b.wait_for("(() => { const m = strataChat.current().messages;"
                   f" return m.length === {n + 2} && m[m.length - 1].content.length > 0; }})()",
                   30, "the long answer to start")
        b.eval("document.getElementById('stop').click()")
        b.wait_for("!strataChat.current().messages.at(-1).streaming", 10, "the stop")
        m = last_answer(b)
        if not m.get("stopped") or m.get("error"):
            fail("Stop: the answer was not stopped (%r)" % m)
        t0 = time.monotonic()
        while in_flight(url) != 0:
            if time.monotonic() - t0 > 10:
                fail("Stop: the server still has %d requests in flight" % in_flight(url))
            time.sleep(0.1)
        thinking = [b.eval("strataChat.requestBody().chat_template_kwargs.enable_thinking")]
        b.eval("document.getElementById('thinking').click()")
        thinking.append(b.eval("strataChat.requestBody().chat_template_kwargs.enable_thinking"))
        if thinking != [False, True]:
            fail("the thinking switch sends enable_thinking %s, not [False, True]" % thinking)
        print("stop: the answer stopped after %d chars; the server cancelled it" % len(m["content"]))
        no_page_errors(b, "chat")
    finally:
        b.close()


def pipeline(url, outdir, pid, restart, ranges):
    ranges = ranges.split(";")
    b = cdp.Browser(cdp.find_chromium(), height=1150)
    try:
        b.goto(url + "/pipeline")
        b.wait_for("document.querySelectorAll('.stage[data-state=\"up\"]').length === %d"
                   % len(ranges), 15, "%d stages up" % len(ranges))
        got = b.eval("[...document.querySelectorAll('.stage .range-text')].map(e => e.textContent)")
        if got != ranges:
            fail("the page lists ranges %s, the ring has %s" % (got, ranges))
        roles = b.eval("[...document.querySelectorAll('.stage')].map(s =>"
                       " [...s.querySelectorAll('.badge')].map(e => e.textContent).join(','))")
        if roles[0].split(",")[0] != "embed" or "head" not in roles[-1].split(","):
            fail("roles %s: stage 0 embeds, the last stage holds the head" % roles)
        print("pipeline page: stages %s, roles %s" % (got, roles))
        b.pump(2.5)  # a few chart samples
        b.screenshot(os.path.join(outdir, "console_pipeline.png"))

        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        b.wait_for("document.querySelector('.stage[data-stage=\"1\"][data-state=\"down\"]') !== null", 10,
                   "stage 1 to turn red")
        red = time.monotonic() - t0
        reason = b.eval("document.querySelector('.stage[data-stage=\"1\"] .reason').textContent")
        status = b.eval("document.getElementById('status-text').textContent")
        print("stage 1 killed: red after %.2f s: %s (%s)" % (red, reason, status))
        if red > 2.5:
            fail("stage 1 turned red %.2f s after the kill (allowed 2.5 s)" % red)
        if not reason or "ring broken" not in status:
            fail("no reason on the red stage (%r) or no broken-ring status (%r)" % (reason, status))
        b.screenshot(os.path.join(outdir, "console_pipeline_down.png"))

        subprocess.run(["bash", restart], check=True)
        t0 = time.monotonic()
        b.wait_for("document.querySelectorAll('.stage[data-state=\"up\"]').length === %d"
                   % len(ranges), 30, "every stage green after the restart")
        print("stage 1 restarted: every stage green after %.2f s" % (time.monotonic() - t0))
        no_page_errors(b, "pipeline")
    finally:
        b.close()


def attach_turn(b, url, outdir, kind, path, message, expected_file):
    """A file attached with the picker (kind "image": an <img> thumbnail, "video": a <video>)
    before sending and in the turn, and the greedy answer equal to strata-client --chat
    --image / --video's with the same message."""
    tag = "img" if kind == "image" else "video"
    want = open(expected_file, encoding="utf-8", errors="replace").read()
    if want.endswith("\n"):  # strata-client ends its answer with a newline
        want = want[:-1]
    b.goto(url + "/")
    b.wait_for("document.getElementById('model').textContent !== ''", 10, "the model id")
    settings(b, MAX_TOKENS, 0)
    b.set_files("#file", [path])
    b.wait_for("document.querySelectorAll('#pending %s').length === 1" % tag, 10,
               "the attached %s's thumbnail" % kind)
    got, err = send(b, message)
    if err:
        fail("the %s turn shows an error: %s" % (kind, err))
    thumbs = b.eval("document.querySelectorAll('#messages .msg.user .thumbs %s').length" % tag)
    if thumbs != 1:
        fail("the user turn shows %d %s thumbnails, not 1" % (thumbs, kind))
    if not want or got != want:
        fail("%s turn: page %r != strata-client --chat --%s %r" % (kind, got, kind, want))
    print("%s turn: page == strata-client --chat --%s (%r); thumbnail shown" % (kind, kind, got))
    b.screenshot(os.path.join(outdir, "console_chat_%s.png" % kind))
    no_page_errors(b, "chat")


def video(url, outdir, path, message, expected_file):
    b = cdp.Browser(cdp.find_chromium())
    try:
        attach_turn(b, url, outdir, "video", path, message, expected_file)
    finally:
        b.close()


def image(url, outdir, path, message, expected_file):
    b = cdp.Browser(cdp.find_chromium())
    try:
        attach_turn(b, url, outdir, "image", path, message, expected_file)

        # The pipeline page draws the vision stage in front of the ring.
        b.goto(url + "/pipeline")
        b.wait_for("document.querySelectorAll('.stage[data-state=\"up\"]').length === 3", 15,
                   "the vision stage and 2 stages up")
        names = b.eval("[...document.querySelectorAll('.stage h3')].map(e => e.textContent)")
        ranges = b.eval("[...document.querySelectorAll('.stage .range-text')]"
                        ".map(e => e.textContent)")
        if names != ["vision stage", "stage 0", "stage 1"] or ranges != ["[0, 2)", "[2, 4)"]:
            fail("the pipeline page behind a vision stage shows %s %s" % (names, ranges))
        print("pipeline page: %s, ranges %s" % (names, ranges))
        b.screenshot(os.path.join(outdir, "console_pipeline_vision.png"))
        no_page_errors(b, "pipeline")
    finally:
        b.close()


def main():
    if len(sys.argv) < 4:
        fail(__doc__)
    what, url, outdir = sys.argv[1:4]
    os.makedirs(outdir, exist_ok=True)
    if cdp.find_chromium() is None:
        print("skipped: no Chromium to drive (Debian package chromium; ./strata test installs it)")
        sys.exit(77)
    try:
        if what == "chat":
            chat(url, outdir)
        elif what == "pipeline":
            pipeline(url, outdir, int(sys.argv[4]), sys.argv[5], sys.argv[6])
        elif what == "image":
            image(url, outdir, sys.argv[4], sys.argv[5], sys.argv[6])
        elif what == "video":
            video(url, outdir, sys.argv[4], sys.argv[5], sys.argv[6])
        else:
            fail("unknown check %r" % what)
    except cdp.BrowserUnavailable as e:
        print("skipped: Chromium cannot start here: %s" % e)
        sys.exit(77)
    except cdp.CdpError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
