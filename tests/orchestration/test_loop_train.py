"""The RL loop's training step against a recording cluster: what reaches the trainer (split
episodes, advantages, masks) and what happens to colocated engines around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vime.agents.trajectory import TrajectoryBuilder
from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.orchestration.loop import RLLoop
from vime.types import Status, Trajectory

TASKS = [{"id": "t0", "question": "What is 1 + 1?", "answer": "2"}]


class RecordingCluster:
    """Stands in for the Ray cluster: records calls and tracks whether engines are paused."""

    base_url = "http://127.0.0.1:9/v1"
    model_name = "stub"

    def __init__(self, fail_train: bool = False) -> None:
        self.calls: list[str] = []
        self.batches: list = []
        self.paused = False
        self.fail_train = fail_train

    def trainer_call(self, method: str, *args):
        self.calls.append(method)
        if method == "train_step":
            if self.fail_train:
                raise RuntimeError("trainer rank 0 died")
            self.batches.append(args[0])
            return {"loss": 0.0}
        return None

    def pause_engines(self) -> None:
        self.calls.append("pause")
        self.paused = True

    def resume_engines(self) -> None:
        self.calls.append("resume")
        self.paused = False

    def sync_weights(self, version: int) -> dict[str, float]:
        self.calls.append("sync")  # a pure weight push: it does not un-pause by itself
        return {}


def _loop(tiny_model: Path, tmp_path: Path, cluster, *flags: str) -> RLLoop:
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0"]
    argv += ["--output-dir", str(tmp_path), *flags]
    return RLLoop(build_setup(parse_args(argv)), cluster, logger=None, tasks=TASKS, eval_tasks=[])


def _episode(reward: float, index: int, *, drift: bool) -> Trajectory:
    """A two-turn episode; with ``drift`` the second prompt does not extend the first turn's
    ids (the chat template re-rendered them), so ``--drift split`` cuts it in two."""
    b = TrajectoryBuilder("split")
    b.observe_prompt([1, 2, 3])
    b.add_completion([4, 5], [-0.1, -0.2], 0)
    b.observe_prompt([1, 2, 9, 9] if drift else [1, 2, 3, 4, 5, 9, 9])
    b.add_completion([6], [-0.3], 0)
    return b.build(
        messages=[],
        reward=reward,
        turn_rewards=[reward],
        status=Status.COMPLETED,
        task_id="t0",
        sample_index=index,
    )


def test_every_segment_of_a_split_episode_reaches_the_trainer(tiny_model, tmp_path) -> None:
    cluster = RecordingCluster()
    loop = _loop(tiny_model, tmp_path, cluster, "--drift", "split")
    loop.train([[_episode(1.0, 0, drift=True), _episode(0.0, 1, drift=False)]], None)

    (batch,) = cluster.batches
    got = {s.sample_id: s for s in batch.samples}
    assert list(got) == ["t0/0/seg0", "t0/0/seg1", "t0/1"]
    a = 1 / (2**0.5 + 1e-6)  # GRPO on rewards [1, 0]: +-0.5 / (unbiased std sqrt(1/2) + eps)
    first, second, plain = got.values()
    assert (first.token_ids, first.loss_mask) == ([1, 2, 3, 4, 5], [0, 0, 0, 1, 1])
    assert first.rollout_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2])
    assert first.advantages == pytest.approx([0, 0, 0, a, a])
    assert (second.token_ids, second.loss_mask) == ([1, 2, 9, 9, 6], [0, 0, 0, 0, 1])
    assert second.advantages == pytest.approx([0, 0, 0, 0, a])
    assert plain.token_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert plain.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert plain.advantages == pytest.approx([0, 0, 0, -a, -a, 0, 0, -a])
    trained = (tmp_path / "trained_samples.jsonl").read_text()
    assert trained.count("t0/0/seg") == 2


def _informative_group() -> list[Trajectory]:
    return [_episode(1.0, 0, drift=False), _episode(0.0, 1, drift=False)]


def test_colocated_engines_are_resumed_after_the_weight_push(tiny_model, tmp_path) -> None:
    cluster = RecordingCluster()
    loop = _loop(tiny_model, tmp_path, cluster, "--colocate")
    loop.train([_informative_group()], None)
    moves = [c for c in cluster.calls if c in ("pause", "train_step", "sync", "resume")]
    assert moves == ["pause", "train_step", "sync", "resume"]
    assert not cluster.paused


def test_colocated_engines_are_resumed_when_nothing_trains(tiny_model, tmp_path) -> None:
    # The only group is dropped (its episode failed): no optimizer step and no weights
    # pushed, and the engines must still be generating afterwards.
    cluster = RecordingCluster()
    loop = _loop(tiny_model, tmp_path, cluster, "--colocate")
    failed = _episode(1.0, 0, drift=False)
    failed.status = Status.FAILED
    metrics = loop.train([[failed]], None)
    assert metrics == {"rollout/dropped_status_failed": 1.0}
    assert "sync" not in cluster.calls and cluster.calls[-1] == "resume"
    assert not cluster.paused


def test_colocated_engines_are_resumed_when_the_train_step_fails(tiny_model, tmp_path) -> None:
    cluster = RecordingCluster(fail_train=True)
    loop = _loop(tiny_model, tmp_path, cluster, "--colocate")
    with pytest.raises(RuntimeError, match="trainer rank 0 died"):
        loop.train([_informative_group()], None)
    assert cluster.calls[-1] == "resume" and not cluster.paused


def test_disaggregated_engines_are_never_paused(tiny_model, tmp_path) -> None:
    cluster = RecordingCluster()
    _loop(tiny_model, tmp_path, cluster).train([_informative_group()], None)
    assert "pause" not in cluster.calls and "resume" not in cluster.calls
