"""Load: many short executions through a pool, local and remote, with nothing lost or leaked."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import tempfile

import pytest

from vime.sandboxes.pool import SandboxPool

EPISODES = 125
RUNS_PER_EPISODE = 8  # 1,000 executions


def _local_workdirs() -> set[str]:
    return set(glob.glob(f"{tempfile.gettempdir()}/vime-sandboxes-{os.geteuid()}/{os.getpid()}-*"))


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
@pytest.mark.parametrize("backend", ["local", "remote"])  # docker: test_docker_load.py
async def test_1000_executions_at_concurrency_32_fail_none_and_leak_nothing(
    backend, backend_options, procs
):
    token = procs.token()
    workdirs_before = _local_workdirs()
    failures: list[str] = []

    async def episode(pool: SandboxPool, e: int) -> int:
        async with pool.acquire() as box:
            for r in range(RUNS_PER_EPISODE):
                word = f"{token}-{e}-{r}"
                result = await box.run(["python3", "-c", "import sys; print(sys.argv[1])", word])
                if result.stdout != word + "\n" or not result.ok:
                    failures.append(f"{word}: {result}")
        return RUNS_PER_EPISODE

    async with SandboxPool(
        backend, warm=4, max_concurrent=32, timeout=30, **backend_options
    ) as pool:
        done = await asyncio.gather(*(episode(pool, e) for e in range(EPISODES)))
        assert pool.in_use == 0
    assert failures == []
    assert sum(done) == 1000
    assert await procs.wait_gone(token) == []
    assert _local_workdirs() == workdirs_before
