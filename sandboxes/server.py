"""The sandbox server: the Sandbox interface over HTTP (aiohttp), behind a bearer token, with a
limit on concurrent calls, a per-call time cap and idle sandboxes closed.

Routes (JSON unless said otherwise; bytes travel base64-encoded in JSON):
``GET /v1/health`` (no token) · ``POST /v1/sandboxes`` {limits} · ``POST
/v1/sandboxes/{id}/run`` {command, timeout, stdin_b64, files_b64} · ``POST
/v1/sandboxes/{id}/run_code`` {code, language, timeout, stdin_b64, files_b64} · ``PUT|GET
/v1/sandboxes/{id}/files?path=P`` (raw bytes) · ``DELETE /v1/sandboxes/{id}``.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import web

from vime.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits
from vime.sandboxes.connections import (
    ACCEPT_BACKLOG,
    ConnectionGuard,
    connection_budget,
    raise_fd_limit,
)
from vime.sandboxes.registry import create
from vime.sandboxes.server_config import ServerConfig

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _decode(value: Any, what: str) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be base64 text, got {str(value)[:40]!r}") from None


async def _body(request: web.Request, timeout: float) -> bytes:
    """The request's body, which must arrive within ``timeout`` seconds (slow senders are cut)."""
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f'{{"error": "the request body did not arrive within {timeout} s"}}',
            content_type="application/json",
        ) from None


async def _json(request: web.Request, timeout: float) -> dict[str, Any]:
    try:
        body = json.loads(await _body(request, timeout))
    except json.JSONDecodeError as exc:
        raise ValueError(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _path(request: web.Request) -> str:
    if "path" not in request.query:
        raise ValueError("missing query parameter 'path'")
    return request.query["path"]


@dataclass
class _Entry:
    box: Sandbox
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0


class SandboxServer:
    """The state behind the routes: open sandboxes, the call queue and the idle reaper."""

    def __init__(self, config: ServerConfig, token: str) -> None:
        self.config = config
        self.ceiling = config.limits()
        self._token = token.encode()
        self._calls = asyncio.Semaphore(config.max_concurrency)
        self._boxes: dict[str, _Entry] = {}
        self._creating = 0
        self._reaper: asyncio.Task[None] | None = None
        self.running = 0  # calls running now, and the most seen at once (for tests and stats)
        self.peak_running = 0
        self.guard = ConnectionGuard(
            header_timeout=config.header_timeout,
            keepalive_timeout=config.keepalive_timeout,
            max_connections=connection_budget(config.max_connections, config.max_concurrency),
        )

    def app(self) -> web.Application:
        """The aiohttp application (routes, token check, start-up and shut-down hooks)."""
        app = web.Application(
            middlewares=[self.guard.middleware, self._auth], client_max_size=256 << 20
        )
        app.router.add_get("/v1/health", self._health)
        app.router.add_post("/v1/sandboxes", self._create)
        app.router.add_post("/v1/sandboxes/{id}/run", self._run)
        app.router.add_post("/v1/sandboxes/{id}/run_code", self._run_code)
        app.router.add_put("/v1/sandboxes/{id}/files", self._write_file)
        app.router.add_get("/v1/sandboxes/{id}/files", self._read_file)
        app.router.add_delete("/v1/sandboxes/{id}", self._close)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def runner(self) -> web.AppRunner:
        """A runner for :meth:`app` whose connections the guard watches; a client that
        disconnects cancels its call (and kills it)."""
        guard = self.guard

        class Runner(web.AppRunner):
            async def setup(self) -> None:
                await super().setup()
                assert self.server is not None
                guard.install(self.server)

        return Runner(
            self.app(),
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=self.config.keepalive_timeout,
        )

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/v1/health":
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), self._token):
                response = _error(401, "missing or wrong bearer token")
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        try:
            return await handler(request)
        except (ValueError, TypeError, SandboxError) as exc:
            return _error(400, str(exc))
        except FileNotFoundError as exc:
            return _error(404, str(exc))
        except OSError as exc:  # e.g. reading a directory as a file
            return _error(400, f"{type(exc).__name__}: {exc}")

    async def _on_startup(self, app: web.Application) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    async def _on_cleanup(self, app: web.Application) -> None:
        self.guard.stop()
        if self._reaper is not None:
            self._reaper.cancel()
        boxes = [entry.box for entry in self._boxes.values()]
        self._boxes.clear()
        await asyncio.gather(*(box.close() for box in boxes), return_exceptions=True)

    async def _reap_idle(self) -> None:
        period = min(self.config.idle_timeout / 4, 30.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for key, entry in list(self._boxes.items()):
                if not entry.busy and now - entry.last_used > self.config.idle_timeout:
                    logger.info("closing sandbox %s, idle for %.0f s", key, now - entry.last_used)
                    del self._boxes[key]
                    await entry.box.close()

    def _entry(self, request: web.Request) -> _Entry:
        key = request.match_info["id"]
        if key not in self._boxes:
            raise web.HTTPNotFound(
                text=f'{{"error": "no sandbox {key!r} (closed, idle too long or never made)"}}',
                content_type="application/json",
            )
        entry = self._boxes[key]
        entry.last_used = time.monotonic()
        return entry

    def _limits(self, requested: dict[str, Any]) -> SandboxLimits:
        """The client's limits, each checked against the server's ceiling."""
        if not isinstance(requested, dict):
            raise ValueError(f"limits must be an object, got {requested!r}")
        limits = self.ceiling.with_overrides(**requested)
        for f in fields(SandboxLimits):
            asked, most = getattr(limits, f.name), getattr(self.ceiling, f.name)
            if asked > most:
                raise ValueError(f"limit {f.name}={asked!r} is above this server's {most!r}")
        return limits

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "backend": self.config.backend})

    async def _create(self, request: web.Request) -> web.Response:
        limits = self._limits((await _json(request, self.config.read_timeout)).get("limits") or {})
        if len(self._boxes) + self._creating >= self.config.max_sandboxes:
            return _error(429, f"this server already has {len(self._boxes)} sandboxes open")
        self._creating += 1
        try:
            box = create(self.config.backend, limits=limits)
            try:
                await box.start()
            except Exception as exc:
                await box.close()
                return _error(503, f"the server could not start a sandbox: {exc}")
        finally:
            self._creating -= 1
        key = secrets.token_hex(8)
        self._boxes[key] = _Entry(box)
        return web.json_response({"id": key, "limits": limits.to_dict()}, status=201)

    async def _call(self, entry: _Entry, body: dict[str, Any], code: bool) -> web.Response:
        timeout = body.get("timeout")
        limit = entry.box.limits.timeout if timeout is None else float(timeout)
        if not 0 < limit <= self.config.call_timeout:
            raise ValueError(f"timeout must be in (0, {self.config.call_timeout}], got {limit!r}")
        files = body.get("files_b64") or {}
        if not isinstance(files, dict):
            raise ValueError(f"files_b64 must map paths to base64 text, got {type(files)}")
        kwargs: dict[str, Any] = {
            "timeout": limit,
            "stdin": _decode(body.get("stdin_b64"), "stdin_b64"),
            "files": {path: _decode(data, f"files_b64[{path!r}]") for path, data in files.items()},
        }
        entry.busy += 1
        try:
            try:
                await asyncio.wait_for(self._calls.acquire(), self.config.call_timeout)
            except TimeoutError:
                return _error(503, f"no free slot within {self.config.call_timeout} s; retry later")
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
            try:
                if code:
                    result: ExecResult = await entry.box.run_code(
                        body["code"], body.get("language", "python"), **kwargs
                    )
                else:
                    result = await entry.box.run(body["command"], **kwargs)
            finally:
                self.running -= 1
                self._calls.release()
        except KeyError as exc:
            raise ValueError(f"missing field {exc.args[0]!r}") from None
        finally:
            entry.busy -= 1
            entry.last_used = time.monotonic()
        return web.json_response(result.to_dict())

    async def _run(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        return await self._call(entry, await _json(request, self.config.read_timeout), code=False)

    async def _run_code(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        return await self._call(entry, await _json(request, self.config.read_timeout), code=True)

    async def _write_file(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        await entry.box.write_file(_path(request), await _body(request, self.config.read_timeout))
        return web.Response(status=204)

    async def _read_file(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        data = await entry.box.read_file(_path(request))
        return web.Response(body=data, content_type="application/octet-stream")

    async def _close(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        del self._boxes[request.match_info["id"]]
        await entry.box.close()
        return web.Response(status=204)


async def serve(config: ServerConfig, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve until cancelled; ``ready`` gets the base URL once the port is bound."""
    raise_fd_limit()  # idle clients must not exhaust a low soft limit (often 1024)
    server = SandboxServer(config, config.token())
    runner = server.runner()
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, backlog=ACCEPT_BACKLOG)
        await site.start()
        host, port = runner.addresses[0][:2]
        if ready is not None:
            ready(f"http://{host}:{port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
