"""The RL loop's own state and its atomic checkpoints.

A checkpoint is a folder ``<save_dir>/step_<N>/`` holding the trainer's checkpoint
(``trainer/``), ``state.json`` (step, data position, RNG, counters) and ``buffer.jsonl``
(trajectories generated but not trained yet, for the async loop). It is written under a
temporary name and renamed into place, then ``latest`` is replaced atomically, so a
``kill -9`` at any moment leaves the previous checkpoint intact and usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import VimeError
from vime.types import Trajectory


class RunStateError(VimeError):
    """A run checkpoint is missing or unreadable."""


@dataclass
class RunState:
    """Everything besides the trainer that a resume needs to continue exactly."""

    step: int = 0  # optimizer steps done
    data_position: int = 0  # tasks consumed from the data stream
    weight_version: int = 0
    trained_samples: int = 0  # lines of trained_samples.jsonl that belong to this state
    python_rng: Any = None
    counters: dict[str, float] = field(default_factory=dict)


def _fsync_write(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(
    save_dir: str | Path,
    state: RunState,
    buffer: list[Trajectory],
    save_trainer: Callable[[Path], Any],
) -> Path:
    """Write ``step_<N>`` atomically (trainer via ``save_trainer(dir)``) and point ``latest`` at it."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    final = save_dir / f"step_{state.step:06d}"
    tmp = save_dir / f".tmp_step_{state.step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_trainer(tmp / "trainer")
    state.python_rng = random.getstate()
    _fsync_write(tmp / "state.json", json.dumps(asdict(state)))
    _fsync_write(tmp / "buffer.jsonl", "".join(json.dumps(t.to_dict()) + "\n" for t in buffer))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = save_dir / f".latest_{os.getpid()}"
    _fsync_write(latest_tmp, final.name)
    os.replace(latest_tmp, save_dir / "latest")
    return final


def latest_checkpoint(save_dir: str | Path) -> Path | None:
    """The folder ``latest`` points at, or None when there is no checkpoint yet."""
    pointer = Path(save_dir) / "latest"
    if not pointer.is_file():
        return None
    path = Path(save_dir) / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise RunStateError(f"{pointer} points at {path}, which has no state.json")
    return path


def load_checkpoint(path: str | Path) -> tuple[RunState, list[Trajectory]]:
    """Read a checkpoint's state and buffer (the trainer loads ``path/trainer`` itself)."""
    path = Path(path)
    try:
        raw = json.loads((path / "state.json").read_text())
        state = RunState(**raw)
        lines = (path / "buffer.jsonl").read_text().splitlines()
        buffer = [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]
    except (OSError, ValueError, TypeError) as exc:
        raise RunStateError(f"cannot read the run checkpoint {path}: {exc}") from None
    if state.python_rng is not None:
        version, internal, gauss = state.python_rng
        random.setstate((version, tuple(internal), gauss))
    return state, buffer


def prune_checkpoints(save_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step folders (never the one ``latest`` names)."""
    save_dir = Path(save_dir)
    latest = latest_checkpoint(save_dir)
    steps = sorted(p for p in save_dir.glob("step_*") if p.is_dir())
    for p in steps[:-keep] if keep > 0 else []:
        if latest is None or p.resolve() != latest.resolve():
            shutil.rmtree(p, ignore_errors=True)
