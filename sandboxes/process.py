"""Host processes for sandboxes: run one with capped output and a wall-clock kill, and find or
kill every process that carries a sandbox's marker (an environment variable)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from vime.sandboxes.base import ExecResult

MARKER_VAR = "VIME_SANDBOX"  # in every sandboxed process: "<owner pid>-<sandbox id>/<call>"
# The marker in an environment (NAME=VALUE) or in a launcher's argv (--setenv NAME VALUE).
_OWNER = re.compile(rb"(?:^|\x00)" + MARKER_VAR.encode() + rb"[=\x00](\d+)-")
_CHUNK = 1 << 16
_PIPE_GRACE = 0.5  # seconds to wait for the pipes to close after the command exited


def marker(sandbox_id: str, call: int | str = "") -> str:
    """The marker of a sandbox's call (or, with no call, the prefix of all its calls)."""
    return f"{os.getpid()}-{sandbox_id}/{call}"


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def kill_orphans() -> list[int]:
    """SIGKILL sandboxed processes (and their launchers) whose owner process is gone.

    bubblewrap's --die-with-parent covers an owner that dies while a call runs, but not one
    that dies in the few milliseconds between starting a call and bwrap arming that signal.
    """
    killed = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with (
                open(f"/proc/{pid}/environ", "rb") as env,
                open(f"/proc/{pid}/cmdline", "rb") as argv,
            ):
                owners = {int(m) for m in _OWNER.findall(env.read() + b"\x00" + argv.read())}
        except OSError:
            continue
        if owners and not any(pid_alive(owner) for owner in owners):
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def _environ_has(pid: str, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or a zombie, or not ours to read
        return False


def find_marked(marker: str) -> list[int]:
    """Pids of live processes whose environment has ``VIME_SANDBOX`` starting with ``marker``.

    Zombies have no environment left and are not listed: they hold no resources but a pid.
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    me = os.getpid()
    return [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and int(pid) != me and _environ_has(pid, needle)
    ]


async def kill_marked(marker: str, *, wait: float = 2.0) -> list[int]:
    """SIGKILL every process carrying ``marker`` until none is left or ``wait`` s passed.

    Returns the pids still alive at the end (empty when the cleanup succeeded).
    """
    deadline = time.monotonic() + wait
    quiet_scans = 0
    while True:
        pids = find_marked(marker)
        # A process caught mid-exec shows an empty environment for a moment: one empty scan is
        # not proof, two in a row (with a pause) are.
        quiet_scans = 0 if pids else quiet_scans + 1
        if quiet_scans >= 2 or time.monotonic() >= deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        await asyncio.sleep(0.01)


class _Capture:
    """The first ``cap`` bytes of a stream, and whether more came."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = False

    async def pump(self, stream: asyncio.StreamReader) -> None:
        # Reading on after the cap keeps the writer from blocking on a full pipe.
        while chunk := await stream.read(_CHUNK):
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.dropped = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stream.write(data)
        await stream.drain()
    except (BrokenPipeError, ConnectionResetError):  # the command did not read all its input
        pass
    finally:
        stream.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_process(
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | None,
    max_output_bytes: int,
    cleanup: Callable[[], Awaitable[Any]],
    track: set[asyncio.subprocess.Process] | None = None,
    **popen: Any,
) -> ExecResult:
    """Run ``argv`` in its own process group and collect its capped output.

    On timeout the group is SIGKILLed; then (and whenever the pipes stay open after the
    command exited, i.e. a leftover still holds them) ``cleanup`` is awaited to kill the rest
    of the tree. ``track`` holds the process while it runs so that ``close`` can kill it.
    """
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        **popen,
    )
    if track is not None:
        track.add(proc)
    out, err = _Capture(max_output_bytes), _Capture(max_output_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [asyncio.create_task(out.pump(proc.stdout)), asyncio.create_task(err.pump(proc.stderr))]
    feeder = None
    if stdin is not None:
        assert proc.stdin is not None
        feeder = asyncio.create_task(_feed(proc.stdin, stdin))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
            await proc.wait()
        duration = time.monotonic() - started
        _, open_pipes = await asyncio.wait(pumps, timeout=_PIPE_GRACE)
        if timed_out or open_pipes:
            await cleanup()
            await asyncio.wait(pumps, timeout=_PIPE_GRACE)
    finally:
        # Reached with the command still running only when the caller was cancelled.
        if proc.returncode is None:
            _kill_group(proc)
        for task in [*pumps, feeder]:
            if task is not None and not task.done():
                task.cancel()
        if track is not None:
            track.discard(proc)
    return ExecResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=-signal.SIGKILL if timed_out else proc.returncode,
        timed_out=timed_out,
        duration=duration,
        truncated=out.dropped or err.dropped,
    )
