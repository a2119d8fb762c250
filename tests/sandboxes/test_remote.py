"""The sandbox server and the remote backend: token, parity with local, limits, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import aiohttp
import pytest

from vime.sandboxes import SandboxError, create

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")


def remote(running, **options):
    return create("remote", url=running.url, token=running.token, **options)


async def _status(method: str, url: str, headers: dict | None = None, **kwargs) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, **kwargs) as response,
    ):
        return response.status


async def test_health_is_open_but_every_other_route_needs_the_token(server):
    async with remote(server) as box:
        routes = [
            ("POST", "/v1/sandboxes"),
            ("POST", f"/v1/sandboxes/{box.id}/run"),
            ("GET", f"/v1/sandboxes/{box.id}/files?path=x"),
            ("DELETE", f"/v1/sandboxes/{box.id}"),
        ]
        for method, path in routes:
            for headers in [
                None,
                {"Authorization": "Bearer wrong"},
                {"Authorization": server.token},
            ]:
                assert await _status(method, server.url + path, headers, json={}) == 401
        assert await _status("GET", server.url + "/v1/health") == 200
        assert (await box.run("echo still here")).stdout == "still here\n"


async def test_a_client_with_a_wrong_token_gets_a_clear_error(server):
    box = create("remote", url=server.url, token="not-the-token-at-all")
    with pytest.raises(SandboxError, match=r"rejected the token \(401\)"):
        await box.start()
    await box.close()


def test_the_remote_backend_needs_a_url_and_a_token(monkeypatch):
    monkeypatch.delenv("VIME_SANDBOX_URL", raising=False)
    monkeypatch.delenv("VIME_SANDBOX_TOKEN", raising=False)
    with pytest.raises(SandboxError, match="set VIME_SANDBOX_URL"):
        create("remote")
    with pytest.raises(SandboxError, match="set VIME_SANDBOX_TOKEN"):
        create("remote", url="http://127.0.0.1:1")
    monkeypatch.setenv("VIME_SANDBOX_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("VIME_SANDBOX_TOKEN", "from-the-environment")
    assert create("remote").url == "http://127.0.0.1:1"


async def test_remote_results_equal_local_results(server):
    calls = [
        ("run", ("echo out; echo err >&2; exit 7",), {}),
        (
            "run",
            (["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"],),
            {"stdin": "abc"},
        ),
        ("run", ("cat data.bin | od -An -tx1",), {"files": {"data.bin": b"\x00\xff\x10"}}),
        ("run_code", ("print('x' * 5000)",), {}),
        ("run_code", ("echo $((6 * 7))", "bash"), {}),
        ("run", ("sleep 5",), {"timeout": 0.5}),
    ]
    options = {"max_output_bytes": 1000, "timeout": 10}
    async with create("local", **options) as here, remote(server, **options) as there:
        for method, args, kwargs in calls:
            mine = await getattr(here, method)(*args, **kwargs)
            theirs = await getattr(there, method)(*args, **kwargs)
            assert dataclasses.replace(theirs, duration=0) == dataclasses.replace(mine, duration=0)
        await there.write_file("f.txt", "written remotely")
        assert (await there.run("cat f.txt")).stdout == "written remotely"
        assert await there.read_file("f.txt") == b"written remotely"
        with pytest.raises(FileNotFoundError):
            await there.read_file("missing.txt")


async def test_the_server_runs_at_most_max_concurrency_calls_at_once(make_server):
    running = await make_server(max_concurrency=2)
    boxes = [remote(running) for _ in range(6)]
    for box in boxes:
        await box.start()
    started = time.monotonic()
    results = await asyncio.gather(*(box.run("sleep 0.4; echo done") for box in boxes))
    elapsed = time.monotonic() - started
    for box in boxes:
        await box.close()
    assert [r.stdout for r in results] == ["done\n"] * 6
    assert running.server.peak_running == 2
    assert elapsed >= 1.2  # three waves of two


async def test_limits_above_the_server_ceiling_are_refused(server):
    box = remote(server, timeout=1000)
    with pytest.raises(SandboxError, match=r"limit timeout=1000 is above this server's 30\.0"):
        await box.start()
    await box.close()


async def test_a_call_longer_than_the_server_call_timeout_is_refused(make_server):
    running = await make_server(call_timeout=5)
    async with remote(running) as box:
        with pytest.raises(SandboxError, match=r"timeout must be in \(0, 5\]"):
            await box.run("true", timeout=10)
        assert (await box.run("echo ok", timeout=5)).stdout == "ok\n"


async def test_sandboxes_beyond_max_sandboxes_are_refused(make_server):
    running = await make_server(max_sandboxes=2)
    async with remote(running), remote(running):
        third = remote(running)
        with pytest.raises(SandboxError, match="429"):
            await third.start()
        await third.close()


async def test_bad_requests_get_400_and_unknown_sandboxes_404(server):
    headers = {"Authorization": f"Bearer {server.token}"}
    async with remote(server) as box:
        run_url = f"{server.url}/v1/sandboxes/{box.id}/run"
        assert await _status("POST", run_url, headers, data=b"not json") == 400
        assert await _status("POST", run_url, headers, json={"timeout": 1}) == 400
        assert await _status("POST", run_url, headers, json=[1, 2]) == 400
        bad_stdin = {"command": "cat", "stdin_b64": "%%%"}
        assert await _status("POST", run_url, headers, json=bad_stdin) == 400
    gone = f"{server.url}/v1/sandboxes/{box.id}/run"
    assert await _status("POST", gone, headers, json={"command": "true"}) == 404


async def test_idle_sandboxes_are_closed_by_the_server(make_server):
    running = await make_server(idle_timeout=0.2)
    box = remote(running)
    await box.start()
    await asyncio.sleep(0.6)
    assert running.server._boxes == {}
    with pytest.raises(SandboxError, match="404"):
        await box.run("true")
    await box.close()


async def test_stopping_the_server_closes_its_sandboxes(make_server):
    running = await make_server()
    box = remote(running)
    await box.start()
    (entry,) = running.server._boxes.values()
    workdir = entry.box.workdir
    assert workdir.exists()
    await running.stop()
    assert not workdir.exists()
    assert entry.box.closed


def _vime(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vime.cli.main", "sandbox", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_the_cli_refuses_to_serve_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "VIME_SANDBOX_TOKEN"}
    proc = _vime("--port", "0", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "set VIME_SANDBOX_TOKEN or pass --token-file FILE" in err


async def test_the_cli_serves_remote_sandboxes_until_sigterm(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("a-token-from-a-file-0123456789\n")
    proc = _vime("--port", "0", "--token-file", str(token_file), "--max-concurrency", "4")
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert "listening on http://127.0.0.1:" in line
        url = line.split()[-1]
        box = create("remote", url=url, token="a-token-from-a-file-0123456789")
        await box.start()
        assert (await box.run("echo served")).stdout == "served\n"
        root = f"{tempfile.gettempdir()}/vime-sandboxes-{os.geteuid()}/{proc.pid}-*"
        assert len(glob.glob(root)) == 1
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert glob.glob(root) == []
        await box.close()  # the server is gone: logged, not raised
    finally:
        proc.kill()
        proc.wait()
