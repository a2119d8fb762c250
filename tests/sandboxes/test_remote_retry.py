"""The remote backend rides out a sandbox server that is down for a while: calls retry with
backoff, bounded by ``retry_seconds``, against a real ``vime sandbox serve`` process."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from vime.sandboxes import SandboxError, create

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")

TOKEN = "retry-test-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(port: int) -> subprocess.Popen:
    """``vime sandbox serve`` on ``port``, once it says it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vime.cli.main", "sandbox", "serve", "--port", str(port)],
        env={**os.environ, "VIME_SANDBOX_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    assert f"listening on http://127.0.0.1:{port}" in line, line
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


@pytest.mark.parametrize("down", [3.0, pytest.param(30.0, marks=pytest.mark.slow)])
async def test_a_call_waits_out_a_server_restart_and_goes_to_a_new_sandbox(down):
    port = _free_port()
    server = await _serve(port)
    box = create("remote", url=f"http://127.0.0.1:{port}", token=TOKEN, retry_seconds=down + 60)
    try:
        await box.write_file("state.txt", "before")
        assert (await box.run("cat state.txt")).stdout == "before"
        first = box.id
        _stop(server)
        started = time.monotonic()
        call = asyncio.create_task(box.run_code("print(6 * 7)"))
        await asyncio.sleep(down)
        assert not call.done()  # still retrying, not failed
        server = await _serve(port)
        result = await asyncio.wait_for(call, 60)
        assert result.ok and result.stdout == "42\n"
        assert time.monotonic() - started >= down
        # The restarted server forgot the old sandbox: the call went to a new, empty one.
        assert box.restarts == 1 and box.id != first
        assert (await box.run("cat state.txt")).exit_code != 0
    finally:
        await box.close()
        server.kill()
        server.wait()


async def test_retries_stop_after_retry_seconds_with_a_clear_error():
    port = _free_port()  # nothing listens here
    box = create("remote", url=f"http://127.0.0.1:{port}", token=TOKEN, retry_seconds=1.5)
    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"attempts in 1\.5 s, retry_seconds="):
        await box.start()
    assert 1.5 <= time.monotonic() - started < 5
    await box.close()


async def test_retry_seconds_zero_fails_at_once():
    box = create("remote", url=f"http://127.0.0.1:{_free_port()}", token=TOKEN, retry_seconds=0)
    started = time.monotonic()
    with pytest.raises(SandboxError, match="1 attempts"):
        await box.run("true")
    assert time.monotonic() - started < 1
    await box.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True])
def test_retry_seconds_must_be_finite_and_not_negative(bad):
    with pytest.raises(ValueError, match="retry_seconds"):
        create("remote", url="http://127.0.0.1:1", token=TOKEN, retry_seconds=bad)
