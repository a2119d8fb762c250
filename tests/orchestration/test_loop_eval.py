"""Held-out evaluations run beside other work on the same weights: the starting weights' beside
step 1's rollouts, step N's beside its checkpoint and step N+1's rollouts. Each is logged as a
row of its step and always ends before the next weight update; a failed rollout cancels it and
stops the run with the rollout's own error; a resumed run evaluates a due step only if its
metrics.jsonl has no evaluation of it."""

from __future__ import annotations

import asyncio
import json
import time
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
    # Logged before the restart; the last line was cut short by the crash.
    rows = [{"step": 0, "eval/pass@1": 0.25}, {"step": 1, "rollout/reward_mean": 0.5}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "eval/pa'
    (tmp_path / "metrics.jsonl").write_text(text)
    loop = _loop(tiny_model, tmp_path, events, "--resume")
    _script(loop, events)
    await asyncio.wait_for(loop.run_sync(None), 20)
    assert "eval start" not in events


async def test_a_resumed_run_evaluates_a_due_step_whose_evaluation_was_lost(tiny_model, tmp_path):
    """Killed after step 2's checkpoint, before its evaluation was logged: the resumed run
    evaluates the restored weights (and logs them as step 2) before it goes on."""
    events: list[str] = []
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/pass@1": 0.1}) + "\n")
    loop = _loop(tiny_model, tmp_path, events, "--resume", "--num-steps", "3")
    loop.state.step = 2  # as restore() leaves it
    _script(loop, events)
    await asyncio.wait_for(loop.run_sync(None), 20)
    assert events.index("eval end") < events.index("log 2") < events.index("train")
    assert loop.logger.history[0] == (2, {"eval/pass@1": 0.25})


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_each_evaluation_runs_after_its_steps_checkpoint_beside_the_next_rollouts(
    tiny_model, tmp_path, mode
):
    """--eval-interval 1 over 2 steps: step N's weights are evaluated after step N is saved
    (on a CPU box the two would share the cores), while step N+1 is rolled out, and logged as
    a row of step N before the next weight update; the last one before the run ends."""
    events: list[str] = []
    loop = _loop(tiny_model, tmp_path, events, "--mode", mode, "--eval-interval", "1")
    evals = iter([0.25, 0.5, 0.75])

    async def evaluate():
        events.append("eval start")
        await asyncio.sleep(0.2)
        events.append("eval end")
        return {"eval/pass@1": next(evals)}

    async def rollout():
        events.append("rollout start")
        await asyncio.sleep(0.1)
        events.append("rollout end")
        return [["group"]], {}, loop.stream.position

    def train(groups, max_staleness):
        events.append("train")
        return {}

    def after_step(metrics, groups, position):
        loop.state.step += 1
        events.append(f"save {loop.state.step} start")
        time.sleep(0.05)
        events.append(f"save {loop.state.step} end")

    loop.evaluate, loop.rollout, loop.train, loop.after_step = evaluate, rollout, train, after_step
    run = loop.run_async(lambda *a: None) if mode == "async" else loop.run_sync(lambda *a: None)
    await asyncio.wait_for(run, 20)
    assert events.count("eval start") == 3
    # Step 1's evaluation started after its checkpoint, and was logged before step 2's weight
    # update; step 2's likewise, logged before the run ended.
    starts = [i for i, e in enumerate(events) if e == "eval start"]
    assert events.index("save 1 end") < starts[1] and events.index("save 2 end") < starts[2]
    trains = [i for i, e in enumerate(events) if e == "train"]
    assert events.index("log 1") < trains[1] and events[-1] == "log 2"
    if mode == "sync":  # beside step 2's rollouts: they overlap
        rollout_2_end = [i for i, e in enumerate(events) if e == "rollout end"][1]
        assert starts[1] < rollout_2_end < events.index("eval end", starts[1])
    assert [row for row in loop.logger.history] == [
        (0, {"eval/pass@1": 0.25}),
        (1, {"eval/pass@1": 0.5}),
        (2, {"eval/pass@1": 0.75}),
    ]
