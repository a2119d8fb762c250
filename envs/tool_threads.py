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
    """At most ``max_threads`` daemon threads running submitted calls; ``submit`` returns a
    concurrent.futures.Future. Threads start on demand and then live for the process."""

    def __init__(self, max_threads: int) -> None:
        if max_threads < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {max_threads}")
        self.max_threads = max_threads
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        # One permit per worker that finished its call and waits for the next; a submit that
        # takes a permit needs no new thread (the scheme of concurrent.futures.ThreadPoolExecutor).
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Queue ``fn(*args)``; a thread runs it as soon as one is free."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, functools.partial(fn, *args)))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if self._threads < self.max_threads:
                    self._threads += 1
                    threading.Thread(
                        target=self._work, name=f"vime-tool-{self._threads}", daemon=True
                    ).start()
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._queue.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # delivered to the awaiting coroutine, not lost
                    future.set_exception(e)
            self._idle.release()


_POOL: DaemonPool | None = None
_POOL_LOCK = threading.Lock()


def tool_threads() -> DaemonPool:
    """The process-wide pool that runs sync tools (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = DaemonPool(MAX_TOOL_THREADS)
        return _POOL
