"""The held-out evaluation of the starting weights runs beside step 1's rollouts (both on the
engines at once), is logged as step 0, and always ends before the first weight update; a
failed rollout cancels it and stops the run with the rollout's own error."""

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


class Logger:
    def __init__(self, events: list[str]) -> None:
        self.history: list[tuple[int, dict]] = []
        self.events = events

    def log(self, step: int, metrics: dict) -> None:
        self.events.append(f"log {step}")
        self.history.append((step, metrics))


def _loop(tiny_model: Path, tmp_path: Path, events: list[str], *flags: str) -> RLLoop:
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0", "--num-steps", "2"]
    argv += ["--output-dir", str(tmp_path), "--eval-interval", "2", *flags]
    setup = build_setup(parse_args(argv))
    cluster = SimpleNamespace(base_url="http://127.0.0.1:9/v1", model_name="stub")
    return RLLoop(setup, cluster, logger=Logger(events), tasks=TASKS, eval_tasks=TASKS)


def _script(loop: RLLoop, events: list[str], *, fail_rollout: bool = False) -> None:
    """Stand-ins for the engines and the trainer that record when each phase runs; the
    evaluation cannot end until step 1's rollout has started (they must overlap)."""
    rollout_started = asyncio.Event()

    async def evaluate():
        events.append("eval start")
        try:
            await asyncio.wait_for(rollout_started.wait(), 5)
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            events.append("eval cancelled")
            raise
        events.append("eval end")
        return {"eval/pass@1": 0.25}

    async def rollout():
        events.append("rollout start")
        rollout_started.set()
        await asyncio.sleep(0.01)
        if fail_rollout:
            raise VimeError("step 1: all 16 episodes failed; the first error: HTTP 503")
        events.append("rollout end")
        return [["group"]], {}, loop.stream.position

    def train(groups, max_staleness):
        events.append("train")  # ends with the weight update
        return {}

    async def finish(metrics, groups, position, progress):
        loop.state.step += 1

    loop.evaluate, loop.rollout, loop.train, loop._finish_step = evaluate, rollout, train, finish


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_first_evaluation_overlaps_step_1_rollouts_and_ends_before_training(
    tiny_model, tmp_path, mode
):
    events: list[str] = []
    loop = _loop(tiny_model, tmp_path, events, "--mode", mode)
    _script(loop, events)
    await asyncio.wait_for(loop.run_async(None) if mode == "async" else loop.run_sync(None), 20)
    assert events.index("eval start") < events.index("rollout end")  # they overlapped
    assert events.index("eval end") < events.index("log 0") < events.index("train")
    assert events.count("eval start") == 1  # step 2's evaluation is _finish_step's
    assert loop.logger.history[0] == (0, {"eval/pass@1": 0.25})


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failed_first_rollout_cancels_the_evaluation_and_keeps_its_error(
    tiny_model, tmp_path, mode
):
    events: list[str] = []
    loop = _loop(tiny_model, tmp_path, events, "--mode", mode)
    _script(loop, events, fail_rollout=True)
    run = loop.run_async(None) if mode == "async" else loop.run_sync(None)
    with pytest.raises(VimeError, match="all 16 episodes failed"):
        await asyncio.wait_for(run, 20)
    assert "eval cancelled" in events and "train" not in events
    assert loop.logger.history == []


async def test_a_resumed_run_does_not_evaluate_the_starting_weights_again(tiny_model, tmp_path):
    events: list[str] = []
    loop = _loop(tiny_model, tmp_path, events)
    loop.logger.history.append((0, {"eval/pass@1": 0.25}))  # logged before the restart
    _script(loop, events)
    await asyncio.wait_for(loop.run_sync(None), 20)
    assert "eval start" not in events
