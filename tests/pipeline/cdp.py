"""A small Chrome DevTools Protocol client over --remote-debugging-pipe (Python stdlib only).

Chromium reads commands from fd 3 and writes replies and events to fd 4, each a JSON message
ended by a NUL byte, so no WebSocket library is needed. One page target is attached in flat
mode; every call has a deadline, so a browser that stops answering fails the test instead of
hanging it. Errors the page logs (exceptions, console errors, Content-Security-Policy
refusals) are collected in `problems` for the tests to check.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time


class CdpError(Exception):
    pass


class BrowserUnavailable(CdpError):
    """Chromium could not start at all here (no display stack, a sandbox the host forbids)."""


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, chromium, width=1280, height=860):
        self.profile = tempfile.mkdtemp(prefix="strata-chromium.")
        to_child = os.pipe()  # chromium reads fd 3
        from_child = os.pipe()  # chromium writes fd 4
        # Above 4 in this process, so the child's dup2 onto 3 and 4 cannot clobber them.
        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (*to_child, *from_child)]
        for fd in (*to_child, *from_child):
            os.close(fd)
        child_in, self.wfd, self.rfd, child_out = fds

        def remap():
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        args = [chromium, "--headless=new", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                f"--window-size={width},{height}", f"--user-data-dir={self.profile}"]
        # The tests load only strata-serve's own pages; Chromium's sandbox needs user
        # namespaces (or root's refusal of them) that CI containers often lack.
        args.append("--no-sandbox")
        args.append("about:blank")
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(args, preexec_fn=remap, pass_fds=(3, 4),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        os.close(child_in)
        os.close(child_out)
        self.buf = b""
        self.next_id = 1
        self.events = []
        self.problems = []
        self.session = None
        try:
            targets = self.call("Target.getTargets", timeout=30, browser=True)["targetInfos"]
        except CdpError as e:
            self.log.flush()
            with open(self.log.name, "rb") as f:
                tail = f.read()[-600:].decode(errors="replace").strip()
            self.close()
            raise BrowserUnavailable("%s: %s" % (e, tail or "no output"))
        page = next((t for t in targets if t["type"] == "page"), None)
        if page is None:
            page = {"targetId": self.call("Target.createTarget", {"url": "about:blank"},
                                          browser=True)["targetId"]}
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": page["targetId"], "flatten": True},
                                 browser=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "DOM"):
            self.call(domain + ".enable")

    # ---- the pipe ----
    def _send(self, msg):
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.wfd, data)
            data = data[n:]

    def _recv(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("chromium did not answer in time")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if ready:
                chunk = os.read(self.rfd, 1 << 16)
                if not chunk:
                    raise CdpError("chromium closed the pipe (see %s)" % self.log.name)
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def _note(self, ev):
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.problems.append("exception: %s" % (d.get("exception", {}).get("description")
                                                     or d.get("text")))
        elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
            self.problems.append("console.error: %s" % " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.problems.append("%s: %s (%s)" % (e.get("source"), e.get("text"), e.get("url", "")))
        self.events.append(ev)

    def call(self, method, params=None, timeout=20, browser=False):
        mid = self.next_id
        self.next_id += 1
        msg = {"id": mid, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply.get("id") == mid:
                if "error" in reply:
                    raise CdpError("%s: %s" % (method, reply["error"].get("message")))
                return reply.get("result", {})
            self._note(reply)

    def pump(self, seconds):
        """Reads events for a while (the page keeps running between calls)."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._note(self._recv(deadline))
        except CdpError as e:
            if "in time" not in str(e):
                raise

    # ---- what the tests use ----
    def goto(self, url, timeout=20):
        self.events = []
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self._note(self._recv(deadline))

    def eval(self, expression, timeout=20):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                           "returnByValue": True}, timeout=timeout)
        if "exceptionDetails" in r:
            raise CdpError("evaluate %r: %s" % (expression, r["exceptionDetails"].get("text")))
        return r.get("result", {}).get("value")

    def wait_for(self, expression, timeout, what):
        """Polls a JS expression until it is truthy (in JavaScript's sense: a DOM node counts);
        returns the seconds taken."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.eval("!!(%s)" % expression):
                return time.monotonic() - t0
            self.pump(0.1)
        raise CdpError("timed out after %.0f s waiting for %s" % (timeout, what))

    def type_text(self, selector, text):
        self.eval("document.querySelector(%s).focus()" % json.dumps(selector))
        self.call("Input.insertText", {"text": text})

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13,
                                                 "nativeVirtualKeyCode": 13,
                                                 **({"text": "\r"} if kind == "keyDown" else {})})

    def set_files(self, selector, paths):
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        self.call("DOM.setFileInputFiles", {"nodeId": node, "files": list(paths)})

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"}, timeout=30)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close", browser=True, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
