"""`--resume` skips a damaged newest checkpoint for the newest intact one, and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.orchestration.loop import RLLoop
from vime.orchestration.run_state import RunStateError

TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]


class FileTrainerCluster:
    """Stands in for the Ray cluster: its trainer saves and loads one weights file."""

    base_url = "http://127.0.0.1:9/v1"
    model_name = "stub"

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.synced: list[int] = []

    def trainer_call(self, method: str, *args):
        if method == "save":
            Path(args[0]).mkdir()
            (Path(args[0]) / "model.pt").write_bytes(b"weights" * 1000)
        elif method == "load":
            self.loaded.append(Path(args[0]).parent.name)
        return None

    def sync_weights(self, version: int) -> dict[str, float]:
        self.synced.append(version)
        return {}


def _loop(tiny_model: Path, out: Path, cluster: FileTrainerCluster) -> RLLoop:
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0"]
    argv += ["--output-dir", str(out), "--resume"]
    return RLLoop(build_setup(parse_args(argv)), cluster, logger=None, tasks=TASKS, eval_tasks=[])


def _two_checkpoints(tiny_model: Path, out: Path) -> Path:
    loop = _loop(tiny_model, out, FileTrainerCluster())
    for step in (1, 2):
        loop.state.step = loop.state.weight_version = step
        loop.checkpoint(data_position=2 * step)
    return out / "checkpoints"


@pytest.mark.parametrize("damage", ["truncate", "flip", "state"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(
    tiny_model, tmp_path, capsys, damage
) -> None:
    ckpts = _two_checkpoints(tiny_model, tmp_path)
    model = ckpts / "step_000002" / "trainer" / "model.pt"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:10])
    elif damage == "flip":
        model.write_bytes(model.read_bytes().replace(b"weights", b"weighTs", 1))
    else:
        (ckpts / "step_000002" / "state.json").write_text('{"step": 2')
    cluster = FileTrainerCluster()
    loop = _loop(tiny_model, tmp_path, cluster)
    assert loop.restore()
    assert (loop.state.step, loop.state.data_position, loop.stream.position) == (1, 2, 2)
    assert cluster.loaded == ["step_000001"] and cluster.synced == [1]
    said = capsys.readouterr().out
    assert "the newest checkpoint is unusable: step_000002 (step_000002: " in said
    assert "resuming from step_000001, the newest intact one" in said


def test_no_intact_checkpoint_is_an_error_naming_each(tiny_model, tmp_path) -> None:
    ckpts = _two_checkpoints(tiny_model, tmp_path)
    for step in ("step_000001", "step_000002"):
        (ckpts / step / "buffer.jsonl").write_text("garbage\n")
    loop = _loop(tiny_model, tmp_path, FileTrainerCluster())
    with pytest.raises(RunStateError) as err:
        loop.restore()
    assert "no intact checkpoint" in str(err.value)
    assert "step_000002 (step_000002: buffer.jsonl does not match its checksum" in str(err.value)
    assert "step_000001 (step_000001: buffer.jsonl" in str(err.value)
    assert "another --output-dir" in str(err.value)


def test_a_resume_before_the_first_checkpoint_forgets_what_the_killed_run_trained(
    tiny_model, tmp_path
) -> None:
    (tmp_path / "trained_samples.jsonl").write_text('{"step": 0, "sample_id": "t1@0#0"}\n')
    loop = _loop(tiny_model, tmp_path, FileTrainerCluster())
    assert not loop.restore()
    assert (tmp_path / "trained_samples.jsonl").read_text() == ""
