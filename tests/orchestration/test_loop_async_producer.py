"""The async driver stops with the producer's error when a rollout fails, instead of waiting
forever for a batch that will never come (bench/faults.py found the run idle after an engine
kill -9: the batch rolled out during the restart failed every episode and the producer died)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import VimeError
from vime.orchestration.loop import RLLoop

TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]


def _async_loop(tiny_model: Path, tmp_path: Path) -> RLLoop:
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0", "--mode", "async"]
    argv += ["--output-dir", str(tmp_path), "--rollout-batch-size", "2", "--n", "2"]
    setup = build_setup(parse_args(argv))
    cluster = SimpleNamespace(base_url="http://127.0.0.1:9/v1", model_name="stub")
    return RLLoop(setup, cluster, logger=None, tasks=TASKS, eval_tasks=[])


async def test_a_failed_rollout_stops_the_async_run_with_its_error(tiny_model, tmp_path):
    loop = _async_loop(tiny_model, tmp_path)
    calls = 0

    async def rollout():
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        raise VimeError("step 1: all 4 episodes failed; the first error: HTTP 503")

    loop.rollout = rollout
    with pytest.raises(VimeError, match="all 4 episodes failed"):
        await asyncio.wait_for(loop.run_async(lambda step, metrics: None), timeout=20)
    assert calls == 1 and loop.state.step == 0


async def test_batches_queued_before_the_producer_failed_are_trained_first(tiny_model, tmp_path):
    loop = _async_loop(tiny_model, tmp_path)
    trained: list[str] = []
    rolled = 0

    async def rollout():
        nonlocal rolled
        rolled += 1
        if rolled == 1:
            return [["batch 1"]], {}, 0
        raise VimeError("the second batch failed")

    def train(groups, max_staleness):
        trained.append(groups[0][0])
        return {}

    async def finish(metrics, groups, position, progress):
        loop.state.step += 1

    loop.rollout, loop.train, loop._finish_step = rollout, train, finish
    with pytest.raises(VimeError, match="the second batch failed"):
        await asyncio.wait_for(loop.run_async(lambda step, metrics: None), timeout=20)
    assert trained == ["batch 1"] and loop.state.step == 1
