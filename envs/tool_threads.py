"""Threads for sync tools: a bounded pool of daemon threads, so that unlike ThreadPoolExecutor a
tool that never returns cannot keep the interpreter from exiting (its thread is abandoned)."""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

# Sync tools share this many threads; a tool that never returns keeps its thread.
MAX_TOOL_THREADS = 32


class DaemonPool:
    """A bounded pool of daemon threads; ``submit`` returns a concurrent.futures.Future."""

    def __init__(self, max_threads: int) -> None:
        self._max = max_threads
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, functools.partial(fn, *args)))
        with self._lock:
            if self._idle == 0 and self._threads < self._max:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"vime-tool-{self._threads}", daemon=True
                ).start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, fn = self._queue.get()
            with self._lock:
                self._idle -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # delivered to the awaiting coroutine, not lost
                future.set_exception(e)


_POOL: DaemonPool | None = None
_POOL_LOCK = threading.Lock()


def tool_threads() -> DaemonPool:
    """The process-wide pool that runs sync tools (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = DaemonPool(MAX_TOOL_THREADS)
        return _POOL
