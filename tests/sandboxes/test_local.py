"""The local backend: bubblewrap isolation details, its limits, and life without bubblewrap."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vime.sandboxes import SandboxError, bwrap, create
from vime.sandboxes import local as local_module
from vime.sandboxes.local import LocalSandbox, reap_orphans
from vime.sandboxes.process import kill_orphans

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")


@pytest.fixture
async def box():
    async with create("local", timeout=10) as sandbox:
        yield sandbox


@pytest.fixture
def no_bwrap(monkeypatch):
    """Make bubblewrap look absent to the local backend."""
    real_which = shutil.which

    def which(name, *args, **kwargs):
        return None if name == "bwrap" else real_which(name, *args, **kwargs)

    monkeypatch.setattr(local_module.shutil, "which", which)


async def test_commands_run_in_work_as_an_unprivileged_user(box):
    result = await box.run("pwd; id -u; hostname")
    expected_uid = 65534 if os.geteuid() == 0 else os.geteuid()
    assert result.stdout == f"/work\n{expected_uid}\nsandbox\n"


async def test_the_host_environment_does_not_leak_in(box, monkeypatch):
    monkeypatch.setenv("VIME_TEST_SECRET", "hunter2")
    result = await box.run("env")
    assert "hunter2" not in result.stdout
    assert "HOME=/work" in result.stdout


async def test_rlimits_are_applied_inside():
    async with create(
        "local", memory_bytes=512 << 20, max_open_files=64, max_processes=32, cpu_seconds=7
    ) as box:
        result = await box.run_code(
            "import resource as r\n"
            "for name in ('AS', 'NOFILE', 'NPROC', 'CPU', 'CORE'):\n"
            "    print(*r.getrlimit(getattr(r, 'RLIMIT_' + name)))\n"
        )
    assert result.stdout.splitlines() == [
        f"{512 << 20} {512 << 20}",
        "64 64",
        "32 32",
        "7 8",
        "0 0",
    ]


async def test_cpu_time_limit_kills_a_busy_loop_before_the_wall_clock():
    # The wall-clock limit is far away: on a busy machine 1 s of CPU may take many seconds.
    async with create("local", cpu_seconds=1, timeout=120) as box:
        result = await box.run_code("while True: pass")
    assert not result.timed_out
    assert result.exit_code == 128 + 24  # SIGXCPU


async def test_file_size_limit_stops_a_large_write():
    async with create("local", max_file_bytes=1 << 20) as box:
        result = await box.run_code("open('big', 'wb').write(b'x' * (2 << 20))")
    assert result.exit_code == 1
    assert "File too large" in result.stderr


async def test_tmp_is_private_and_writable(box):
    marker = "vime-private-tmp-check"
    result = await box.run(f"echo hi > /tmp/{marker} && cat /tmp/{marker}")
    assert result.stdout == "hi\n"
    assert not os.path.exists(f"/tmp/{marker}")


async def test_a_symlink_to_a_host_file_is_not_followed_by_read_file(box):
    await box.run("ln -s /etc/passwd leak; ln -s / root")
    with pytest.raises(SandboxError, match=r"'leak' .* goes through a symbolic link"):
        await box.read_file("leak")
    with pytest.raises(SandboxError, match=r"'root/tmp/x' .*symbolic links are not followed"):
        await box.write_file("root/tmp/x", "x")
    assert not os.path.exists("/tmp/x")


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b"])
async def test_paths_outside_the_work_dir_are_refused(box, path):
    with pytest.raises(SandboxError, match="outside the sandbox work dir"):
        await box.write_file(path, "x")


async def test_work_paths_are_accepted_absolute_under_work(box):
    await box.write_file("/work/sub/dir/f.txt", "deep")
    result = await box.run("cat sub/dir/f.txt; echo more >> sub/dir/f.txt")
    assert result.stdout == "deep"
    assert await box.read_file("sub/dir/f.txt") == b"deepmore\n"


async def test_close_deletes_the_work_dir_and_refuses_further_calls():
    box = create("local")
    await box.run("echo x > f")
    workdir = box.workdir
    assert workdir is not None and (workdir / "f").exists()
    await box.close()
    assert not workdir.exists()
    with pytest.raises(SandboxError, match="is closed"):
        await box.run("true")
    await box.close()  # idempotent


async def test_close_kills_a_call_in_flight(procs):
    box = create("local", timeout=30)
    token = procs.token()
    call = asyncio.create_task(box.run(["python3", "-c", "import time; time.sleep(60)", token]))
    await asyncio.sleep(0.5)
    assert procs.live(token)
    await box.close()
    result = await asyncio.wait_for(call, 5)
    assert not result.ok
    assert await procs.wait_gone(token) == []


def test_bad_limit_values_are_refused_with_the_name():
    with pytest.raises(ValueError, match="timeout must be a positive finite number, got -1"):
        LocalSandbox(timeout=-1)
    with pytest.raises(TypeError, match=r"unknown sandbox limit\(s\) \['memory'\]"):
        LocalSandbox(memory=5)


def test_without_bubblewrap_the_backend_refuses_and_says_how_to_install(no_bwrap):
    with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
        create("local")


async def test_without_bubblewrap_the_opt_in_warns_and_applies_rlimits(no_bwrap, procs):
    with pytest.warns(RuntimeWarning, match="WITHOUT ISOLATION"):
        box = create("local", allow_unisolated=True, memory_bytes=512 << 20)
    assert not box.isolated
    token = procs.token()
    daemon = f"setsid python3 -c 'import time; time.sleep(300)' {token} >/dev/null 2>&1 &"
    try:
        result = await box.run(f"ulimit -v; echo data > f; {daemon}")
        assert result.stdout == f"{512 << 10}\n"
        assert await box.read_file("f") == b"data\n"
        assert procs.live(token)
    finally:
        await box.close()
    assert await procs.wait_gone(token) == []


@pytest.fixture
def open_parent():
    """A work dir parent the sandbox user can traverse (pytest's tmp_path is 0700)."""
    path = tempfile.mkdtemp(prefix="vime-test-parent-")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_crashed_owner_leaves_no_process_and_its_work_dir_is_reaped(procs, open_parent):
    token = procs.token()
    owner = (
        "import asyncio, sys\n"
        "from vime.sandboxes import create\n"
        "async def main():\n"
        f"    box = create('local', workdir_parent={open_parent!r})\n"
        "    await box.start()\n"
        "    print(box.workdir, flush=True)\n"
        f"    await box.run(['python3', '-c', 'import time; time.sleep(300)', {token!r}])\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    try:
        workdir = Path((await asyncio.to_thread(proc.stdout.readline)).strip())
        deadline = time.monotonic() + 30
        while not sandboxed_command_running(token) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sandboxed_command_running(token)
    finally:
        proc.kill()
        proc.wait()
    assert await procs.wait_gone(token) == []  # bubblewrap's --die-with-parent
    assert workdir.exists()
    assert reap_orphans(workdir.parent) == [workdir]
    assert not workdir.exists()


def sandboxed_command_running(token: str) -> bool:
    """True once the sandboxed command itself (not only its launcher) runs."""
    for pid in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if argv.startswith(b"python3\x00-c") and token.encode() in argv:
            return True
    return False


async def test_processes_whose_owner_is_gone_are_killed_by_the_reaper(procs):
    gone = subprocess.Popen(["true"])
    gone.wait()
    token = procs.token()
    sleeper = ["python3", "-c", "import time; time.sleep(300)", token]
    orphan = subprocess.Popen(sleeper, env={**os.environ, "VIME_SANDBOX": f"{gone.pid}-abc/1"})
    owned = subprocess.Popen(sleeper, env={**os.environ, "VIME_SANDBOX": f"{os.getpid()}-abc/1"})
    try:
        await asyncio.sleep(0.2)
        assert orphan.pid in kill_orphans()
        assert orphan.wait(5) == -9
        assert owned.poll() is None
    finally:
        for p in (orphan, owned):
            p.kill()
            p.wait()


def test_a_work_dir_parent_the_sandbox_user_cannot_reach_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root switches to another user")
    tmp_path.chmod(0o700)
    box = create("local", workdir_parent=str(tmp_path))
    with pytest.raises(SandboxError, match="is not searchable by others"):
        asyncio.run(box.start())


async def test_tmp_and_dev_shm_are_capped_at_max_file_bytes():
    fill = (
        "import sys\n"
        "total = 0\n"
        "try:\n"
        "    for i in range(10):\n"
        "        with open(f'{sys.argv[1]}/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (4 << 20))\n"
        "        total += 4\n"
        "except OSError as exc:\n"
        "    print(total, exc.strerror)\n"
    )
    async with create("local", max_file_bytes=8 << 20) as box:
        await box.write_file("fill.py", fill)
        for place in ["/tmp", "/dev/shm"]:
            result = await box.run(["python3", "fill.py", place])
            assert result.stdout == "8 No space left on device\n", place


async def test_network_true_shares_the_host_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('ok')"
    try:
        async with create("local", network=True) as box:
            result = await box.run_code(code, timeout=20)
    finally:
        listener.close()
    assert result.stdout == "ok\n", result


async def test_etc_shows_only_the_listed_host_files_with_their_content(box):
    listing = (await box.run("ls -A /etc")).stdout.split()
    expected = {os.path.basename(p) for p in bwrap._etc_paths() if os.path.lexists(p)}
    assert set(listing) == expected and "shadow" not in listing
    with open("/etc/passwd") as f:
        assert (await box.run("cat /etc/passwd")).stdout == f.read()
    assert (await box.run("touch /etc/x")).exit_code != 0
