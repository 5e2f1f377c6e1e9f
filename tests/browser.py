"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): no
driver binary, no websocket, no Python package beyond the standard library.

    with Chromium() as browser:
        browser.open(path, width=800)
        browser.click('[data-head="3.1"]')
        browser.evaluate("document.title")
        browser.requests    # every URL the page asked for (Network.requestWillBeSent)

`CHROMIUM` is the binary (None where none is installed: tests skip with that reason).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
)
SKIP_REASON = "no chromium binary on PATH (Debian: apt-get install chromium; .ci/run installs it where apt-get works)"


def page_data(path) -> dict:
    """The JSON a `posym explore` page embeds (its <script id="data">), read without a browser."""
    html = Path(path).read_text(encoding="utf-8")
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S).group(1)
    return json.loads(blob.replace("<\\/", "</"))


def page_blocks(path) -> list[str]:
    """The blocks a `posym explore` page embeds (<script id="block-N">, in order of N): base64 text
    that `posym.explorer.unblock` decodes."""
    html = Path(path).read_text(encoding="utf-8")
    found = re.findall(r'<script type="application/octet-stream" id="block-(\d+)">(.*?)</script>', html, re.S)
    assert [int(k) for k, _ in found] == list(range(len(found)))
    return [text for _, text in found]


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page; every command waits for its reply (events are kept)."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.TemporaryDirectory(prefix="posym-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds():  # the protocol's pipes are fds 3 (commands in) and 4 (replies out)
            high = [
                fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (to_browser_r, from_browser_w)
            ]  # either may be 3 or 4
            for fd, target in zip(high, (3, 4)):
                os.dup2(fd, target)  # inheritable

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile.name}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=fds,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict] = []
        self.session = None
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)[
            "sessionId"
        ]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self.profile.cleanup()

    # ---- the protocol ---------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed the protocol pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, *, session: bool = True) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, since: int = 0) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for event in self.events[since:]:
                if event.get("method") == method:
                    return event
            self.events.append(self._read_message(deadline))

    # ---- what tests use -------------------------------------------------------------------------

    def open(
        self, path: str | Path, *, width: int = 1400, height: int = 900, fragment: str = "", offline: bool = True
    ) -> None:
        """Load a local file at a viewport of width x height; offline: the network is switched off first."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        if offline:
            self.send(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            )
        for url in (
            "about:blank",
            Path(path).resolve().as_uri() + fragment,
        ):  # blank first: a new load, not a fragment change
            since = len(self.events)
            self.send("Page.navigate", {"url": url})
            self.wait_for("Page.loadEventFired", since)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element `selector` matches."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView();"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}
            )

    def key(self, key: str, code: str | None = None, key_code: int = 0) -> None:
        """Press and release one key on the focused element (e.g. "ArrowUp", "Enter")."""
        for kind in ("keyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": code or key, "windowsVirtualKeyCode": key_code},
            )

    def screenshot(self, path: str | Path) -> None:
        """The whole page (not only the viewport) as PNG."""
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        Path(path).write_bytes(base64.b64decode(data))

    @property
    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    @property
    def console_errors(self) -> list[str]:
        out = [
            e["params"]["entry"]["text"]
            for e in self.events
            if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
        ]
        out += [
            json.dumps(e["params"]["exceptionDetails"])[:500]
            for e in self.events
            if e.get("method") == "Runtime.exceptionThrown"
        ]
        return out
