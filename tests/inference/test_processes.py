"""Child processes: a group stop leaves nothing behind, and start failures show the log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vime.inference.errors import EngineStartError
from vime.inference.processes import ManagedProcess, free_port, port_free


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _start_with_child(tmp_path: Path, name: str, script: str) -> tuple[ManagedProcess, int]:
    """Start ``bash -c script`` (``$PIDFILE`` gets a child's pid); return it and that pid."""
    pidfile = tmp_path / f"{name}.pid"
    proc = ManagedProcess(
        name, ["bash", "-c", script.replace("$PIDFILE", str(pidfile))], log_path=tmp_path / "log"
    )
    proc.start()
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10)
    return proc, int(pidfile.read_text())


def test_stop_kills_the_whole_process_group_including_grandchildren(tmp_path: Path) -> None:
    script = "sleep 300 & echo $! > $PIDFILE; trap '' TERM; sleep 300"
    proc, grandchild = _start_with_child(tmp_path, "sleeper", script)
    proc.stop(grace=0.5)  # the parent ignores SIGTERM, so SIGKILL must reach the group
    assert not proc.alive()
    _wait_for(lambda: not _alive(grandchild), 5)


def test_stop_kills_a_grandchild_that_left_the_process_group(tmp_path: Path) -> None:
    proc, escaped = _start_with_child(
        tmp_path, "escaper", "setsid sleep 300 & echo $! > $PIDFILE; sleep 300"
    )
    # Once setsid ran, a group kill alone would miss it.
    _wait_for(lambda: os.getpgid(escaped) != proc.pid, 10)
    proc.stop(grace=0.5)
    _wait_for(lambda: not _alive(escaped), 5)


def test_port_free_tells_a_listening_port_from_a_free_one() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_free("127.0.0.1", port)
    assert port_free("127.0.0.1", port)


def test_a_process_that_exits_while_starting_reports_its_log_tail(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "engine 0", ["bash", "-c", "echo 'CUDA out of memory'; exit 3"], log_path=tmp_path / "l"
    )
    proc.start()
    with pytest.raises(EngineStartError, match=r"exited with code 3(.|\n)*CUDA out of memory"):
        proc.wait_until(lambda: False, timeout=10, what="healthy")


def test_a_process_that_never_gets_ready_times_out_with_the_log(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "engine 1", ["bash", "-c", "echo loading; sleep 30"], log_path=tmp_path / "l"
    )
    proc.start()
    try:
        with pytest.raises(EngineStartError, match=r"not healthy after 1 s(.|\n)*loading"):
            proc.wait_until(lambda: False, timeout=1, what="healthy")
    finally:
        proc.stop(grace=1)


def test_free_port_can_be_bound() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
