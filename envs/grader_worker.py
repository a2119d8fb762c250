"""The grading worker process: runs one grader call at a time for :mod:`vime.envs.grading`.

Started as ``python -m vime.envs.grader_worker REQ_FD RES_FD PARENT_PID [PRELOAD ...]``
(``module`` to import or ``module:function`` to call first). It
reads pickled ``(function, args, kwargs)`` jobs on ``REQ_FD`` and answers on ``RES_FD``; what
a grader prints goes to stderr, never into the answer channel. It dies with its parent.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

PR_SET_PDEATHSIG = 1
# A grader in this process runs its heavy functions directly (no pool inside the pool).
IN_WORKER = False


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when the parent goes, even mid-computation (Linux); a
    watchdog thread could not, since big-integer arithmetic never releases the GIL."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _limit_memory() -> None:
    limit_mb = int(os.environ.get("VIME_GRADER_MEMORY_MB", "4096"))
    if limit_mb > 0:
        import resource

        limit = limit_mb * 1024 * 1024
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _reply(results: Connection, outcome: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:  # an unpicklable result or exception
        data = pickle.dumps(("error", RuntimeError(f"{outcome[0]} not picklable: {exc}"), ""))
    results.send_bytes(data)


def serve(requests: Connection, results: Connection) -> None:
    """Answer jobs until the parent closes the request pipe."""
    while True:
        try:
            function, args, kwargs = pickle.loads(requests.recv_bytes())
        except EOFError:
            return
        except Exception as exc:  # e.g. the function cannot be imported here
            _reply(results, ("error", exc, traceback.format_exc()))
            continue
        function = getattr(function, "__vime_heavy__", function)
        try:
            _reply(results, ("ok", function(*args, **kwargs)))
        except BaseException as exc:
            _reply(results, ("error", exc, traceback.format_exc()))


def main(argv: list[str]) -> None:
    """Entry point: see the module docstring."""
    global IN_WORKER
    IN_WORKER = True
    request_fd, result_fd, parent_pid, *preload = argv
    _die_with_parent(int(parent_pid))
    # fd 1 is the parent's stdout: a chatty grader must not write there
    os.dup2(2, 1)
    _limit_memory()
    for target in preload:
        module, _, function = target.partition(":")
        try:
            loaded = importlib.import_module(module)
            if function:
                getattr(loaded, function)()
        except Exception:
            pass  # the job that needs it will say so
    requests = Connection(int(request_fd), writable=False)
    results = Connection(int(result_fd), readable=False)
    results.send_bytes(b"ready")
    serve(requests, results)


if __name__ == "__main__":
    import vime.envs.grader_worker as this  # the importable copy holds the IN_WORKER flag

    this.main(sys.argv[1:])
