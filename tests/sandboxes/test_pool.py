"""SandboxPool: warm sandboxes, one per episode, a bound on concurrent use, any backend."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from vime.sandboxes import ExecResult, Sandbox, SandboxError
from vime.sandboxes.pool import SandboxPool


class CountingSandbox(Sandbox):
    """A fake backend recording starts, closes and the calls in flight."""

    live: int = 0
    peak: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.started = False
        self.files: dict[str, bytes] = {}

    async def start(self) -> None:
        self.started = True

    async def run(self, command, *, timeout=None, stdin=None, files=None) -> ExecResult:
        CountingSandbox.live += 1
        CountingSandbox.peak = max(CountingSandbox.peak, CountingSandbox.live)
        await asyncio.sleep(0.05)
        CountingSandbox.live -= 1
        return ExecResult(stdout=str(command), stderr="", exit_code=0)

    async def write_file(self, path, content) -> None:
        self.files[path] = content.encode() if isinstance(content, str) else content

    async def read_file(self, path) -> bytes:
        return self.files[path]

    async def close(self) -> None:
        self.closed = True


class FailingSandbox(CountingSandbox):
    async def start(self) -> None:
        raise SandboxError("no room for a sandbox")


async def test_start_prepares_the_warm_sandboxes():
    async with SandboxPool(CountingSandbox, warm=3) as pool:
        assert len(pool._idle) == 3
        assert all(box.started for box in pool._idle)


async def test_an_episode_gets_a_started_sandbox_that_is_closed_after_it():
    async with SandboxPool(CountingSandbox, warm=1) as pool:
        async with pool.acquire() as box:
            assert box.started and not box.closed
            assert pool.in_use == 1
        assert box.closed
        assert pool.in_use == 0


async def test_sandboxes_are_never_reused_between_episodes():
    seen = []
    async with SandboxPool(CountingSandbox, warm=2) as pool:
        for _ in range(5):
            async with pool.acquire() as box:
                seen.append(box)
    assert len({id(box) for box in seen}) == 5


async def test_at_most_max_concurrent_sandboxes_are_in_use():
    CountingSandbox.live = CountingSandbox.peak = 0
    async with SandboxPool(CountingSandbox, warm=1, max_concurrent=3) as pool:

        async def episode(i: int) -> str:
            async with pool.acquire() as box:
                return (await box.run(f"echo {i}")).stdout

        outputs = await asyncio.gather(*(episode(i) for i in range(12)))
    assert outputs == [f"echo {i}" for i in range(12)]
    assert CountingSandbox.peak == 3


async def test_close_closes_idle_sandboxes_and_refuses_new_episodes():
    pool = SandboxPool(CountingSandbox, warm=2)
    await pool.start()
    idle = list(pool._idle)
    await pool.close()
    assert all(box.closed for box in idle)
    with pytest.raises(SandboxError, match="SandboxPool is closed"):
        async with pool.acquire():
            pass


async def test_a_backend_that_cannot_start_fails_the_episode_not_the_pool():
    async with SandboxPool(FailingSandbox, warm=1) as pool:
        with pytest.raises(SandboxError, match="no room for a sandbox"):
            async with pool.acquire():
                pass
        assert pool.in_use == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"warm": -1}, "warm must be >= 0"), ({"max_concurrent": 0}, "max_concurrent must be >= 1")],
)
def test_bad_pool_sizes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SandboxPool("local", **kwargs)


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
async def test_a_pool_of_local_sandboxes_gives_each_episode_a_fresh_work_dir():
    async with SandboxPool("local", warm=2, max_concurrent=4, timeout=10) as pool:

        async def episode(i: int) -> tuple[str, object]:
            async with pool.acquire() as box:
                before = (await box.run("ls")).stdout
                await box.run(f"echo {i} > mine")
                return before, box.workdir

        results = await asyncio.gather(*(episode(i) for i in range(6)))
    assert [before for before, _ in results] == [""] * 6
    workdirs = [w for _, w in results]
    assert len(set(workdirs)) == 6
    assert not any(w.exists() for w in workdirs)
