"""Graders of untrusted text with a hard time limit: a warm pool of killable worker processes.

A grader that parses or evaluates model output (math-verify, a user ``answer()``) can run for
minutes on a hostile input, and big-integer arithmetic holds the GIL, so neither a thread nor
``asyncio.wait_for`` can stop it. :func:`run_graded` runs the call in a worker process instead
and SIGKILLs it when the time is up; :func:`heavy` marks a function to always run that way.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from vime.errors import EnvError

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_WORKERS = int(os.environ.get("VIME_GRADER_WORKERS", "0")) or min(4, os.cpu_count() or 2)
READY_TIMEOUT = 120.0  # a worker that has not started by then is killed


class GraderTimeout(EnvError):
    """A graded call ran past its time limit; its worker was killed. Score it 0."""


class GraderCrashed(EnvError):
    """The worker running a graded call died (killed, out of memory). Score it 0."""


class _Worker:
    """One worker process and the two pipes to it."""

    def __init__(self, preload: tuple[str, ...]):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ)
        # the worker imports graders by reference, so it needs this process's import path
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vime.envs.grader_worker",
                    str(req_r),
                    str(res_w),
                    str(os.getpid()),
                    *preload,
                ],
                pass_fds=(req_r, res_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(req_r)
            os.close(res_w)
        self.requests = Connection(req_w, readable=False)
        self.results = Connection(res_r, writable=False)
        self.ready = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float) -> bool:
        try:
            self.ready = self.results.poll(timeout) and self.results.recv_bytes() == b"ready"
        except (EOFError, OSError):
            self.ready = False
        return self.ready

    def kill(self) -> None:
        """SIGKILL and reap the process, close the pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for conn in (self.requests, self.results):
            try:
                conn.close()
            except OSError:
                pass


class GraderPool:
    """``size`` warm worker processes that run graded calls one at a time each.

    Workers start in the background when the pool is made (each running ``preload``: modules
    to import or ``"module:function"`` to call), are
    SIGKILLed when a call runs past its limit and replaced at once, and die with this process
    (``PR_SET_PDEATHSIG``) or at :meth:`shutdown`. Thread-safe; a caller waiting for a worker
    or a result waits on a pipe, so it holds no GIL and stalls no event loop.
    """

    def __init__(self, size: int = DEFAULT_WORKERS, preload: tuple[str, ...] = ()):
        if size < 1:
            raise ValueError(f"a grader pool needs at least 1 worker, got {size}")
        self.size = size
        self.preload = preload
        self.owner = os.getpid()
        self.timeouts = 0
        self.crashes = 0
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._workers: set[_Worker] = set()
        self._ready = 0  # workers started and warm
        self._lock = threading.Lock()
        self._closed = False
        # One long-lived thread starts every worker: PR_SET_PDEATHSIG fires when the thread
        # that forked the child exits, so it must not be a short-lived caller thread. It is a
        # daemon, so a worker still starting never holds up the interpreter's exit.
        self._to_start: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._spawner = threading.Thread(
            target=self._spawn_loop, name="vime-grader-spawn", daemon=True
        )
        self._spawner.start()
        for _ in range(size):
            self._to_start.put(True)

    def _spawn_loop(self) -> None:
        while self._to_start.get() and not self._closed:
            self._start_worker()

    def _start_worker(self) -> None:
        if self._closed:
            return
        try:
            worker = _Worker(self.preload)
        except OSError:
            log.exception("could not start a grading worker")
            self._idle.put(None)  # wake a waiter so it can report the failure
            return
        with self._lock:
            self._workers.add(worker)
        if worker.wait_ready(READY_TIMEOUT) and not self._closed:
            with self._lock:
                self._ready += 1
            self._idle.put(worker)
            return
        self._discard(worker)
        if not self._closed:
            log.error("a grading worker failed to start (exit code %s)", worker.process.poll())
            self._idle.put(None)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.discard(worker)
                self._ready -= worker.ready
        worker.kill()

    def _replace(self, worker: _Worker) -> None:
        self._discard(worker)
        if not self._closed:
            self._to_start.put(True)

    def wait_warm(self, timeout: float = READY_TIMEOUT) -> bool:
        """Block until every worker has started (or ``timeout`` s); True when all have."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._ready >= self.size:
                    return True
            time.sleep(0.02)
        return False

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return sorted(w.pid for w in self._workers)

    def call(self, fn: Callable[..., T], /, *args: Any, timeout: float, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker, killed after ``timeout`` seconds.

        ``fn`` must be importable by reference (a module-level function or a method of a
        module-level class, not one defined in ``__main__``); arguments and result are pickled.
        Raises :class:`GraderTimeout` or :class:`GraderCrashed`; an exception of ``fn`` is
        raised here. The time spent waiting for a free worker does not count.
        """
        if timeout <= 0:
            raise ValueError(f"a grader timeout must be > 0 seconds, got {timeout!r}")
        module = getattr(fn, "__module__", None)
        if module == "__main__":
            raise EnvError(
                f"grader {getattr(fn, '__qualname__', fn)!r} is defined in __main__, which a "
                f"grading worker cannot import; move it into a module"
            )
        try:
            job = pickle.dumps((fn, args, kwargs))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise EnvError(
                f"cannot send grader {getattr(fn, '__qualname__', fn)!r} and its arguments to a "
                f"grading worker: {exc}"
            ) from exc
        worker = self._acquire()
        try:
            worker.requests.send_bytes(job)
            if not worker.results.poll(timeout):
                self.timeouts += 1
                self._replace(worker)
                worker = None
                name = getattr(fn, "__qualname__", repr(fn))
                raise GraderTimeout(f"grader {name} ran past its {timeout:g} s limit; killed")
            status, value, *trace = pickle.loads(worker.results.recv_bytes())
        except (EOFError, OSError) as exc:
            if worker is None:
                raise
            self.crashes += 1
            code = worker.process.poll()
            self._replace(worker)
            worker = None
            raise GraderCrashed(f"the grading worker died (exit code {code}): {exc}") from None
        except BaseException:
            if worker is not None:  # interrupted mid-call: the worker's state is unknown
                self._replace(worker)
                worker = None
            raise
        finally:
            if worker is not None:
                self._idle.put(worker)
        if status == "error":
            if trace and trace[0]:
                value.add_note(f"in the grading worker:\n{trace[0]}")
            raise value
        return value

    def _acquire(self) -> _Worker:
        while True:
            if self._closed:
                raise EnvError("the grader pool is shut down")
            worker = self._idle.get()
            if worker is None:
                raise EnvError(
                    "no grading worker could start; see the log above (is vime importable "
                    f"by {sys.executable}?)"
                )
            if worker.process.poll() is None:
                return worker
            self.crashes += 1
            self._replace(worker)

    def shutdown(self) -> None:
        """Kill every worker and stop replacing them. Idempotent."""
        self._closed = True
        self._to_start.put(False)
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            worker.kill()
        for _ in range(self.size):
            self._idle.put(None)


_pool: GraderPool | None = None
_pool_lock = threading.Lock()
_pool_size = DEFAULT_WORKERS
# run at each worker's start: the first math-verify call pays for lazy imports (about 1 s)
_preload = ("vime.envs.math_grader:warm_up",)


def grader_pool() -> GraderPool:
    """This process's grader pool, started (warm, in the background) on first use."""
    global _pool
    with _pool_lock:
        # a forked child must not share its parent's workers (and their pipes)
        if _pool is None or _pool._closed or _pool.owner != os.getpid():
            _pool = GraderPool(_pool_size, _preload)
        return _pool


def set_grader_workers(size: int) -> None:
    """Set how many grading workers this process keeps (default ``min(4, CPUs)``, or
    ``$VIME_GRADER_WORKERS``); the current pool, if any, is shut down."""
    global _pool, _pool_size
    if size < 1:
        raise ValueError(f"need at least 1 grading worker, got {size}")
    with _pool_lock:
        old, _pool, _pool_size = _pool, None, size
    if old is not None:
        old.shutdown()


def shutdown_grader_pool() -> None:
    """Kill this process's grading workers (also done at exit)."""
    global _pool
    with _pool_lock:
        old, _pool = _pool, None
    if old is not None:
        old.shutdown()


atexit.register(shutdown_grader_pool)


def run_graded(fn: Callable[..., T], /, *args: Any, timeout: float, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in this process's grader pool, killed after ``timeout`` s.

    Raises :class:`GraderTimeout` when the limit is hit (callers score 0 and report
    ``info["grader_timeout"]``). Inside a grading worker it calls ``fn`` directly.
    """
    from vime.envs import grader_worker

    if grader_worker.IN_WORKER:
        return getattr(fn, "__vime_heavy__", fn)(*args, **kwargs)
    return grader_pool().call(fn, *args, timeout=timeout, **kwargs)


def heavy(timeout: float = 10.0) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Mark a grader that reads untrusted text as heavy: every call runs through
    :func:`run_graded` with ``timeout`` seconds (a ToolEnv's heavy ``answer()`` that times out
    scores 0). The function must live in an importable module; for a method, ``self`` is
    pickled to the worker, so changes the call makes to the object are not kept.
    """
    if timeout <= 0:
        raise ValueError(f"heavy(timeout=...) must be > 0 seconds, got {timeout!r}")

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return run_graded(wrapper, *args, timeout=timeout, **kwargs)

        wrapper.__vime_heavy__ = fn  # type: ignore[attr-defined]
        wrapper.grader_timeout = timeout  # type: ignore[attr-defined]
        return wrapper

    return decorate
