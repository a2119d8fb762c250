"""The pool that runs sync tools: bounded, daemon threads, and honest about calls that waited."""

import asyncio
import threading
import time

import pytest

from vime.envs import tool_threads
from vime.envs.tool_threads import DaemonPool
from vime.envs.tools import execute_tool_calls, tool
from vime.types import ToolCall


def test_pool_never_runs_more_than_its_threads_and_reuses_them():
    pool = DaemonPool(2)
    release = threading.Event()
    running, peak, lock = [0], [0], threading.Lock()

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(5)
        with lock:
            running[0] -= 1
        return i

    futures = [pool.submit(work, i) for i in range(5)]
    deadline = time.monotonic() + 10
    while sum(f.running() for f in futures) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # room for a third thread to start, if the pool were unbounded
    assert [f.running() for f in futures] == [True, True, False, False, False]
    release.set()
    assert [f.result(timeout=5) for f in futures] == [0, 1, 2, 3, 4]
    assert peak[0] == 2
    threads = [t for t in threading.enumerate() if t.name.startswith("vime-tool-")]
    assert all(t.daemon for t in threads)
    assert pool.submit(lambda: "again").result(timeout=5) == "again"


def test_exceptions_travel_through_the_future():
    future = DaemonPool(1).submit(int, "x")
    with pytest.raises(ValueError, match="invalid literal"):
        future.result(timeout=5)


def test_pool_needs_a_thread():
    with pytest.raises(ValueError, match="at least one thread, got 0"):
        DaemonPool(0)


async def test_a_call_stuck_behind_a_hung_tool_says_it_never_started(monkeypatch):
    monkeypatch.setattr(tool_threads, "_POOL", DaemonPool(1))
    started, release = threading.Event(), threading.Event()

    @tool
    def hang() -> str:
        """Blocks until released."""
        started.set()
        release.wait(10)
        return "released"

    @tool
    def quick() -> str:
        """Returns at once."""
        return "quick"

    tools = [hang, quick]
    hung = asyncio.create_task(execute_tool_calls(tools, [ToolCall("hang", {})], timeout=10))
    try:
        while not started.is_set():
            await asyncio.sleep(0.01)
        (stuck,) = await execute_tool_calls(tools, [ToolCall("quick", {})], timeout=0.2)
        assert stuck.error == (
            "tool 'quick' timed out after 0.2 s; it never started because every tool thread was busy"
        )
    finally:
        release.set()
    assert (await hung)[0].content == "released"
    (later,) = await execute_tool_calls(tools, [ToolCall("quick", {})], timeout=5)
    assert later.content == "quick"  # the thread serves again once the hung call returned
