"""Child processes that never outlive Vime: own process group, log file, kill on exit.

Each engine or router runs in its own session so that a group kill reaches the
grandchildren vLLM spawns (engine core, workers); an ``atexit`` hook and a parent-death
signal catch the cases where Vime itself stops without cleaning up.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vime.inference.errors import EngineStartError

_LIVE: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM it when the thread that spawned it exits,
    # so a kill -9 of Vime does not leave engines holding memory and ports.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedProcess:
    """One child process (and its process group) with its output in ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.popen: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process (again, if it ran before); output is appended to the log."""
        with self._lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                log.write(f"\n=== vime: starting {self.name}: {' '.join(self.argv)}\n".encode())
                log.flush()
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        """The process id, or None before :meth:`start`."""
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        """Whether the main process is running."""
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        """The exit code once the process ended."""
        return None if self.popen is None else self.popen.poll()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``grace`` s."""
        popen = self.popen
        if popen is None:
            return
        pgid = popen.pid  # start_new_session makes the child its group's leader
        # Children that left the group (a new session of their own) are found by ancestry,
        # listed before the leader dies and re-parents them.
        tree = _descendants(popen.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # The leader may be gone while vLLM's engine core or workers linger in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for child in tree:
            with contextlib.suppress(Exception):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)
        _LIVE.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Poll ``ready()`` until it is true; raise with the log tail on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise EngineStartError(
                    f"{self.name} exited with code {self.returncode()} before it was {what}. "
                    f"Log {self.log_path}, last lines:\n{self.log_tail()}"
                )
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.5)
        raise EngineStartError(
            f"{self.name} was not {what} after {timeout:.0f} s. Raise the timeout or check "
            f"the log {self.log_path}; last lines:\n{self.log_tail()}"
        )


def _descendants(pid: int) -> list[Any]:
    """Every live descendant of ``pid`` (psutil processes); empty if it is gone."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (nothing listens there)."""
    with socket.socket() as sock:
        # Servers set SO_REUSEADDR, so connections in TIME_WAIT do not block them; nor here.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET ``url`` answers 200."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        proc.stop(grace=3.0)
