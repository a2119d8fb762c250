"""Placement plans, the resumable task stream and atomic run checkpoints."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from vime.errors import ConfigError
from vime.orchestration.placement import PlacementConfig, check_fits, plan_placement
from vime.orchestration.run_state import (
    CheckpointSaveError,
    RunState,
    RunStateError,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)
from vime.orchestration.task_stream import TaskStream
from vime.types import Trajectory


def test_disaggregated_plan_gives_trainer_and_each_engine_rank_a_bundle() -> None:
    plan = plan_placement(
        PlacementConfig(device="GPU", trainer_processes=4, num_engines=2, gpus_per_engine=2)
    )
    assert [len(b) for b in plan.groups.values()] == [4, 4]
    assert plan.total == {"CPU": 8.0, "GPU": 8.0}
    assert plan.groups["engines"][3].users == ("engine 1 (tp rank 1)",)


def test_colocated_plan_shares_each_bundle_between_a_trainer_rank_and_an_engine_rank() -> None:
    plan = plan_placement(
        PlacementConfig(
            device="GPU", trainer_processes=8, num_engines=4, gpus_per_engine=2, colocate=True
        )
    )
    assert list(plan.groups) == ["colocated"]
    assert plan.total["GPU"] == 8.0
    assert plan.trainer_device_share == plan.engine_device_share == 0.5
    assert plan.groups["colocated"][0].users == ("trainer rank 0", "engine 0 (tp rank 0)")


def test_colocation_with_mismatched_device_counts_is_refused() -> None:
    with pytest.raises(ConfigError, match="must equal --trainer-num-processes"):
        PlacementConfig(device="GPU", trainer_processes=8, num_engines=3, colocate=True)


def test_pinning_resources_go_into_the_bundles() -> None:
    plan = plan_placement(
        PlacementConfig(device="CPU", trainer_resource="node_a", engine_resource="node_b")
    )
    assert plan.groups["trainer"][0].resources == {"CPU": 1.0, "node_a": 1.0}
    assert plan.groups["engines"][0].resources == {"CPU": 1.0, "node_b": 1.0}


def test_a_plan_too_big_for_the_cluster_names_the_resource() -> None:
    plan = plan_placement(PlacementConfig(device="GPU", trainer_processes=8))
    with pytest.raises(ConfigError, match="needs GPU=9 but the Ray cluster has GPU=8"):
        check_fits(plan, {"CPU": 64, "GPU": 8})


def test_task_stream_is_deterministic_reshuffles_per_epoch_and_resumes_exactly() -> None:
    tasks = [{"id": f"t{i}"} for i in range(5)]
    a = TaskStream(tasks, seed=3)
    first = a.take(7)
    assert sorted(t["id"] for _, t in first[:5]) == [f"t{i}" for i in range(5)]
    assert len({sid for sid, _ in first}) == 7
    b = TaskStream(tasks, seed=3, position=4)
    assert b.take(3) == first[4:7]


def test_empty_task_set_is_an_error() -> None:
    with pytest.raises(ValueError, match="task set is empty"):
        TaskStream([], seed=0)


def _traj(i: int) -> Trajectory:
    return Trajectory(
        token_ids=[1, 2, i],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.25],
        prompt_length=1,
        task_id=f"t{i}",
    )


def test_checkpoint_round_trips_state_buffer_and_python_rng(tmp_path: Path) -> None:
    random.seed(5)
    state = RunState(step=3, data_position=12, weight_version=3, trained_samples=8)
    path = save_checkpoint(tmp_path, state, [_traj(7)], lambda d: d.mkdir())
    expected_next = random.random()
    random.seed(99)
    loaded, buffer = load_checkpoint(latest_checkpoint(tmp_path))
    assert path.name == "step_000003" and (path / "trainer").is_dir()
    assert (loaded.step, loaded.data_position, loaded.trained_samples) == (3, 12, 8)
    assert buffer[0].token_ids == [1, 2, 7] and buffer[0].logprobs == [0.0, -0.5, -0.25]
    assert random.random() == expected_next


def test_a_crash_while_saving_leaves_the_previous_checkpoint_as_latest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, RunState(step=1), [], lambda d: d.mkdir())

    def crash(d: Path) -> None:
        d.mkdir()
        raise KeyboardInterrupt  # stands for a kill in the middle of the trainer's write

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, RunState(step=2), [], crash)
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert load_checkpoint(latest_checkpoint(tmp_path))[0].step == 1


def test_no_checkpoint_yet_and_a_corrupt_one_are_told_apart(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    path = save_checkpoint(tmp_path, RunState(step=1), [], lambda d: d.mkdir())
    (path / "state.json").write_text("{not json")
    with pytest.raises(RunStateError, match="cannot read the run checkpoint"):
        load_checkpoint(path)


def test_pruning_keeps_the_newest_checkpoints(tmp_path: Path) -> None:
    for s in range(1, 5):
        save_checkpoint(tmp_path, RunState(step=s), [], lambda d: d.mkdir())
    (tmp_path / ".tmp_step_000005_1").mkdir()  # a save of a driver killed earlier
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000003", "step_000004"]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
    assert os.path.exists(tmp_path / "latest")


def _trainer_files(d: Path) -> None:
    d.mkdir()
    (d / "model.pt").write_bytes(bytes(range(256)) * 64)


def test_a_full_disk_fails_the_save_cleanly_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    save_checkpoint(tmp_path, RunState(step=1), [], _trainer_files)

    def disk_full(d: Path) -> None:
        _trainer_files(d)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointSaveError) as err:
        save_checkpoint(tmp_path, RunState(step=2), [_traj(1)], disk_full)
    message = str(err.value)
    assert "step_000002: the disk is full (No space left on device; " in message
    assert "the previous checkpoint step_000001 is intact" in message and "--resume" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]
    verify_checkpoint(latest_checkpoint(tmp_path))


def test_a_trainer_that_dies_mid_save_is_reported_as_such_not_as_a_disk_problem(
    tmp_path: Path,
) -> None:
    from vime.orchestration.cluster import ActorDiedError

    save_checkpoint(tmp_path, RunState(step=1), [], _trainer_files)
    died = "the run stopped: an actor died during the trainer's save (killed). Rerun with --resume"

    def actor_died(d: Path) -> None:
        _trainer_files(d)
        raise ActorDiedError(died)

    with pytest.raises(ActorDiedError) as err:
        save_checkpoint(tmp_path, RunState(step=2), [], actor_died)
    assert str(err.value) == died  # not "could not save ... Free space"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000001"]


def test_a_truncated_or_altered_checkpoint_file_fails_verification(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, RunState(step=1), [], _trainer_files)
    verify_checkpoint(path)
    model = path / "trainer" / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    model.write_bytes(bytes(data))
    with pytest.raises(RunStateError, match=r"trainer/model.pt does not match its checksum"):
        verify_checkpoint(path)
    model.write_bytes(data[:100])
    with pytest.raises(RunStateError, match=r"trainer/model.pt does not match"):
        verify_checkpoint(path)
    model.unlink()
    with pytest.raises(RunStateError, match=r"trainer/model.pt is missing"):
        verify_checkpoint(path)


def test_the_trainers_files_are_hashed_as_written_not_read_back(
    tmp_path: Path, monkeypatch
) -> None:
    import hashlib
    import json

    import torch

    from vime.orchestration import run_state
    from vime.training import checkpoint as ckpt

    def save_trainer(directory: Path) -> None:
        ckpt.save_distributed(
            directory,
            rank=0,
            barrier=lambda: None,
            write_rank=lambda tmp: ckpt.save_object({"w": torch.arange(1000.0)}, tmp / "model.pt"),
            trainer_state={},
            backend="torch",
        )

    read: list[str] = []
    file_digest = hashlib.file_digest

    def recording(fh, name):
        read.append(Path(fh.name).name)
        return file_digest(fh, name)

    monkeypatch.setattr(hashlib, "file_digest", recording)
    path = save_checkpoint(tmp_path, RunState(step=1), [], save_trainer)
    monkeypatch.undo()
    assert "model.pt" not in read and "state.json" in read and "vime_checkpoint.json" in read
    # What was hashed on the way out is what a full read gives, and resume checks against it.
    assert json.loads((path / run_state.CHECKSUMS).read_text()) == run_state._checksums(path)
    verify_checkpoint(path)
