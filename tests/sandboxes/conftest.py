"""Fixtures of the sandbox tests: the backends to run the containment suite against, a factory
of sandboxes that closes them afterwards, an in-process sandbox server, and a /proc scan.

Backends: ``local`` (bubblewrap), ``remote`` (a server with the local backend on loopback) and
``docker``; remote cases are marked ``slow``, docker cases ``slow`` and ``docker`` (without an
engine and the sandbox image they skip with the reason, or fail under ``VIME_REQUIRE_DOCKER=1``:
tests/conftest.py). A backend takes part by accepting ``limits=`` and limit keywords in its
constructor and by leaving no process whose command line carries a test's token
(``live_processes``) after a timeout or ``close``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from vime.sandboxes import Sandbox, create

TOKEN = "test-token-" + "x" * 24


def backend_params() -> list[Any]:
    """The backends of the containment suite on this machine."""
    params: list[Any] = []
    if shutil.which("bwrap"):
        # remote repeats local through the server: the default run keeps local only.
        params += ["local", pytest.param("remote", marks=pytest.mark.slow)]
    params.append(pytest.param("docker", marks=[pytest.mark.slow, pytest.mark.docker]))
    return params


def live_processes(token: str) -> list[int]:
    """Pids of live processes whose command line contains ``token`` (zombies have none)."""
    needle = token.encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


async def wait_gone(token: str, within: float = 2.0) -> list[int]:
    """Processes carrying ``token`` still alive after ``within`` seconds (none is success)."""
    deadline = time.monotonic() + within
    while (pids := live_processes(token)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return pids


class ProcessScan:
    """Find a test's sandboxed processes on the host by a unique word in their command line."""

    @staticmethod
    def token() -> str:
        """A unique word to put in a sandboxed command line."""
        return f"vimetest{secrets.token_hex(6)}"

    live = staticmethod(live_processes)
    wait_gone = staticmethod(wait_gone)


@pytest.fixture
def procs() -> ProcessScan:
    """Helpers to find the processes a test started in a sandbox (see ProcessScan)."""
    return ProcessScan()


@dataclass
class RunningServer:
    """A sandbox server serving on loopback inside the test's event loop."""

    url: str
    server: Any
    runner: Any
    token: str = TOKEN

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_server(**config: Any) -> RunningServer:
    """Start a sandbox server (local backend, port 0) with ``config`` overrides."""
    from aiohttp import web

    from vime.sandboxes.server import SandboxServer
    from vime.sandboxes.server_config import ServerConfig

    server = SandboxServer(ServerConfig(port=0, **config), TOKEN)
    runner = server.runner()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return RunningServer(f"http://{host}:{port}", server, runner)


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., Awaitable[RunningServer]]]:
    """``await make_server(**config)``: a server on loopback, stopped at the end of the test."""
    servers: list[RunningServer] = []

    async def make(**config: Any) -> RunningServer:
        servers.append(await start_server(**config))
        return servers[-1]

    yield make
    for running in servers:
        await running.stop()


@pytest.fixture
async def server(make_server) -> RunningServer:
    """A sandbox server with default settings."""
    return await make_server()


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    """Each sandbox backend available here."""
    return request.param


@pytest.fixture
async def backend_options(backend: str, make_server) -> dict[str, Any]:
    """Options ``create(backend, ...)`` needs here: for ``remote``, a server's url and token."""
    if backend == "remote":
        running = await make_server()
        return {"url": running.url, "token": running.token}
    return {}


@pytest.fixture
async def make_sandbox(
    backend: str, backend_options: dict[str, Any]
) -> AsyncIterator[Callable[..., Awaitable[Sandbox]]]:
    """``await make_sandbox(**limits)``: a started sandbox of ``backend``, closed at the end."""
    boxes: list[Sandbox] = []

    async def make(**options: Any) -> Sandbox:
        box = create(backend, **backend_options, **options)
        boxes.append(box)
        await box.start()
        return box

    yield make
    for box in boxes:
        await box.close()
