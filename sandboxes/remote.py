"""The ``remote`` backend: a sandbox living on a ``vime sandbox serve`` server, used over HTTP."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vime.sandboxes.base import LANGUAGES, ExecResult, Sandbox, SandboxError, SandboxLimits
from vime.sandboxes.server_config import TOKEN_ENV, URL_ENV

logger = logging.getLogger(__name__)

_MARGIN = 30.0  # seconds the HTTP request may take beyond the call's own timeout (queue, I/O)
RETRY_SECONDS = 120.0  # how long a request keeps retrying while the server cannot be reached
_FIRST_BACKOFF, _MAX_BACKOFF = 0.25, 5.0  # seconds between retries: doubling, with jitter
_LOST = "no sandbox"  # the start of the server's 404 for a sandbox id it does not know


class _Unreachable(Exception):
    """The request did not get an answer because the connection failed (server down)."""


class _Lost(SandboxError):
    """The server does not know this sandbox (it restarted, or reaped it as idle)."""


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class RemoteSandbox(Sandbox):
    """A sandbox on a sandbox server, with the same interface as the local ones.

    ``url`` defaults to ``$VIME_SANDBOX_URL`` and ``token`` to ``$VIME_SANDBOX_TOKEN``. The
    server-side sandbox is made by :meth:`start` (or the first call) with the limits given
    here; limits not given are the server's defaults. Limits above the server's are refused.

    A server that cannot be reached (down, restarting) is retried with exponential backoff
    (0.25 s doubling to 5 s, with jitter) for up to ``retry_seconds`` (default 120; 0 turns
    retries off) before a call fails. A server that restarted has forgotten this sandbox: it is
    made again, empty, with the same limits, and the call goes to it (files written before are
    gone; ``restarts`` counts how often). A sandbox the server reaped as idle, with no outage
    seen, stays an error (404). A call whose connection drops after it was sent may
    thus run twice; a call that times out is never retried.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        limits: SandboxLimits | None = None,
        retry_seconds: float = RETRY_SECONDS,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(SandboxLimits.resolve(limits, **limit_overrides))
        if isinstance(retry_seconds, bool) or not 0 <= retry_seconds < float("inf"):
            raise ValueError(
                f"remote sandbox option retry_seconds must be >= 0 and finite, got {retry_seconds!r}"
            )
        self.retry_seconds = float(retry_seconds)
        self.restarts = 0
        self._outage = False  # set when a request found the server unreachable
        self._requested = self.limits.to_dict() if limits is not None else dict(limit_overrides)
        self.url = (url or os.environ.get(URL_ENV, "")).rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise SandboxError(
                f"remote sandbox url {self.url!r} is not an http(s) URL: pass url= or set "
                f"{URL_ENV} to the address `vime sandbox serve` printed"
            )
        self._token = token or os.environ.get(TOKEN_ENV, "")
        if not self._token:
            raise SandboxError(
                f"remote sandbox needs the server's token: pass token= or set {TOKEN_ENV}"
            )
        self.id: str | None = None
        self._session: Any = None
        self._starting = asyncio.Lock()

    async def _request(
        self, method: str, path: str, *, timeout: float, json: Any = None, **kwargs: Any
    ) -> Any:
        """One request, retried while the server cannot be reached (see the class docstring)."""
        deadline = time.monotonic() + self.retry_seconds
        backoff, attempts = _FIRST_BACKOFF, 0
        while True:
            attempts += 1
            try:
                return await self._send(method, path, timeout=timeout, json=json, **kwargs)
            except _Unreachable as exc:
                self._outage = True
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(
                        f"sandbox server {self.url} failed on {method} {path}: {exc.__cause__!r}"
                        f" ({attempts} attempts in {self.retry_seconds:g} s, retry_seconds=)"
                    ) from exc.__cause__
                pause = min(left, backoff * random.uniform(0.5, 1.0))
                if attempts == 1:
                    logger.warning(
                        "sandbox server %s unreachable (%r); retrying for up to %g s",
                        self.url,
                        exc.__cause__,
                        self.retry_seconds,
                    )
                await asyncio.sleep(pause)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _send(
        self, method: str, path: str, *, timeout: float, json: Any = None, **kwargs: Any
    ) -> Any:
        import aiohttp

        try:
            async with self._session.request(
                method,
                f"{self.url}{path}",
                json=json,
                timeout=aiohttp.ClientTimeout(total=timeout),
                **kwargs,
            ) as response:
                if response.status == 204:
                    return None
                if response.content_type == "application/octet-stream":
                    body: Any = await response.read()
                else:
                    body = await response.json(content_type=None)
                if response.status < 400:
                    return body
                message = body.get("error", body) if isinstance(body, dict) else body
        except TimeoutError as exc:  # the call may be running: never retried
            raise SandboxError(
                f"sandbox server {self.url} failed on {method} {path}: {exc!r}"
            ) from exc
        except aiohttp.ClientConnectionError as exc:  # refused, reset, dropped: no answer
            raise _Unreachable() from exc
        except aiohttp.ClientError as exc:
            raise SandboxError(
                f"sandbox server {self.url} failed on {method} {path}: {exc!r}"
            ) from exc
        if response.status == 401:
            raise SandboxError(f"sandbox server {self.url} rejected the token (401): {message}")
        if response.status == 404 and str(message).startswith(_LOST):
            raise _Lost(f"sandbox server {self.url}: {method} {path} -> 404: {message}")
        if response.status == 404 and path.endswith("/files"):
            raise FileNotFoundError(message)
        raise SandboxError(
            f"sandbox server {self.url}: {method} {path} -> {response.status}: {message}"
        )

    async def start(self) -> None:
        """Open the HTTP session and create the sandbox on the server; idempotent."""
        import aiohttp

        if self.closed:
            raise SandboxError(f"remote sandbox {self.id} is closed; create a new one")
        async with self._starting:
            if self.id is not None:
                return
            if self._session is None:
                self._session = aiohttp.ClientSession(
                    headers={"Authorization": f"Bearer {self._token}"}
                )
            try:
                body = await self._request(
                    "POST", "/v1/sandboxes", timeout=60.0, json={"limits": self._requested}
                )
            except BaseException:
                await self._session.close()
                self._session = None
                raise
            self.id = body["id"]
            self.limits = SandboxLimits(**body["limits"])

    async def _on_box(self, method: str, route: str, *, timeout: float, **kwargs: Any) -> Any:
        """A request about this sandbox; the sandbox is made again, once, if the server was
        unreachable during the request and then no longer knew it (it restarted)."""
        await self.start()
        self._outage = False
        try:
            return await self._request(
                method, f"/v1/sandboxes/{self.id}/{route}", timeout=timeout, **kwargs
            )
        except _Lost as exc:
            if not self._outage:  # reaped as idle, or closed: not a restart
                raise
            logger.warning(
                "sandbox server %s lost sandbox %s (%s): making a new, empty one",
                self.url,
                self.id,
                exc,
            )
            lost, self.id = self.id, None
            self.restarts += 1
            await self.start()
            logger.warning("remote sandbox %s replaces %s", self.id, lost)
            return await self._request(
                method, f"/v1/sandboxes/{self.id}/{route}", timeout=timeout, **kwargs
            )

    async def _call(
        self,
        route: str,
        payload: dict[str, Any],
        timeout: float | None,
        stdin: str | bytes | None,
        files: Mapping[str, str | bytes] | None,
    ) -> ExecResult:
        payload.update(
            timeout=timeout,
            stdin_b64=None if stdin is None else _b64(stdin),
            files_b64={path: _b64(data) for path, data in (files or {}).items()},
        )
        limit = (self.limits.timeout if timeout is None else timeout) + _MARGIN
        body = await self._on_box("POST", route, timeout=limit, json=payload)
        return ExecResult.from_dict(body)

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a shell command line (str) or an argv list in the remote work dir."""
        argv = command if isinstance(command, str) else list(command)
        return await self._call("run", {"command": argv}, timeout, stdin, files)

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a snippet on the server (one round trip)."""
        if language not in LANGUAGES:
            raise ValueError(f"unsupported language {language!r}; supported: {sorted(LANGUAGES)}")
        payload = {"code": code, "language": language}
        return await self._call("run_code", payload, timeout, stdin, files)

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Write a file in the remote work dir."""
        data = content.encode() if isinstance(content, str) else content
        await self._on_box("PUT", "files", timeout=60.0, params={"path": path}, data=data)

    async def read_file(self, path: str) -> bytes:
        """Read a file from the remote work dir."""
        return await self._on_box("GET", "files", timeout=60.0, params={"path": path})

    async def close(self) -> None:
        """Close the server-side sandbox and the HTTP session. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._session is None:
            return
        try:
            if self.id is not None:  # not retried: a server that is gone took the sandbox along
                await self._send("DELETE", f"/v1/sandboxes/{self.id}", timeout=60.0)
        except (SandboxError, _Unreachable) as exc:  # the server reaps it when idle
            logger.warning("could not close remote sandbox %s: %r", self.id, exc.__cause__ or exc)
        finally:
            await self._session.close()
