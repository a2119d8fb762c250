"""Nothing outlives a killed driver: the session reaper and the actors' owner watch."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

from vime.orchestration.reaper import pid_alive, session_processes, spawn_reaper


def wait_dead(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    return False


def test_the_reaper_kills_the_session_once_its_owner_dies() -> None:
    session = f"session_test_{uuid.uuid4().hex}"
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", session])
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert session_processes(session) == [member.pid]
        reaper = spawn_reaper(owner.pid, session)
        time.sleep(1.5)
        assert pid_alive(member.pid)  # the owner lives: nothing is touched
        owner.kill()
        owner.wait()
        assert wait_dead(member.pid)
        reaper.wait(timeout=20)
    finally:
        member.kill()
        owner.kill()
    member.wait()


def test_a_watched_process_runs_its_cleanup_and_exits_when_the_owner_dies(tmp_path) -> None:
    marker = tmp_path / "cleaned"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    code = (
        "import time, pathlib\n"
        "from vime.orchestration.reaper import watch_owner\n"
        f"watch_owner({owner.pid}, lambda: pathlib.Path({str(marker)!r}).write_text('x'), poll_s=0.1)\n"
        "time.sleep(600)\n"
    )
    watched = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        assert watched.poll() is None
        owner.kill()
        owner.wait()
        assert watched.wait(timeout=20) == 1
        assert marker.read_text() == "x"
    finally:
        owner.kill()
        watched.kill()
