"""The ``remote`` backend: a sandbox living on a ``vime sandbox serve`` server, used over HTTP."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from vime.sandboxes.base import LANGUAGES, ExecResult, Sandbox, SandboxError, SandboxLimits
from vime.sandboxes.server_config import TOKEN_ENV, URL_ENV

logger = logging.getLogger(__name__)

_MARGIN = 30.0  # seconds the HTTP request may take beyond the call's own timeout (queue, I/O)


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class RemoteSandbox(Sandbox):
    """A sandbox on a sandbox server, with the same interface as the local ones.

    ``url`` defaults to ``$VIME_SANDBOX_URL`` and ``token`` to ``$VIME_SANDBOX_TOKEN``. The
    server-side sandbox is made by :meth:`start` (or the first call) with the limits given
    here; limits not given are the server's defaults. Limits above the server's are refused.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        limits: SandboxLimits | None = None,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(SandboxLimits.resolve(limits, **limit_overrides))
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
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SandboxError(
                f"sandbox server {self.url} failed on {method} {path}: {exc!r}"
            ) from exc
        if response.status == 401:
            raise SandboxError(f"sandbox server {self.url} rejected the token (401): {message}")
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
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._token}"}
            )
            try:
                body = await self._request(
                    "POST", "/v1/sandboxes", timeout=60.0, json={"limits": self._requested}
                )
            except BaseException:
                await self._session.close()
                raise
            self.id = body["id"]
            self.limits = SandboxLimits(**body["limits"])

    async def _call(
        self,
        route: str,
        payload: dict[str, Any],
        timeout: float | None,
        stdin: str | bytes | None,
        files: Mapping[str, str | bytes] | None,
    ) -> ExecResult:
        await self.start()
        payload.update(
            timeout=timeout,
            stdin_b64=None if stdin is None else _b64(stdin),
            files_b64={path: _b64(data) for path, data in (files or {}).items()},
        )
        limit = (self.limits.timeout if timeout is None else timeout) + _MARGIN
        body = await self._request(
            "POST", f"/v1/sandboxes/{self.id}/{route}", timeout=limit, json=payload
        )
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
        await self.start()
        data = content.encode() if isinstance(content, str) else content
        await self._request(
            "PUT", f"/v1/sandboxes/{self.id}/files", timeout=60.0, params={"path": path}, data=data
        )

    async def read_file(self, path: str) -> bytes:
        """Read a file from the remote work dir."""
        await self.start()
        return await self._request(
            "GET", f"/v1/sandboxes/{self.id}/files", timeout=60.0, params={"path": path}
        )

    async def close(self) -> None:
        """Close the server-side sandbox and the HTTP session. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._session is None:
            return
        try:
            if self.id is not None:
                await self._request("DELETE", f"/v1/sandboxes/{self.id}", timeout=60.0)
        except SandboxError as exc:  # the server closes it when idle, or is gone with it
            logger.warning("could not close remote sandbox %s: %s", self.id, exc)
        finally:
            await self._session.close()
