"""A minimal headless-Chromium driver over the DevTools protocol (a websocket, from the
``websockets`` package): navigate, evaluate JavaScript, click, screenshot, and collect every
console error and uncaught exception of the page."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class Browser:
    """One Chromium process with one page; use as a context manager."""

    def __init__(self, profile: Path, *, width: int = 1400, height: int = 1000) -> None:
        self.profile = profile
        self.size = (width, height)
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _note(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append(d.get("exception", {}).get("description") or d.get("text", "?"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])
        self._events.append(event)

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        """Send one protocol command and return its result (events seen meanwhile are kept)."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if message.get("id") == msg_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note(message)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        """Wait for the next event named ``method`` (one already received counts)."""
        for i, event in enumerate(self._events):
            if event.get("method") == method:
                return self._events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            self._note(event)
            if event.get("method") == method:
                self._events.remove(event)
                return event

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self._events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout=120)

    def js(self, expression: str, timeout: float = 60) -> Any:
        """Evaluate ``expression`` in the page (awaiting a promise) and return its JSON value."""
        result = self.call(
            "Runtime.evaluate",
            timeout=timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"still false after {timeout}s: {expression}")

    def screenshot(self) -> bytes:
        """A PNG of the viewport."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
