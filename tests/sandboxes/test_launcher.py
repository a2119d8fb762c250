"""vime-sandbox-launch (sandboxes/launcher.c): the local backend's one exec per call that switches
user and sets rlimits, and its fallback (setpriv + prlimit) when it was not built."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from vime.sandboxes import bwrap, create
from vime.sandboxes import local as local_module

SOURCE = Path(local_module.__file__).with_name("launcher.c")
pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler to build the launcher"),
]
# What a sandboxed process can see of its own limits, user, groups, capabilities and fds.
PROBE = (
    "cat /proc/self/limits; "
    "grep -E '^(Uid|Gid|Groups|Cap[A-Za-z]+|NoNewPrivs|Seccomp):' /proc/self/status; "
    "ls /proc/self/fd"
)
LIMITS = dict(memory_bytes=512 << 20, max_open_files=64, max_processes=32, cpu_seconds=7)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory) -> str:
    """The launcher built from this checkout's source, as scripts/install.sh builds it."""
    path = tmp_path_factory.mktemp("launcher") / bwrap.LAUNCHER
    build = ["cc", "-O2", "-Wall", "-Werror", "-o", str(path), str(SOURCE)]
    if subprocess.run([*build, "-static"], capture_output=True).returncode != 0:
        subprocess.run(build, check=True)
    path.parent.chmod(0o755)
    return str(path)


def use(monkeypatch, launcher: str | None) -> None:
    """Make the local backend find ``launcher`` (None: as if it was not built)."""
    monkeypatch.setattr(local_module.bwrap, "find_launcher", lambda: launcher)


async def probe(**limits) -> tuple[str, list[str]]:
    async with create("local", **limits) as box:
        result = await box.run(PROBE)
        assert result.ok, result.stderr
        return result.stdout, box._prefix[:1]


async def test_launcher_and_fallback_show_the_same_limits_user_and_groups_inside(
    monkeypatch, launcher
):
    use(monkeypatch, launcher)
    with_launcher, prefix = await probe(**LIMITS)
    if os.geteuid() == 0:
        assert prefix == [launcher]
    use(monkeypatch, None)
    with_fallback, _ = await probe(**LIMITS)
    assert with_launcher == with_fallback
    lines = with_launcher.splitlines()
    for expected in [
        ("Max cpu time", "7", "8"),
        ("Max address space", str(512 << 20), str(512 << 20)),
        ("Max processes", "32", "32"),
        ("Max open files", "64", "64"),
        ("Max core file size", "0", "0"),
    ]:
        row = next(line for line in lines if line.startswith(expected[0]))
        assert row.split()[-3:-1] == list(expected[1:]), row
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in lines
    assert "CapEff:\t0000000000000000" in lines
    assert [line.strip() for line in lines if line.startswith("Groups:")] == ["Groups:"]
    assert "NoNewPrivs:\t1" in lines and "Seccomp:\t2" in lines
    # 0-2 and ls's own directory fd: neither the launcher's nor the filter's fd leaks in.
    assert lines[-4:] == ["0", "1", "2", "3"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid switch happens only for root callers")
@pytest.mark.parametrize("built", [True, False], ids=["launcher", "fallback"])
async def test_concurrent_sandboxes_each_keep_their_own_process_limit(monkeypatch, launcher, built):
    # Set inside bwrap, RLIMIT_NPROC counts the processes of one call's user namespace (Linux
    # 5.14+). Set before bwrap, it would count every process of uid 65534 on the host: six
    # sandboxes of 4 processes each would then fail to start.
    use(monkeypatch, launcher if built else None)
    boxes = [create("local", max_processes=4) for _ in range(6)]
    try:
        results = await asyncio.gather(*(box.run("sleep 1 & sleep 1 & wait") for box in boxes))
    finally:
        for box in boxes:
            await box.close()
    assert [(r.exit_code, r.stderr) for r in results] == [(0, "")] * 6


async def test_a_fork_bomb_under_the_launcher_hits_its_process_limit(monkeypatch, launcher):
    use(monkeypatch, launcher)
    async with create("local", max_processes=8, timeout=20) as box:
        result = await box.run_code(
            "import os\n"
            "n = 0\n"
            "try:\n"
            "    while n < 100:\n"
            "        if os.fork() == 0:\n"
            "            import time; time.sleep(5); os._exit(0)\n"
            "        n += 1\n"
            "except BlockingIOError:\n"
            "    print('stopped at', n)\n"
        )
    assert result.stdout.startswith("stopped at"), result
    assert int(result.stdout.split()[-1]) < 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "--", "touch", "ran"], "unknown option --bogus"),
        (["--cpu=5:4", "--", "touch", "ran"], "soft limit above the hard one in --cpu=5:4"),
        (["--nofile=x", "--", "touch", "ran"], "not a number in --nofile=x"),
        (["--uid=65534", "--", "touch", "ran"], "--uid and --gid go together"),
        (["--cpu=5", "touch", "ran"], "missing '--' before the program to run (at touch)"),
        (["--cpu=5", "--"], "no program to run after '--'"),
        (["--close-fd=987", "--", "touch", "ran"], "--close-fd: Bad file descriptor"),
    ],
)
def test_the_launcher_refuses_bad_argv_with_a_clear_error(launcher, tmp_path, argv, message):
    result = subprocess.run([launcher, *argv], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 125
    assert result.stderr == f"{bwrap.LAUNCHER}: {message}" + (
        " (see the comment at the top of sandboxes/launcher.c)\n" if "unknown" in message else "\n"
    )
    assert not (tmp_path / "ran").exists()


def test_the_launcher_sets_limits_and_reports_a_missing_program(launcher):
    ok = subprocess.run(
        [
            launcher,
            "--cpu=5:6",
            "--nofile=100",
            "--",
            "sh",
            "-c",
            "ulimit -St; ulimit -Ht; ulimit -n",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.stdout.split() == ["5", "6", "100"]
    missing = subprocess.run([launcher, "--", "/nonexistent"], capture_output=True, text=True)
    assert missing.returncode == 127
    assert "cannot run /nonexistent" in missing.stderr


def test_a_missing_launcher_falls_back_and_says_so_once(monkeypatch, caplog):
    use(monkeypatch, None)
    monkeypatch.setattr(local_module, "_fallback_noted", False)
    with caplog.at_level(logging.INFO, logger=local_module.__name__):
        create("local")
        create("local")
    notes = [r for r in caplog.records if bwrap.LAUNCHER in r.getMessage()]
    assert len(notes) == 1
    assert "setpriv and prlimit" in notes[0].getMessage()
