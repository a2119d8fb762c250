"""Nothing outlives a killed ``vime train``: Ray's local processes and the actors' engines.

A ``kill -9`` of the driver skips every cleanup handler, and Ray leaves the processes of a
local cluster (GCS, raylet, agents, worker actors) running. Two guards cover that: each
actor watches the driver's pid and, when it is gone, stops what it started and exits; and
a small detached reaper process waits for the driver to die and then kills the processes
of its Ray session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 1.0


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (zombies count as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def watch_owner(owner_pid: int, on_death: Callable[[], None], poll_s: float = POLL_S) -> None:
    """Call ``on_death()`` then exit this process once ``owner_pid`` is gone."""

    def loop() -> None:
        while pid_alive(owner_pid):
            time.sleep(poll_s)
        try:
            on_death()
        finally:
            os._exit(1)

    threading.Thread(target=loop, name="vime-owner-watch", daemon=True).start()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def session_processes(session_name: str) -> list[int]:
    """Pids of the processes of a Ray session: by command line, then by their raylet."""
    me = os.getpid()
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    core = [p for p in pids if session_name.encode() in _read(f"/proc/{p}/cmdline")]
    raylets = {str(p).encode() for p in core if b"raylet" in _read(f"/proc/{p}/cmdline")}
    members = set(core)
    for p in pids:
        env = _read(f"/proc/{p}/environ")
        if any(b"RAY_RAYLET_PID=" + r + b"\0" in env for r in raylets):
            members.add(p)
    return sorted(members)


def reap_when_dead(owner_pid: int, session_name: str) -> None:
    """Block until ``owner_pid`` dies, then SIGKILL the session's processes."""
    while pid_alive(owner_pid):
        time.sleep(POLL_S)
    for pid in session_processes(session_name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def spawn_reaper(owner_pid: int, session_name: str) -> subprocess.Popen:
    """Start the detached reaper for a local Ray session owned by ``owner_pid``."""
    return subprocess.Popen(
        [sys.executable, "-m", "vime.orchestration.reaper", str(owner_pid), session_name],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    reap_when_dead(int(sys.argv[1]), sys.argv[2])
