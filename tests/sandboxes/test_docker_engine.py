"""The docker backend against a real engine: the container it makes, calls, files, background
processes, cancellation, orphans and exit clean-up. The shared hostile-code suite is in
test_containment.py (it includes docker when an engine runs)."""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from vime.sandboxes import SandboxError, create
from vime.sandboxes import docker as docker_backend

# Without an engine or the image these skip, or fail under VIME_REQUIRE_DOCKER=1 (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture
async def box():
    async with create("docker", timeout=10) as sandbox:
        yield sandbox


def labelled(kind: str, value: str) -> list[str]:
    """Ids of containers (or names of volumes) whose label vime.sandbox.id is ``value``."""
    api = docker_backend.api()
    label = {"label": f"vime.sandbox.id={value}"}
    if kind == "containers":
        return [c["Id"] for c in api.containers(all=True, filters=label)]
    return [v["Name"] for v in api.volumes(filters=label).get("Volumes") or []]


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, -9), done.stderr
    return done.stdout


async def test_commands_run_in_work_as_nobody_in_a_host_named_sandbox(box):
    result = await box.run("pwd; id -u; hostname; echo $HOME")
    assert result.stdout == "/work\n65534\nsandbox\n/work\n"


async def test_the_container_has_no_network_a_read_only_root_and_the_limits():
    options = {"memory_bytes": 300 << 20, "max_processes": 64, "cpus": 0.5, "runtime": "runc"}
    async with create("docker", **options) as sandbox:
        info = docker_backend.api().inspect_container(sandbox.container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert (host["Memory"], host["MemorySwap"]) == (300 << 20, 300 << 20)
    assert host["PidsLimit"] == 64
    assert host["NanoCpus"] == 500_000_000
    assert host["CapDrop"] == ["ALL"]
    assert host["Init"] is True
    assert host["Runtime"] == "runc"
    labels = info["Config"]["Labels"]
    assert labels["vime.sandbox"] == "1"
    assert labels["vime.owner"] == docker_backend.owner_tag()
    assert labels["vime.owner"].split(":")[1] == str(os.getpid())


async def test_an_unknown_runtime_fails_the_start_and_leaves_nothing():
    sandbox = create("docker", runtime="no-such-runtime")
    with pytest.raises(SandboxError, match=r"could not start a sandbox container.*no-such-runtime"):
        await sandbox.start()
    await sandbox.close()
    assert labelled("containers", sandbox.id) == []
    assert labelled("volumes", sandbox.id) == []


async def test_per_process_limits_are_rlimits_inside():
    probe = (
        "import resource as r\n"
        "for name in ('RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE'):\n"
        "    print(*r.getrlimit(getattr(r, name)))\n"
    )
    async with create("docker", cpu_seconds=7, max_file_bytes=1 << 20, max_open_files=64) as sb:
        result = await sb.run_code(probe)
    assert result.stdout.split("\n")[:-1] == ["7 8", f"{1 << 20} {1 << 20}", "64 64", "0 0"]


async def test_a_memory_hog_is_killed_by_the_kernel_and_says_so():
    async with create("docker", memory_bytes=128 << 20) as sandbox:
        hog = await sandbox.run_code("chunks = [bytearray(1 << 20) for _ in range(1024)]")
        other = await sandbox.run("kill -9 $$")
    assert (hog.exit_code, hog.timed_out) == (137, False)
    assert hog.stderr.endswith(
        f"{docker_backend.OOM_NOTE} (the sandbox's memory limit is {128 << 20} bytes)\n"
    )
    # A SIGKILL that is not the kernel's gets no such note.
    assert other.exit_code == 137
    assert docker_backend.OOM_NOTE not in other.stderr


async def test_close_removes_the_container_and_its_work_volume():
    sandbox = create("docker")
    await sandbox.start()
    assert len(labelled("containers", sandbox.id)) == 1
    assert len(labelled("volumes", sandbox.id)) == 1
    await sandbox.close()
    await sandbox.close()  # idempotent
    assert labelled("containers", sandbox.id) == []
    assert labelled("volumes", sandbox.id) == []
    with pytest.raises(SandboxError, match="is closed"):
        await sandbox.run("true")


async def test_a_missing_image_says_how_to_build_it():
    sandbox = create("docker", image="vime-sandbox:does-not-exist")
    with pytest.raises(SandboxError, match=r"not found; build it with \.ci/docker_setup\.sh"):
        await sandbox.start()
    await sandbox.close()
    assert labelled("volumes", sandbox.id) == []


async def test_a_timeout_also_kills_children_that_left_the_process_group(box, procs):
    token = procs.token()
    escapee = f"setsid sh -c 'sleep 300; : {token}' & sh -c 'while :; do :; done; : {token}'"
    result = await box.run(escapee, timeout=1)
    assert (result.timed_out, result.exit_code) == (True, -9)
    assert await procs.wait_gone(token) == []
    pids = await box.run(r"ls /proc | grep -c '^[0-9]*$'")
    # init, its `sleep infinity`, and this call's timeout, sh, ls and grep.
    assert int(pids.stdout) <= 6


async def test_a_background_child_holding_the_output_dies_when_the_call_exits(box, procs):
    token = procs.token()
    result = await box.run(f"sh -c 'sleep 300; : {token}' & echo started")
    assert result.ok and result.stdout == "started\n"
    assert result.duration < 5
    assert await procs.wait_gone(token) == []
    after = await box.run("echo next")
    assert after.stdout == "next\n"
    assert after.duration < 2  # no stall of the engine on a held-open exec


async def test_a_detached_process_keeps_running_until_close(procs):
    token = procs.token()
    sandbox = create("docker")
    await sandbox.start()
    try:
        started = await sandbox.run(
            f"nohup sh -c 'while :; do date > tick; sleep 0.2; done; : {token}' >/dev/null 2>&1 &"
        )
        assert started.ok
        await asyncio.sleep(0.5)
        assert procs.live(token) != []
        assert (await sandbox.run("cat tick")).ok
    finally:
        await sandbox.close()
    assert await procs.wait_gone(token) == []


async def test_cancelling_a_call_kills_its_processes(box, procs):
    token = procs.token()
    task = asyncio.create_task(box.run(f"sh -c 'sleep 300; : {token}'"))
    deadline = time.monotonic() + 10
    while not procs.live(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert procs.live(token) != []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await procs.wait_gone(token, within=5) == []
    assert (await box.run("echo alive")).stdout == "alive\n"


async def test_concurrent_calls_in_one_sandbox_keep_their_own_output(box):
    results = await asyncio.gather(
        *(box.run(["sh", "-c", f"echo {i}; echo e{i} >&2"]) for i in range(8))
    )
    assert [(r.stdout, r.stderr) for r in results] == [(f"{i}\n", f"e{i}\n") for i in range(8)]


async def test_output_that_came_with_the_engines_upgrade_response_is_kept(box, monkeypatch):
    # On a busy machine the client reads the exec's upgrade response late, when a fast
    # command's output already waits behind it on the connection: read it then.
    begin = http.client.HTTPResponse.begin

    def late_begin(self):
        time.sleep(0.5)
        return begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
    results = [await box.run(f"echo {i}; echo e{i} >&2") for i in range(3)]
    assert [(r.stdout, r.stderr, r.exit_code) for r in results] == [
        (f"{i}\n", f"e{i}\n", 0) for i in range(3)
    ]


async def test_files_over_the_size_limit_are_refused():
    async with create("docker", max_file_bytes=1024) as sandbox:
        await sandbox.write_file("small.bin", b"x" * 1024)
        with pytest.raises(SandboxError, match=r"could not write files \['big.bin'\]"):
            await sandbox.write_file("big.bin", b"x" * 4096)
        assert await sandbox.read_file("small.bin") == b"x" * 1024


async def test_binary_files_round_trip_and_directories_are_not_files(box):
    data = bytes(range(256)) * 64
    await box.write_file("/work/deep/dir/blob.bin", data)
    assert await box.read_file("deep/dir/blob.bin") == data
    listing = await box.run("stat -c '%U %a' deep deep/dir/blob.bin")
    assert listing.stdout == "nobody 755\nnobody 644\n"
    with pytest.raises(SandboxError, match="is not a regular file"):
        await box.read_file("deep")


async def test_a_sandbox_left_by_a_killed_process_is_reaped_when_the_next_one_starts():
    crashed = run_python(
        """
        import asyncio, os, signal
        from vime.sandboxes import create

        async def main():
            box = create("docker")
            await box.start()
            print(box.id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit

        asyncio.run(main())
        """
    ).strip()
    assert len(labelled("containers", crashed)) == 1
    assert len(labelled("volumes", crashed)) == 1
    run_python(
        """
        import asyncio
        from vime.sandboxes import create

        async def main():
            async with create("docker") as box:
                assert (await box.run("echo ok")).stdout == "ok\\n"

        asyncio.run(main())
        """
    )
    assert labelled("containers", crashed) == []
    assert labelled("volumes", crashed) == []


async def test_a_sandbox_never_closed_is_removed_at_interpreter_exit():
    left = run_python(
        """
        import asyncio
        from vime.sandboxes import create

        box = create("docker")
        asyncio.run(box.start())
        print(box.id)
        """
    ).strip()
    assert left
    assert labelled("containers", left) == []
    assert labelled("volumes", left) == []


async def test_exec_latency_beside_a_bare_subprocess(box):
    # The system interpreter, as in the container: a virtualenv's starts slower.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    docker_times, bare_times = [], []
    for _ in range(30):  # interleaved, so that load from elsewhere hits both alike
        started = time.perf_counter()
        result = await box.run(["python3", "-c", "print(1)"])
        docker_times.append(time.perf_counter() - started)
        assert result.stdout == "1\n"
        started = time.perf_counter()
        bare = await asyncio.create_subprocess_exec(
            python, "-c", "print(1)", stdout=asyncio.subprocess.PIPE
        )
        assert (await bare.communicate())[0] == b"1\n"
        bare_times.append(time.perf_counter() - started)
    docker_p50, bare_p50 = statistics.median(docker_times), statistics.median(bare_times)
    print(
        f"python3 -c 'print(1)': docker exec p50 {docker_p50 * 1000:.0f} ms "
        f"(max {max(docker_times) * 1000:.0f} ms), bare subprocess p50 {bare_p50 * 1000:.0f} ms"
    )
    # About 110 ms against 25 ms on an idle 2-core machine (the target is 120 ms there); the
    # bound only catches stalls, since CI machines are shared and loaded.
    assert docker_p50 < 10 * bare_p50 + 0.25
