"""Nothing outlives a killed ``vime train``: Ray's local processes and the actors' engines.

A ``kill -9`` of the driver skips every cleanup handler, and Ray leaves the processes of a
local cluster (GCS, raylet, agents, worker actors) running. Two guards cover that: each
actor watches the driver's pid and, when it is gone, stops what it started and exits; and
a small detached reaper process waits for the driver to die and then kills the processes
of its run.

The reaper finds them by a tag the driver puts in its environment before it starts Ray
(:func:`tag_run`): every process of the run inherits it, however it was started and
whoever its parent is now. Ray's own traces (the session name, the raylet's pid, its log
files) are not enough alone: the raylet dies with the driver (Ray's kernel fate-sharing),
and the engines and router an actor started are re-parented away from it when the actor
exits first, so neither their ancestry nor their files lead back to the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

POLL_S = 1.0
TAG_VAR = "VIME_RUN_TAG"
REAP_S = 30.0  # the reaper scans again until two scans in a row find nothing, this long at most


def tag_run() -> str:
    """Give this process (and so every process it starts from now on) a fresh run tag."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[TAG_VAR] = tag
    return tag


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


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _holds_session_file(pid: int, needle: str) -> bool:
    """Whether ``pid`` has a file open under the session's folder (its logs, its socket)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if needle in os.readlink(f"/proc/{pid}/fd/{fd}"):
                return True
        except OSError:
            continue
    return False


def session_processes(session_name: str, tag: str | None = None) -> list[int]:
    """Pids of the processes of a Ray session: by the run's ``tag`` in their environment, by
    command line, by their raylet, by the session files they hold open, and every
    descendant of those.

    Ray's agents retitle themselves (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``), so
    their command line no longer names the session, and their environment has no raylet
    pid; they are found as the raylet's children, or by the session's log files they keep
    open once the raylet is gone.
    """
    me = os.getpid()
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    core = [p for p in pids if session_name.encode() in _read(f"/proc/{p}/cmdline")]
    raylets = {str(p).encode() for p in core if b"raylet" in _read(f"/proc/{p}/cmdline")}
    tagged = f"{TAG_VAR}={tag}\0".encode() if tag else None
    members = set(core)
    for p in pids:
        env = _read(f"/proc/{p}/environ")
        by_tag = tagged is not None and tagged in env
        by_raylet = any(b"RAY_RAYLET_PID=" + r + b"\0" in env for r in raylets)
        if by_tag or by_raylet or _holds_session_file(p, session_name):
            members.add(p)
    children: dict[int, list[int]] = {}
    for p in pids:
        children.setdefault(_ppid(p), []).append(p)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members and child != me:
                members.add(child)
                todo.append(child)
    return sorted(members)


def reap_when_dead(
    owner_pid: int, session_name: str, tag: str | None = None, limit_s: float = REAP_S
) -> None:
    """Block until ``owner_pid`` dies, then SIGKILL the session's processes; scan again
    (a process can be caught mid-spawn, or killed later than its children were found)
    until two scans in a row find none, for ``limit_s`` at most."""
    while pid_alive(owner_pid):
        time.sleep(POLL_S)
    deadline = time.monotonic() + limit_s
    clean = 0
    while clean < 2 and time.monotonic() < deadline:
        pids = [p for p in session_processes(session_name, tag) if pid_alive(p)]
        clean = 0 if pids else clean + 1
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2 if pids else POLL_S / 2)


def spawn_reaper(owner_pid: int, session_name: str, tag: str | None = None) -> subprocess.Popen:
    """Start the detached reaper for a local Ray session owned by ``owner_pid``; with
    ``tag`` (see :func:`tag_run`) it also kills every process that carries it."""
    return subprocess.Popen(
        [sys.executable, "-m", "vime.orchestration.reaper", str(owner_pid), session_name]
        + ([tag] if tag else []),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    reap_when_dead(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
