"""Load on the docker backend: 1,000 executions over 32 concurrent sandboxes, none failed, no
container or volume left, and the exec latency under that load."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from vime.sandboxes import create
from vime.sandboxes import docker as docker_backend

# Without an engine or the image these skip, or fail under VIME_REQUIRE_DOCKER=1 (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.docker]

CONCURRENCY = 32
EXECUTIONS = 1000


def owned() -> tuple[list[str], list[str]]:
    """Containers and volumes labelled as made by this process."""
    api = docker_backend.api()
    label = {"label": f"vime.owner={docker_backend.owner_tag()}"}
    containers = [c["Id"] for c in api.containers(all=True, filters=label)]
    volumes = [v["Name"] for v in api.volumes(filters=label).get("Volumes") or []]
    return containers, volumes


@pytest.mark.timeout(480)
async def test_1000_executions_at_concurrency_32_fail_none_and_leave_no_container(procs):
    token = procs.token()
    assert owned() == ([], [])
    failures: list[str] = []
    latencies: list[float] = []

    async def worker(w: int) -> None:
        async with create("docker", timeout=60) as box:
            for r in range(w, EXECUTIONS, CONCURRENCY):
                word = f"{token}-{r}"
                started = time.perf_counter()
                result = await box.run(["python3", "-c", "import sys; print(sys.argv[1])", word])
                latencies.append(time.perf_counter() - started)
                if not result.ok or result.stdout != word + "\n":
                    failures.append(f"{word}: {result}")

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    print(
        f"docker: {len(latencies)} execs at concurrency {CONCURRENCY} in {elapsed:.1f} s "
        f"({len(latencies) / elapsed:.1f}/s), p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.0f} ms"
    )
    assert failures == []
    assert len(latencies) == EXECUTIONS
    assert owned() == ([], [])
    assert await procs.wait_gone(token) == []
