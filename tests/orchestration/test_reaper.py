"""Nothing outlives a killed driver: the session reaper and the actors' owner watch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from vime.orchestration.ray_cluster import _run_tag
from vime.orchestration.reaper import TAG_VAR, pid_alive, session_processes, spawn_reaper


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


def test_a_retitled_child_and_a_holder_of_session_files_are_reaped(tmp_path) -> None:
    """Ray's agents retitle themselves (``ray::DashboardAgent``): neither their command line
    nor their environment names the session; they are the raylet's children and hold the
    session's log files open."""
    session = f"session_test_{uuid.uuid4().hex}"
    logs = tmp_path / session / "logs"
    logs.mkdir(parents=True)
    # A "raylet" whose child renames itself: the child's command line has no session name.
    spawn = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", spawn, session])
    # Reparented already (its raylet gone): it only holds a session log file open.
    holder_code = f"import time; f = open({str(logs / 'agent.log')!r}, 'w'); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", holder_code])
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        deadline = time.monotonic() + 20
        while len(session_processes(session)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        found = session_processes(session)
        assert parent.pid in found and holder.pid in found and len(found) == 3, found
        child = next(p for p in found if p not in (parent.pid, holder.pid))
        assert session.encode() not in Path(f"/proc/{child}/cmdline").read_bytes()
        reaper = spawn_reaper(owner.pid, session)
        owner.kill()
        owner.wait()
        assert wait_dead(parent.pid) and wait_dead(holder.pid) and wait_dead(child)
        reaper.wait(timeout=20)
        assert session_processes(session) == []
    finally:
        for p in (parent, holder, owner):
            p.kill()
            p.wait()


def test_an_orphan_that_only_carries_the_run_tag_is_reaped() -> None:
    """An engine whose actor exited first is re-parented away from the session and holds none
    of its files (the raylet died with the driver): only the run's tag still names it."""
    session, tag = f"session_test_{uuid.uuid4().hex}", uuid.uuid4().hex
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    orphan = subprocess.Popen(sleep, env={**os.environ, TAG_VAR: tag}, start_new_session=True)
    other = subprocess.Popen(sleep, env={**os.environ, TAG_VAR: uuid.uuid4().hex})
    owner = subprocess.Popen(sleep)
    try:
        deadline = time.monotonic() + 20  # the child's environment is readable once it runs
        while orphan.pid not in session_processes(session, tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session_processes(session) == []  # the session's own traces miss it
        assert session_processes(session, tag) == [orphan.pid]
        reaper = spawn_reaper(owner.pid, session, tag)
        time.sleep(1.5)
        assert pid_alive(orphan.pid)  # the owner lives: nothing is touched
        owner.kill()
        owner.wait()
        assert wait_dead(orphan.pid, timeout=10)
        assert reaper.wait(timeout=20) == 0
        assert pid_alive(other.pid)  # another run's tag is not this run's
    finally:
        for p in (orphan, other, owner):
            p.kill()
            p.wait()


def test_the_run_tag_is_set_for_a_local_cluster_only_and_restored_after() -> None:
    before = os.environ.get(TAG_VAR)
    with _run_tag(enabled=True) as tag:
        assert tag and os.environ[TAG_VAR] == tag
        child = subprocess.run(
            [sys.executable, "-c", f"import os; print(os.environ[{TAG_VAR!r}])"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.strip() == tag
    assert os.environ.get(TAG_VAR) == before
    with _run_tag(enabled=False) as tag:
        assert tag is None and os.environ.get(TAG_VAR) == before
